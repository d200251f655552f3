"""Writes the docs site's reference pages from the code itself, so they cannot drift from it.

- docs/reference/settings.md: every environment variable the web, dispatcher and agents read
  (each `env_*("NAME", default)` call and `os.environ` read, found in the source), with its type,
  default and the comment written above it.
- docs/reference/cli.md: every `gpuplatform` command and option with its help, from the parser.
- docs/reference/api.md: every HTTP endpoint and method from the OpenAPI document.

`python -m scripts.docs_reference` rewrites them; `--check` exits 1 naming any page that is not
current (tests/unit/test_docs_reference.py runs that in `make test`).
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "reference"
SOURCES = ("gpuplatform", "apps", "workers")
READERS = {
    "env_str": "text",
    "env_bool": "boolean",
    "env_int": "integer",
    "env_float": "number",
    "env_choice": "choice",
    "env_list": "list",
}


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    default: str
    where: str
    note: str


def settings_page() -> str:
    found: dict[str, Setting] = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for setting in _settings_in(path):
                found.setdefault(setting.name, setting)
    lines = [
        "# Settings",
        "",
        "Every environment variable the platform's processes read, found in the source by",
        "`python -m scripts.docs_reference` (do not edit by hand). A bad value stops the process at",
        "start with an error naming the variable (`gpuplatform/env.py`). How to set them for a",
        "deployment: [Operations](../operations.md).",
        "",
        "| variable | type | default | read in | note |",
        "|---|---|---|---|---|",
    ]
    for setting in sorted(found.values(), key=lambda s: s.name):
        lines.append(
            f"| `{setting.name}` | {setting.kind} | {setting.default} | `{setting.where}` "
            f"| {setting.note} |"
        )
    return "\n".join(lines) + "\n"


def _settings_in(path: pathlib.Path) -> list[Setting]:
    text = path.read_text()
    source_lines = text.splitlines()
    where = str(path.relative_to(ROOT))
    found = []
    for node in ast.walk(ast.parse(text)):
        read = _env_read(node)
        if read is None:
            continue
        name, kind, default = read
        if not name.isupper():
            continue
        found.append(Setting(name, kind, default, where, _comment_above(source_lines, node)))
    return found


def _env_read(node: ast.AST) -> tuple[str, str, str] | None:
    """(name, type, default) for `env_int("X", 5)`, `os.environ.get("X", ...)`, `os.environ["X"]`."""
    if isinstance(node, ast.Call) and node.args and _literal_str(node.args[0]):
        function = node.func
        called = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
        name = node.args[0].value  # type: ignore[attr-defined]
        default = _shown(node.args[1]) if len(node.args) > 1 else "none"
        if called in READERS:
            return name, READERS[called], default
        if called in ("get", "getenv") and _reads_environ(function):
            return name, "text", default
    if isinstance(node, ast.Subscript) and _is_environ(node.value) and _literal_str(node.slice):
        return node.slice.value, "text", "required"  # type: ignore[attr-defined]
    return None


def _literal_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _reads_environ(function: ast.AST) -> bool:
    if not isinstance(function, ast.Attribute):
        return False
    owner = function.value
    return _is_environ(owner) or (isinstance(owner, ast.Name) and owner.id == "os")


def _shown(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return "none" if node.value is None else f"`{node.value!r}`".replace("|", "\\|")
    return "computed"


def _comment_above(lines: list[str], node: ast.AST) -> str:
    """The comment lines right above the statement (how the code says why), or the one at the
    end of its line, joined."""
    line = lines[getattr(node, "lineno", 1) - 1]
    if "  # " in line and "fmt:" not in line and "noqa" not in line:
        return line.split("  # ", 1)[1].strip().replace("|", "\\|")
    index = getattr(node, "lineno", 1) - 2
    comment: list[str] = []
    while index >= 0 and lines[index].strip().startswith("#"):
        comment.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(comment).replace("|", "\\|")


def cli_page() -> str:
    sys.path.insert(0, str(ROOT / "client"))
    from gpuplatform_client import cli

    top = cli.parser()
    lines = [
        "# Command line",
        "",
        "The `gpuplatform` command (`pip install ./client`), from its own parser by",
        "`python -m scripts.docs_reference` (do not edit by hand). How to use it:",
        "[The client and SDK](../client.md).",
        "",
    ]
    lines += _parser_lines(top, "gpuplatform", level=2)
    return "\n".join(lines) + "\n"


def _parser_lines(parser: argparse.ArgumentParser, name: str, level: int) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    if parser.description:
        lines += [parser.description, ""]
    options = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    rows = [_option_row(action) for action in options if action.help != argparse.SUPPRESS]
    if rows:
        lines += ["| argument | help |", "|---|---|", *rows, ""]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub_name, sub in action.choices.items():
                lines += _parser_lines(sub, f"{name} {sub_name}", min(level + 1, 4))
    return lines


def _option_row(action: argparse.Action) -> str:
    shown = ", ".join(action.option_strings) or action.dest
    if action.metavar and action.option_strings:
        shown += f" {action.metavar}"
    text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
    return f"| `{shown}` | {_cell(text)} |"


def api_page() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
    os.environ.setdefault("SECRET_KEY", "docs-reference-not-a-secret")
    import django

    django.setup()
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    lines = [
        "# HTTP API",
        "",
        "Every endpoint of the API, from its OpenAPI document by `python -m scripts.docs_reference`",
        "(do not edit by hand). A running platform serves the full document at `/api/schema/` and",
        "browsable docs at `/api/docs/`. Requests carry `Authorization: Token <key>`; errors are",
        "JSON with the field that is wrong.",
        "",
        "| method | path | what it does |",
        "|---|---|---|",
    ]
    for path, operations in sorted(schema["paths"].items()):
        for method, operation in operations.items():
            summary = operation.get("summary") or _first_line(operation.get("description", ""))
            lines.append(f"| {method.upper()} | `{path}` | {_cell(summary)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text fit for one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def _first_line(text: str) -> str:
    return text.strip().split("\n\n")[0].replace("\n", " ")


GENERATORS = {"settings.md": settings_page, "cli.md": cli_page, "api.md": api_page}


def stale_pages() -> list[str]:
    return [
        name
        for name, generate in GENERATORS.items()
        if not (PAGES / name).exists() or (PAGES / name).read_text() != generate()
    ]


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--check", action="store_true", help="exit 1 if a page is not current")
    if arguments.parse_args().check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} is not current: run python -m scripts.docs_reference")
        return 1 if stale else 0
    PAGES.mkdir(parents=True, exist_ok=True)
    for name, generate in GENERATORS.items():
        (PAGES / name).write_text(generate())
    return 0


if __name__ == "__main__":
    sys.exit(main())

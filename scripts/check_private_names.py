"""Fail if a module under apps/ reaches into Django's, DRF's or a database driver's internals.

Flagged (each with its file and line):
- an import of a private name or module of those packages (`from django.x import _y`,
  `django.x._y`) or of a database backend's own module (`django.db.backends.<vendor>.base`);
- an attribute starting with `_` read on anything but `self`/`cls` that is one of the
  libraries' (THEIRS: `instance._state`, `db._prepare_cursor`, `request._request`, ...), or that
  apps/ never defines itself (so it must be someone else's). `_meta` is Django's documented model API and allowed;
  dunders are too;
- the undocumented internals the submit path once used: `set_cached_value`,
  `validate_no_broken_transaction`, `wrap_database_errors`, and a raw driver cursor
  (`<connection>.connection.cursor()`).

Public APIs stand in for all of them: `connection.cursor()`, `Model.from_db`, the relations'
descriptors. Every Django upgrade is then a documented change, never a silent one.
"""

from __future__ import annotations

import ast
import pathlib
import sys

LIBRARIES = ("django", "rest_framework", "psycopg", "psycopg2", "sqlite3")
# `_meta` is Django's documented model API; `_replace`, `_asdict` and `_fields` are the documented
# namedtuple API (urllib.parse results are namedtuples).
ALLOWED = {"_meta", "_replace", "_asdict", "_fields"}
INTERNALS = {"set_cached_value", "validate_no_broken_transaction", "wrap_database_errors"}
APPS = pathlib.Path(__file__).resolve().parent.parent / "apps"
OWN = {"self", "cls", "mcs"}  # an attribute read on these is the class's own
# Private names of Django, DRF and the drivers that some module of ours might also define for
# itself (`self._state` in a plain class): read on anything but `self`, they are always theirs.
THEIRS = {
    "_state", "_prepare_cursor", "_request", "_context", "_prefetched_objects_cache", "_result_cache",
    "_known_related_objects", "_hints", "_for_write", "_iterable_class", "_fields", "_db", "_cursor",
    "_connection", "_data", "_full_data", "_files", "_errors", "_validated_data", "_declared_fields",
    "_readable_fields", "_writable_fields", "_wrapped", "_setupfunc", "_post", "_stream", "_auth", "_user",
}  # fmt: skip


def _private(name: str) -> bool:
    return (
        name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"
    )


def defined_names(trees: list[ast.AST]) -> set[str]:
    """Every private name the project itself defines: functions, classes, variables, arguments,
    attributes it assigns, import aliases. An attribute of one of these names is its own."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
    return {name for name in names if _private(name)}


def _library_module(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def problems_in(path: pathlib.Path, tree: ast.AST, ours: set[str]) -> list[str]:
    found = []

    def flag(node: ast.stmt | ast.expr, what: str) -> None:
        found.append(f"{path}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _library_module(alias.name) and any(
                    _private(part) for part in alias.name.split(".")
                ):
                    flag(node, f"imports the private module {alias.name}")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and _library_module(node.module)
        ):
            if any(_private(part) for part in node.module.split(".")):
                flag(node, f"imports from the private module {node.module}")
            elif node.module.startswith("django.db.backends."):
                flag(node, f"imports from a database backend's internals ({node.module})")
            for alias in node.names:
                if _private(alias.name):
                    flag(node, f"imports the private name {alias.name} from {node.module}")
        elif isinstance(node, ast.Attribute):
            if _private(node.attr) and node.attr not in ALLOWED and _theirs(node, ours):
                flag(node, f"uses the private attribute .{node.attr} of a library's object")
            elif node.attr in INTERNALS:
                flag(node, f"uses Django's undocumented internal .{node.attr}")
            elif (
                node.attr == "cursor"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "connection"
            ):
                flag(
                    node, "opens a raw driver cursor (.connection.cursor): use connection.cursor()"
                )
    return found


def _theirs(node: ast.Attribute, ours: set[str]) -> bool:
    """Whether the private attribute read here is a library's: one of THEIRS (on anything but
    `self`), or one the project never defines."""
    if isinstance(node.value, ast.Name) and node.value.id in OWN:
        return False
    return node.attr in THEIRS or node.attr not in ours


def check(root: pathlib.Path = APPS) -> list[str]:
    parsed = [
        (path, ast.parse(path.read_text(), filename=str(path)))
        for path in sorted(root.rglob("*.py"))
    ]
    ours = defined_names([tree for _, tree in parsed])
    return [problem for path, tree in parsed for problem in problems_in(path, tree, ours)]


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"private names check: {len(problems)} uses of Django's, DRF's or a driver's internals")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

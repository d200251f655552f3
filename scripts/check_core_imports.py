"""Fail if the pure scheduling core imports Django, DRF or Celery.

The dispatcher, the simulator and the benchmarks run the same core, so it must stay importable
without any of them.
"""

import ast
import pathlib
import sys

FORBIDDEN = ("django", "rest_framework", "celery", "kombu", "redis")
CORE = pathlib.Path(__file__).resolve().parent.parent / "apps" / "scheduling" / "core"


def forbidden_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [
            f"{path}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FORBIDDEN
        ]
    return found


def main() -> int:
    problems = [p for path in sorted(CORE.rglob("*.py")) for p in forbidden_imports(path)]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"core import check: {len(problems)} forbidden imports")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

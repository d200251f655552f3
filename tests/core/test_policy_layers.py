"""The policy package's modules depend one way: each imports only the modules below it.

Read from the source with `ast`, so an import under `if TYPE_CHECKING:` or inside a function
counts too. A module that needs something of a module above it (the pass, the scheduler) names
what it uses in a small Protocol instead (e.g. `sort.SortState`, `backfill.BackfillPass`).
"""

import ast
import pathlib

import apps.scheduling.core.policy as policy_package

PACKAGE = "apps.scheduling.core.policy"
ROOT = pathlib.Path(policy_package.__file__).parent

# Bottom first. A module may import only those before it; the package's `__init__` (the
# front door, `decide`) is on top.
LAYERS = [
    "model",
    "order",
    "capacity",
    "cluster",
    "victims",
    "preempt",
    "sort",
    "backfill",
    "preemption",
    "passes",
    "scheduler",
    "__init__",
]


def package_imports(path: pathlib.Path) -> set[str]:
    """The modules of the package that the file imports (`__init__` for the package itself)."""
    module = path.stem
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `.` is the package (from a module and from __init__)
                base = PACKAGE.split(".")[: len(PACKAGE.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from <package> import model` imports the submodule `model`
            targets = [target] + [f"{target}.{alias.name}" for alias in node.names]
            if target == PACKAGE:
                subs = [t for t in targets[1:] if t.rsplit(".", 1)[1] in LAYERS]
                targets = subs or [target]
        else:
            continue
        for target in targets:
            if target == PACKAGE:
                found.add("__init__")
            elif target.startswith(PACKAGE + "."):
                found.add(target[len(PACKAGE) + 1 :].split(".")[0])
    found.discard(module)
    return found


def test_every_module_of_the_package_has_a_layer():
    modules = {path.stem for path in ROOT.glob("*.py")}
    assert modules == set(LAYERS), "place a new module of the policy package in LAYERS"
    assert not [p for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"]


def test_the_modules_import_only_the_ones_below_them():
    upward = []
    for rank, module in enumerate(LAYERS):
        for target in sorted(package_imports(ROOT / f"{module}.py")):
            if target not in LAYERS[:rank]:
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_the_check_sees_a_type_checking_import(tmp_path):
    (tmp_path / "sort.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import model\n"
        "if TYPE_CHECKING:\n"
        "    from apps.scheduling.core.policy.scheduler import Scheduler\n"
        "def f():\n"
        "    from .passes import Pass\n"
    )
    assert package_imports(tmp_path / "sort.py") == {"model", "scheduler", "passes"}

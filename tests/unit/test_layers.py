"""The import layers hold (pyproject.toml's import-linter contracts, run by `make lint`), and
the check would catch the day they did not: an upward import or a cycle added to a copy of the
tree breaks it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The packages the contracts name, copied: the real tree is never touched."""
    for package in ("apps", "gpuplatform", "workers"):
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.fixture(autouse=True)
def needs_import_linter():
    if not LINT_IMPORTS.exists():
        pytest.fail(
            f"import-linter is not installed beside {sys.executable} (requirements-dev.txt)"
        )


def test_the_real_tree_keeps_every_contract(tree):
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_app_importing_one_above_it_breaks_the_layers(tree):
    add_import(tree, "apps.nodes.services", "from apps.jobs import services as _upward  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "apps import only the layers below them BROKEN" in result.stdout
    assert "apps.nodes.services -> apps.jobs.services" in result.stdout


def test_the_ground_floor_importing_an_app_breaks_the_layers(tree):
    add_import(tree, "apps.platform.events", "import apps.tenants.models  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "apps.platform.events -> apps.tenants.models" in result.stdout


def test_a_function_local_import_is_seen_too(tree):
    add_import(
        tree, "apps.jobs.services", "def _hidden():\n    from apps.scheduling import tasks  # noqa"
    )
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "apps.jobs.services -> apps.scheduling.tasks" in result.stdout


def test_a_cycle_inside_an_app_breaks_the_acyclic_contract(tree):
    # services -> ratelimit -> counters already; counters -> services closes a circle.
    add_import(
        tree, "apps.admission.counters", "from apps.admission import services as _cycle  # noqa"
    )
    result = lint_imports(tree)
    assert result.returncode != 0
    assert (
        "no import cycles between the apps, nor between the modules of an app BROKEN"
        in result.stdout
    )

"""No module over 800 lines (the house rule, issue 31): a bigger one is split by responsibility.

workers/ is checked once workers/runner.py is split (issue 31, another branch's item)."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 800


@pytest.mark.parametrize("package", ["apps", "gpuplatform"])
def test_no_module_is_over_800_lines(package):
    over = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > LIMIT
    }
    assert over == {}

import pytest

from tests.e2e.platform import Platform

# Two SKUs, one node with 4 H100s and two with 2 A100s each (so a job can move between them).
NODES = {
    "e2e-h1": ("H100-80GB", 4, "rack=r1,zone=a"),
    "e2e-a1": ("A100-40GB", 2, "rack=r2,zone=a"),
    "e2e-a2": ("A100-40GB", 2, "rack=r3,zone=b"),
}


@pytest.fixture(scope="session")
def platform(tmp_path_factory):
    platform = Platform(tmp_path_factory.mktemp("platform"))
    try:
        yield platform.start(NODES)
    finally:
        platform.stop()

"""One real platform (gunicorn, dispatcher, fake agents) for the browser and CLI tests,
started once per session by whichever asks first. Its own database and Redis db, so it can run
beside the end-to-end suite's; static files collected first so gunicorn serves htmx."""

from __future__ import annotations

import pytest

from tests.e2e.platform import ROOT, Platform

NODES = {
    "ui-h1": ("H100-80GB", 4, "rack=r1,zone=a"),
    "ui-a1": ("A100-40GB", 2, "rack=r2,zone=a"),
    "ui-a2": ("A100-40GB", 2, "rack=r3,zone=b"),
}
_platform: Platform | None = None


def ui_platform(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Platform:
    global _platform
    if _platform is None:
        platform = Platform(
            tmp_path_factory.mktemp("ui-platform"),
            name="gpuplatform_ui",
            redis_db=2,
            env={"GPUPLATFORM_GPU_SAMPLE_SECONDS": "1"},  # the job page's GPU charts fill quickly
        )
        try:
            platform.manage("collectstatic", "--noinput", "-v", "0")
            platform.start(NODES)
        except BaseException:
            platform.stop()
            raise
        _platform = platform
        request.addfinalizer(_stop)
    return _platform


def stop_after_last_user(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the platform as soon as the next test is not one of ours, so it never runs beside
    the end-to-end suite's platform on a small machine."""
    ours = (ROOT / "tests" / "browser", ROOT / "tests" / "cli")
    if nextitem is None or not any(parent in ours for parent in nextitem.path.parents):
        _stop()


def _stop() -> None:
    global _platform
    if _platform is not None:
        _platform.stop()
        _platform = None

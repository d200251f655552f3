"""schemathesis against the platform's own `/api/schema/`: a live gunicorn (its own SQLite
database, a database of the session's Redis), a member's token, every public operation fuzzed
from the document with a few examples each. The answers must conform to the document: no 5xx,
only the status codes it lists, bodies and headers as it describes them, JSON where it says so.

Bounded: a few examples per operation (`MAX_EXAMPLES`), no shrinking, so the whole run is a
couple of minutes at most on a loaded machine."""

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.platform import ROOT, Platform

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = int(os.environ.get("GPUPLATFORM_FUZZ_EXAMPLES", 15))  # more for a deeper look
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
SEEN: Counter = Counter()  # (operation, status) over the whole run
SKUS = "from apps.nodes.models import GpuSku; GpuSku.objects.get_or_create(name='H100-80GB')"


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """Only the web: no dispatcher, no agents (submitted jobs stay queued)."""
    platform = Platform(
        tmp_path_factory.mktemp("schema-fuzz"), name="gpuplatform_schema_fuzz", redis_db=9
    )
    try:
        platform.manage("migrate", "--noinput", "-v", "0")
        platform.manage("shell", "-c", SKUS)
        seed = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=platform.env, check=True,
                              capture_output=True, text=True)  # fmt: skip
        platform.tokens = json.loads(seed.stdout.strip().splitlines()[-1])
        platform.spawn("web", [sys.executable, "-m", "gunicorn", "gpuplatform.wsgi", "--bind",
                               f"127.0.0.1:{platform.port}", "--workers", "1", "--threads", "4",
                               "--timeout", "60"])  # fmt: skip
        platform.wait_until(platform.ready, timeout=90, what="web answering")
        yield platform
    finally:
        platform.stop()


@pytest.fixture(scope="module")
def api_schema(web):
    token = web.tokens["bob"]  # a member of acme (enterprise, commands allowed)
    schema = schemathesis.openapi.from_url(
        f"{web.url}/api/schema/", headers={"Authorization": f"Token {token}"}, timeout=30
    )
    schema.config.update(base_url=web.url, headers={"Authorization": f"Token {token}"})
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_answer_conforms(case, web):
    if case.path.endswith("/events/"):
        _short_stream(case)
    _key_per_body(case)
    response = case.call_and_validate(
        headers={"Authorization": f"Token {web.tokens['bob']}"}, checks=CHECKS, timeout=30
    )
    SEEN[case.operation.label, response.status_code] += 1


def _key_per_body(case) -> None:
    """The coverage phase sends one Idempotency-Key with hundreds of bodies: each but the first
    would stop at 409 (tests/api/test_schema.py checks that) before its body is read. The key
    gets the body's digest: the same body replays (200), another one is validated and submitted."""
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and key.strip():
        digest = hashlib.sha256(repr(case.body).encode()).hexdigest()[:16]
        case.headers = {**case.headers, "Idempotency-Key": f"{key.strip()[:200]}-{digest}"}


def _short_stream(case) -> None:
    """A stream of a real job (an id the fuzzer took from an earlier answer) lives `timeout`
    seconds (default 30): none, or a number over 2, becomes 2 to keep the run short; any other
    value is sent as generated (the view reads every value, numbers or not)."""
    query = case.query if isinstance(case.query, dict) else {}
    value = query.get("timeout")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if value is None or (number and not value <= 2):
        case.query = {**query, "timeout": 2}


def test_the_fuzz_made_jobs_and_met_documented_404s(web):
    """After the fuzz (same module, runs after it): its submits made real jobs (the document's
    examples and template shapes are ones the server accepts), and random ids met 404s."""
    print(sorted(SEEN.items()))
    assert SEEN["POST /api/v1/jobs/", 201] > 0
    for path in (
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/jobs/{id}/logs/",
        "/api/v1/jobs/{id}/artifacts/",
    ):
        method = "POST" if path.endswith("/cancel/") else "GET"
        assert SEEN[f"{method} {path}", 404] > 0
    jobs = web.get("bob", "/api/v1/jobs/").json()
    assert jobs["count"] > 0

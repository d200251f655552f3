"""The agent API: node credentials (hashed, shown once, expiring, revoked at once) and its
NodeRestriction-style rule (a node changes only itself and the members placed on it; anything
else is 404), through the agent's own HTTP client where it matters."""

import io
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from apps.jobs import services
from apps.nodes.credentials import issue_credential
from apps.nodes.models import Node, NodeCredential
from apps.platform.agent_protocol import ATTEMPT_TOKEN_HEADER, GpuInfo
from tests.agent_http import agent_api
from tests.factories import make_cast, make_node
from tests.unit.test_dispatcher import placed_and_started, submit
from workers.agent_client import CredentialRefused

API = "/internal/agent/v1"
INVENTORY = {"sku": "H100-80GB", "hostname": "h", "labels": {}, "isolation": "none",
             "gpus": [{"index": 0, "uuid": "GPU-0", "memory_mib": 80000}]}  # fmt: skip


@pytest.fixture
def cast(db):
    return make_cast()


def bearer(credential: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


def register(client: APIClient, node: str, **extra):
    return client.post(
        f"{API}/register/",
        {"node": node, "agent_instance": "i1", **INVENTORY, **extra},
        format="json",
    )


def create_credential(*args: str) -> str:
    out = io.StringIO()
    call_command("create_node_credential", *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


# --- credentials ------------------------------------------------------------------------------------


def test_the_command_prints_the_credential_last_and_stores_only_its_hash(db):
    credential = create_credential("n1", "--expires-days", "30")
    row = NodeCredential.objects.get()
    secret = credential.partition(".")[2]
    assert credential.startswith("gpn_") and len(secret) >= 40
    assert secret not in str(list(NodeCredential.objects.values()))  # only the hash is stored
    assert row.node_name == "n1" and row.expires_at > timezone.now() + timedelta(days=29)
    assert register(bearer(credential), "n1").status_code == 200
    assert Node.objects.get(name="n1").isolation == "none"


def test_a_wrong_missing_or_user_credential_is_401(db):
    credential = create_credential("n1")
    assert register(bearer(credential[:-2] + "xx"), "n1").status_code == 401
    assert register(bearer("gpn_nope.nope"), "n1").status_code == 401
    assert register(APIClient(), "n1").status_code == 401
    token_client = APIClient()
    token_client.credentials(HTTP_AUTHORIZATION="Token abc")
    assert (
        register(token_client, "n1").status_code == 401
    )  # a user's API token is not a node credential


def test_an_expired_credential_is_401(db, monkeypatch):
    from apps.nodes import credentials

    _, credential = issue_credential(node_name="n1", expires_days=1)
    client = bearer(credential)
    assert register(client, "n1").status_code == 200  # kept in this process's cache now
    later = timezone.now() + timedelta(days=1, seconds=1)
    monkeypatch.setattr(credentials.timezone, "now", lambda: later)
    assert register(client, "n1").status_code == 401


def test_an_expiry_set_in_the_admin_is_401_at_once(db):
    from django.contrib import admin

    row, credential = issue_credential(node_name="n1")
    client = bearer(credential)
    assert register(client, "n1").status_code == 200
    row.expires_at = timezone.now() - timedelta(seconds=1)
    admin.site.get_model_admin(NodeCredential).save_model(None, row, None, True)
    assert register(client, "n1").status_code == 401


def test_a_credential_is_read_once_with_a_plain_read_and_then_kept(db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.nodes.credentials import credential_node

    _, credential = issue_credential(node_name="n1")
    with CaptureQueriesContext(connection) as reads:
        assert credential_node(credential) == "n1"
        assert credential_node(credential) == "n1"  # kept: no read
        assert credential_node(credential[:-1] + "x") is None  # wrong secret, against the kept row
        assert credential_node("gpn_unknown.secret") is None  # an unknown one is read each time
        assert credential_node("gpn_unknown.secret") is None
    assert len(reads.captured_queries) == 3
    assert not any("ORDER BY" in query["sql"] for query in reads.captured_queries)


def test_a_revoked_credential_is_401_at_once_for_every_credential_of_the_node(db):
    first, second = create_credential("n1"), create_credential("n1")
    other = create_credential("n2")
    api = agent_api(first)
    api.register(node="n1", agent_instance="i1", sku="H100-80GB", gpus=[GpuInfo(index=0, uuid="GPU-0")], labels={},
                 hostname="h", isolation="none")  # fmt: skip
    assert api.heartbeat(agent_instance="i1", gpus=[]) == {}  # alive, nothing placed here
    out = io.StringIO()
    call_command("create_node_credential", "n1", "--revoke", stdout=out)
    assert "revoked 2 credential(s)" in out.getvalue()
    with pytest.raises(CredentialRefused):
        api.heartbeat(agent_instance="i1", gpus=[])  # the very next request: dropped here at once
    assert register(bearer(second), "n1").status_code == 401
    assert register(bearer(other), "n2").status_code == 200


# --- NodeRestriction ------------------------------------------------------------------------------


def test_a_node_cannot_register_as_another_node(db):
    credential = create_credential("n1")
    response = register(bearer(credential), "n2")
    assert response.status_code == 403
    assert "for node 'n1'" in response.json()["detail"]
    assert not Node.objects.filter(name="n2").exists()


@pytest.fixture
def placed(cast):
    """A started job on h1, and clients for h1's agent and for another node's."""
    make_node("h1", gpus=1)
    make_node("h2", gpus=1)
    job, attempt = placed_and_started(cast)
    assert attempt.members.get().node.name == "h1"
    return (
        job,
        attempt,
        bearer(issue_credential(node_name="h1")[1]),
        bearer(issue_credential(node_name="h2")[1]),
    )


def member_url(attempt, suffix: str = "") -> str:
    return f"{API}/members/{attempt.pk}/0/{suffix}"


def fenced(attempt, token=None) -> dict:
    return {f"HTTP_{ATTEMPT_TOKEN_HEADER.upper().replace('-', '_')}": str(token or attempt.token)}


def test_a_node_sees_and_reports_on_its_own_member(placed):
    job, attempt, mine, _ = placed
    assert mine.get(member_url(attempt), **fenced(attempt)).json()["token"] == str(attempt.token)
    assert [m["attempt_id"] for m in mine.get(f"{API}/assignments/").json()["members"]] == [
        attempt.pk
    ]
    response = mine.post(
        member_url(attempt, "progress/"), {"progress": 0.5}, format="json", **fenced(attempt)
    )
    assert response.json() == {"accepted": True}
    job.refresh_from_db()
    assert job.progress == 0.5


@pytest.mark.parametrize(("method", "suffix", "body"), [
    ("get", "", None),
    ("post", "started/", {"pid": 1}),
    ("post", "progress/", {"progress": 0.9}),
    ("post", "finished/", {"exit_code": 0}),
    ("post", "lost/", {"reason": "x"}),
    ("post", "log/", None),
    ("put", "log/", None),
    ("get", "checkpoint/", None),
    ("put", "checkpoint/", None),
    ("put", "artifacts/result.json", None),
])  # fmt: skip
def test_another_nodes_member_is_404_even_with_the_right_token(placed, method, suffix, body):
    job, attempt, mine, other = placed
    response = getattr(other, method)(
        member_url(attempt, suffix), body, format="json", **fenced(attempt)
    )
    assert response.status_code == 404
    # and the member's own node with a wrong token: 404 as well
    wrong = getattr(mine, method)(member_url(attempt, suffix), body, format="json",
                                  **fenced(attempt, token="00000000-0000-0000-0000-000000000000"))  # fmt: skip
    assert wrong.status_code == 404
    garbage = getattr(mine, method)(
        member_url(attempt, suffix), body, format="json", **fenced(attempt, token="x")
    )
    assert garbage.status_code == 404
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert (job.state, attempt.state, job.progress) == ("running", "running", 0.0)
    assert not job.artifacts.exists()
    assert other.get(f"{API}/assignments/").json() == {"members": []}


def test_a_node_cannot_point_a_job_at_another_jobs_checkpoint(placed, cast):
    job, attempt, mine, _ = placed
    response = mine.post(member_url(attempt, "progress/"), {"progress": 0.5, "checkpoint": "checkpoints/other/x"},
                         format="json", **fenced(attempt))  # fmt: skip
    assert response.status_code == 400 and "checkpoint" in response.json()


def test_bad_report_bodies_are_400_naming_the_field(placed):
    _, attempt, mine, _ = placed
    response = mine.post(
        member_url(attempt, "progress/"), {"progress": "lots"}, format="json", **fenced(attempt)
    )
    assert response.status_code == 400 and "progress" in response.json()
    response = mine.post(member_url(attempt, "log/"), b"x", content_type="application/octet-stream",
                         **fenced(attempt))  # fmt: skip
    assert response.status_code == 400 and "X-Log-Offset" in response.json()
    response = mine.put(member_url(attempt, "artifacts/../../etc/passwd"), b"x", content_type="application/octet-stream",
                        **fenced(attempt))  # fmt: skip
    assert response.status_code in (400, 404)


# --- files --------------------------------------------------------------------------------------------


def test_log_chunks_append_where_the_stored_log_ends(placed, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    job, attempt, mine, _ = placed

    def append(offset, data):
        return mine.post(member_url(attempt, "log/"), data, content_type="application/octet-stream",
                         HTTP_X_LOG_OFFSET=str(offset), **fenced(attempt))  # fmt: skip

    assert append(0, b"hello ").json() == {"size": 6}
    assert append(0, b"again").status_code == 409  # not where it ends: refused, size given back
    assert append(6, b"world\n").json() == {"size": 12}
    assert (tmp_path / "logs" / str(job.pk) / "attempt-1.log").read_bytes() == b"hello world\n"
    settings.AGENT_LOG_MAX_BYTES = 14
    assert append(12, b"too long").status_code == 413


def test_an_artifact_is_streamed_into_storage_and_capped(placed, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    job, attempt, mine, _ = placed
    response = mine.put(member_url(attempt, "artifacts/sub/result.json"), b'{"ok": 1}',
                        content_type="application/octet-stream", **fenced(attempt))  # fmt: skip
    assert response.status_code == 201
    artifact = job.artifacts.get()
    assert (artifact.name, artifact.size) == ("sub/result.json", 9)
    settings.AGENT_ARTIFACT_MAX_BYTES = 4
    response = mine.put(member_url(attempt, "artifacts/big.bin"), b"12345", content_type="application/octet-stream",
                        **fenced(attempt))  # fmt: skip
    assert response.status_code == 413
    assert job.artifacts.count() == 1


def test_a_checkpoint_stored_from_one_node_is_fetched_by_the_next_attempt_on_another(
    cast, settings, tmp_path
):
    """Preempted on h1, resumed on h2: no shared disk, the checkpoint goes through storage."""
    settings.MEDIA_ROOT = tmp_path
    make_node("h1", gpus=1)
    job, attempt = placed_and_started(cast)
    h1 = agent_api(issue_credential(node_name="h1")[1])
    a1 = h1.assignment(attempt.pk, 0, str(attempt.token))
    stored = h1.put_checkpoint(a1, "checkpoint.json", io.BytesIO(b'{"step": 7}'))
    assert stored == f"checkpoints/{job.pk}/attempt-1/rank-0/checkpoint.json"
    assert h1.report(a1, "progress", progress=0.3, checkpoint=stored)
    services.job_preempt(job=job, actor="test", reason="test")
    assert h1.report(a1, "finished", exit_code=0, reason="", checkpoint=stored)
    job.refresh_from_db()
    assert job.state == "queued"

    Node.objects.filter(name="h1").update(state="cordoned")
    make_node("h2", gpus=1)
    from apps.scheduling.dispatcher import dispatch_once

    dispatch_once()
    second = job.attempts.get(number=2)
    assert second.members.get().node.name == "h2"
    h2 = agent_api(issue_credential(node_name="h2")[1])
    a2 = h2.assignment(second.pk, 0, str(second.token))
    path = h2.get_checkpoint(a2, tmp_path / "h2-checkpoints")
    assert open(path, "rb").read() == b'{"step": 7}'
    assert path.endswith("checkpoint.json")
    assert h1.assignment(second.pk, 0, str(second.token)) is None  # not h1's any more


# --- isolation and placement ---------------------------------------------------------------------


def test_jobs_that_may_run_commands_are_not_placed_on_an_unisolated_node_unless_the_operator_opts_it_in(
    cast,
):
    from apps.scheduling.dispatcher import dispatch_once

    node = make_node("bare", gpus=1, allow_unisolated_commands=False)
    commands = submit(cast, "bob", gpus=1)  # acme may run commands: even its template jobs stay off
    dispatch_once()
    commands.refresh_from_db()
    assert commands.state == "queued"
    Node.objects.filter(pk=node.pk).update(allow_unisolated_commands=True)  # the operator's opt-in
    dispatch_once()
    commands.refresh_from_db()
    assert commands.state == "starting"


def test_a_tenant_that_may_not_run_commands_still_gets_an_unisolated_node(cast):
    from apps.scheduling.dispatcher import dispatch_once

    make_node("bare", gpus=1, allow_unisolated_commands=False)
    templates_only = submit(cast, "dave", gpus=1)  # globex may only run the platform's templates
    dispatch_once()
    templates_only.refresh_from_db()
    assert templates_only.state == "starting"


def test_trusting_every_unisolated_node_is_one_setting(cast, settings):
    from apps.scheduling.dispatcher import dispatch_once

    settings.TRUST_UNISOLATED_NODES = True  # `make run` on a developer's machine
    make_node("bare", gpus=1, allow_unisolated_commands=False)
    job = submit(cast, "bob", gpus=1)
    dispatch_once()
    job.refresh_from_db()
    assert job.state == "starting"


def test_an_isolating_node_takes_jobs_that_run_commands(cast):
    from apps.scheduling.dispatcher import dispatch_once

    make_node("fenced", gpus=1, isolation="uid+cgroup+mountns", allow_unisolated_commands=False)
    job = submit(cast, "bob", gpus=1)
    dispatch_once()
    job.refresh_from_db()
    assert job.state == "starting"


def test_the_node_api_shows_isolation(cast):
    make_node("h1", gpus=1, isolation="uid+cgroup")
    from tests.factories import client_for

    node = client_for(cast["staff"][1]).get("/api/v1/nodes/h1/").json()
    assert node["isolation"] == "uid+cgroup"


# --- the agent process ------------------------------------------------------------------------------


def test_the_agent_imports_no_django():
    code = (
        "import sys; import workers.agent, workers.reporter, workers.agent_client, workers.runner\n"
        "assert not [m for m in sys.modules if m.startswith('django')], 'agent modules import django'\n"
        "workers.agent.forbid_django()\n"
        "import workers.celery_app, workers.tasks\n"
        "workers.celery_app.configure(broker_url='redis://127.0.0.1:1/0', node='x', visibility_timeout=5)\n"
        "assert not [m for m, v in sys.modules.items() if m.startswith('django') and v is not None]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # fmt: skip
    assert result.returncode == 0, result.stderr

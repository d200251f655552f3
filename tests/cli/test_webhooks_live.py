"""Webhooks on the real platform: a local receiver that is down when the job starts still gets
one signed delivery per state change, in order, once the pump's retries reach it. The receiver
is on loopback, so `create_webhook` refuses it until the operator allow-lists 127.0.0.0/8."""

import hashlib
import hmac
import json
import subprocess
import sys
import time

import pytest

from tests.web.test_webhooks import Receiver, free_port

pytestmark = pytest.mark.e2e


def test_a_receiver_down_for_a_while_gets_every_state_change_signed_and_in_order(platform):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    with pytest.raises(subprocess.CalledProcessError) as refused:
        platform.manage("create_webhook", "globex", url)
    assert "not a public address" in refused.value.stderr
    platform.env["GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS"] = "127.0.0.0/8"
    try:
        out = platform.manage("create_webhook", "globex", url)
        pump = platform.spawn(
            "webhooks", [sys.executable, "manage.py", "deliver_webhooks", "--interval", "0.5"]
        )
    finally:
        del platform.env["GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS"]  # only the pump started above has it
    secret = out.strip().splitlines()[-1]
    try:
        job = platform.submit(
            "dave", template="demo-train", params={"steps": 3, "step_seconds": 0.1}, gpus=1
        )
        platform.wait_for_state(job["id"], "succeeded")
        time.sleep(4)  # the receiver is still down: the first tries fail and back off
        receiver = Receiver(port)
        try:
            platform.wait_until(
                lambda: len(receiver.received) >= 4, timeout=60, what="4 webhook deliveries"
            )
        finally:
            receiver.stop()
    finally:
        pump.terminate()
        pump.wait(10)
    bodies = [json.loads(body) for _, body, _ in receiver.received]
    assert [b["to"] for b in bodies] == ["queued", "starting", "running", "succeeded"]
    assert {b["job"]["id"] for b in bodies} == {job["id"]}
    for headers, body, _ in receiver.received:
        signed = headers["X-Gpuplatform-Timestamp"].encode() + b"." + body
        expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Gpuplatform-Signature"], expected)

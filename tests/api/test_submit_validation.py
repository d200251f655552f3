"""Every bad submission gets 400 naming the field; none gets a 500."""

import json

import pytest

from apps.jobs.models import Job

GOOD = {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, "gpu_sku": "H100-80GB"}


def body(**changes):
    data = dict(GOOD)
    for key, value in changes.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


DROP = object()

BAD_INPUTS = [
    # (case id, body, field the error must name)
    ("gpus-string", body(gpus="two"), "gpus"),
    ("gpus-numeric-string", body(gpus="2"), "gpus"),
    ("gpus-bool", body(gpus=True), "gpus"),
    ("gpus-float", body(gpus=1.5), "gpus"),
    ("gpus-negative", body(gpus=-1), "gpus"),
    ("gpus-huge", body(gpus=10**12), "gpus"),
    ("nodes-zero", body(nodes=0), "nodes"),
    ("nodes-huge", body(nodes=100000), "nodes"),
    ("nodes-null", body(nodes=None), "nodes"),
    ("unknown-sku", body(gpu_sku="Z100-1GB"), "gpu_sku"),
    ("sku-number", body(gpu_sku=100), "gpu_sku"),
    ("unknown-template", body(template="mine-bitcoin"), "template"),
    ("template-list", body(template=["demo-train"]), "template"),
    ("no-template-no-command", body(template=DROP, params=DROP), "template"),
    ("template-and-command", body(command=["python", "x.py"]), "command"),
    ("unknown-param", body(params={"steps": 3, "bogus": 1}), "params"),
    ("param-wrong-type", body(params={"steps": "ten"}), "params"),
    ("param-negative", body(params={"steps": -5}), "params"),
    ("param-huge", body(params={"steps": 10**9}), "params"),
    ("params-not-object", body(params=[1, 2]), "params"),
    (
        "shell-string-command",
        body(template=DROP, params=DROP, command="python train.py && rm -rf /"),
        "command",
    ),
    ("command-non-strings", body(template=DROP, params=DROP, command=["python", 3]), "command"),
    ("command-empty", body(template=DROP, params=DROP, command=[]), "command"),
    ("name-too-long", body(name="x" * 101), "name"),
    ("name-number", body(name=42), "name"),
    ("name-control-chars", body(name="a\x00b"), "name"),
    ("name-empty", body(name=""), "name"),
    ("unknown-tier", body(tier="platinum"), "tier"),
    ("runtime-zero", body(max_runtime_seconds=0), "max_runtime_seconds"),
    ("runtime-negative", body(max_runtime_seconds=-60), "max_runtime_seconds"),
    ("runtime-huge", body(max_runtime_seconds=10**10), "max_runtime_seconds"),
    ("checkpointable-string", body(checkpointable="yes"), "checkpointable"),
    ("selector-not-object", body(node_selector="zone=a"), "node_selector"),
    ("selector-value-number", body(node_selector={"zone": 1}), "node_selector"),
    ("unknown-field", body(priority=999), "priority"),
    ("infer-missing-prompt", body(template="demo-infer", params={"max_tokens": 5}), "params"),
]


@pytest.mark.parametrize("case,data,field", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_it_rejects_bad_input_naming_the_field(as_user, case, data, field):
    response = as_user("bob").post("/api/v1/jobs/", data, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"",
        b"[1, 2, 3]",
        b'"a string"',
        b"null",
        b'{"gpus": NaN}',
        b"[" * 100000 + b"]" * 100000,
    ],
    ids=["malformed", "empty", "list", "string", "null", "nan", "deeply-nested"],
)
def test_it_rejects_a_malformed_body_with_400(as_user, raw):
    response = as_user("bob").generic("POST", "/api/v1/jobs/", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "body" in response.json() or "template" in response.json()


def test_a_tier_above_the_tenants_is_forbidden(as_user):
    response = as_user("dave").post("/api/v1/jobs/", body(tier="enterprise"), format="json")
    assert response.status_code == 403
    assert "tier" in response.json()


def test_a_command_needs_the_tenants_permission(as_user):
    response = as_user("dave").post(
        "/api/v1/jobs/", body(template=DROP, params=DROP, command=["python3", "-V"]), format="json"
    )
    assert response.status_code == 403
    assert "command" in response.json()


def test_a_good_submission_is_created_with_defaults(as_user):
    response = as_user("bob").post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["state"] == "queued"
    assert job["tier"] == "enterprise"
    assert job["params"] == {"steps": 3, "step_seconds": 0.1}
    assert job["queue_position"] == 1
    assert json.loads(json.dumps(job))["attempts"] == []


def test_the_queued_job_cap_answers_429_with_retry_after(as_user, cast):
    from apps.tenants.models import Tenant
    from apps.tenants.services import quota_set

    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=2)
    for _ in range(2):
        assert as_user("bob").post("/api/v1/jobs/", GOOD, format="json").status_code == 201
    response = as_user("bob").post("/api/v1/jobs/", GOOD, format="json")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0


def test_refused_submissions_are_counted_by_reason_in_metrics(as_user, cast):
    from prometheus_client.parser import text_string_to_metric_families

    from apps.tenants.models import Tenant
    from apps.tenants.services import quota_set

    quota_set(tenant=Tenant.objects.get(slug="acme"), max_queued_jobs=0)
    assert as_user("bob").post("/api/v1/jobs/", GOOD, format="json").status_code == 429
    assert (
        as_user("dave").post("/api/v1/jobs/", body(tier="enterprise"), format="json").status_code
        == 403
    )
    families = {
        f.name: f
        for f in text_string_to_metric_families(as_user(None).get("/metrics").content.decode())
    }
    counted = {
        s.labels["reason"]: s.value for s in families["gpuplatform_admission_rejections"].samples
    }
    assert counted.get("queue_full", 0) >= 1 and counted.get("not_allowed", 0) >= 1


@pytest.mark.parametrize(
    "raw,field",
    [
        (b'{"template": "demo-train", "node_selector": {"zone\\u0000": "a"}}', "node_selector"),
        (b'{"template": "demo-train", "params": {"steps": 1, "x": "a\\u0000"}}', "params"),
        (b'{"template": "demo-train", "name": "run-\\ud975"}', "name"),
        (b'{"template": "demo-infer", "params": {"prompt": "\\udeaa"}}', "params"),
    ],
    ids=[
        "nul-in-a-selector-key",
        "nul-in-params",
        "lone-surrogate-in-name",
        "lone-surrogate-in-params",
    ],
)
def test_text_the_database_cannot_store_is_refused_naming_the_field(as_user, raw, field):
    # PostgreSQL refuses NUL in text and JSON, and a lone surrogate has no UTF-8 form: found by
    # schemathesis as a 500 (tests/api/test_schema_fuzz.py).
    response = as_user("bob").generic("POST", "/api/v1/jobs/", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert Job.objects.count() == 0

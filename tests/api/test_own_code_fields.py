"""The submit body's own-code fields (docs/own-code.md): `bundle`, `env`, `python` and the syntax
of `secrets`. Each bad input is a 400 naming the field; a bundle is the submitter's tenant's
(another tenant's answers exactly as an unknown one); any tenant may run a command in its own
bundle; the job object and the node's assignment carry the fields."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
from django.utils import timezone

from apps.bundles.models import Bundle
from apps.jobs.models import Job
from apps.jobs.selectors import assignment_for
from apps.platform.own_code import RESERVED_NAMES

COMMAND = ["python", "train.py"]
DIGEST = "ab" * 32  # valid syntax, uploaded by nobody


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path


def tar_gz(text: bytes = b"print('hi')\n") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo("train.py")
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text))
    return out.getvalue()


def uploaded(client, text: bytes = b"print('hi')\n") -> str:
    response = client.generic(
        "POST", "/api/v1/bundles/", tar_gz(text), content_type="application/gzip"
    )
    assert response.status_code in (200, 201), response.content
    return response.json()["sha256"]


def cmd(**fields) -> dict:
    return {"command": COMMAND, "gpus": 1, **fields}


def tpl(**fields) -> dict:
    return {"template": "demo-train", "params": {"steps": 3}, "gpus": 1, **fields}


BAD = [
    # bundle
    ("bundle-not-hex", cmd(bundle="not-a-digest"), "bundle"),
    ("bundle-uppercase", cmd(bundle="AB" * 32), "bundle"),
    ("bundle-short", cmd(bundle="a" * 63), "bundle"),
    ("bundle-number", cmd(bundle=12345), "bundle"),
    ("bundle-null", cmd(bundle=None), "bundle"),
    ("bundle-unknown", cmd(bundle=DIGEST), "bundle"),
    ("bundle-with-template", tpl(bundle=DIGEST), "bundle"),
    ("bundle-without-command", {"bundle": DIGEST}, "bundle"),
    # env
    ("env-list", cmd(env=["A=1"]), "env"),
    ("env-name-trailing-newline", cmd(env={"A\n": "1"}), "env"),
    ("env-string", cmd(env="A=1"), "env"),
    ("env-lowercase", cmd(env={"lr": "1"}), "env"),
    ("env-leading-digit", cmd(env={"1LR": "1"}), "env"),
    ("env-dash", cmd(env={"MY-VAR": "1"}), "env"),
    ("env-empty-name", cmd(env={"": "1"}), "env"),
    ("env-equals", cmd(env={"A=B": "1"}), "env"),
    ("env-master-any", cmd(env={"MASTER_WHATEVER": "1"}), "env"),
    ("env-platform-any", cmd(env={"GPUPLATFORM_NODE": "h9"}), "env"),
    ("env-ld-audit", cmd(env={"LD_AUDIT": "/x.so"}), "env"),
    ("env-value-number", cmd(env={"LR": 3}), "env"),
    ("env-value-null", cmd(env={"LR": None}), "env"),
    ("env-value-long", cmd(env={"LR": "x" * 4097}), "env"),
    ("env-value-nul", cmd(env={"LR": "a\x00b"}), "env"),
    ("env-too-many", cmd(env={f"V{i}": "1" for i in range(65)}), "env"),
    ("env-with-template", tpl(env={"LR": "1"}), "env"),
    ("env-also-a-secret", cmd(env={"HF_TOKEN": "x"}, secrets=["HF_TOKEN"]), "env"),
    # python
    ("python-list", cmd(python=["numpy"]), "python"),
    ("python-unknown-key", cmd(python={"requirements": [], "index_url": "http://x"}), "python"),
    ("python-requirements-string", cmd(python={"requirements": "numpy"}), "python"),
    ("python-option-r", cmd(python={"requirements": ["-r requirements.txt"]}), "python"),
    ("python-option-index", cmd(python={"requirements": ["--index-url=http://evil/"]}), "python"),
    ("python-editable", cmd(python={"requirements": ["-e ."]}), "python"),
    ("python-url", cmd(python={"requirements": ["pkg @ https://evil.example/pkg.whl"]}), "python"),
    ("python-file-url", cmd(python={"requirements": ["pkg @ file:///etc/passwd"]}), "python"),
    ("python-path", cmd(python={"requirements": ["./local/pkg"]}), "python"),
    ("python-invalid", cmd(python={"requirements": ["torch=="]}), "python"),
    ("python-spaces-name", cmd(python={"requirements": ["not a package"]}), "python"),
    ("python-number", cmd(python={"requirements": [3]}), "python"),
    ("python-empty-string", cmd(python={"requirements": [""]}), "python"),
    ("python-too-long", cmd(python={"requirements": ["a" * 1001]}), "python"),
    ("python-too-many", cmd(python={"requirements": [f"p{i}" for i in range(201)]}), "python"),
    ("python-with-template", tpl(python={"requirements": ["numpy"]}), "python"),
    # secrets (names only: whether each exists is the secrets' own check)
    ("secrets-string", cmd(secrets="HF_TOKEN"), "secrets"),
    ("secrets-object", cmd(secrets={"HF_TOKEN": "x"}), "secrets"),
    ("secrets-lowercase", cmd(secrets=["hf_token"]), "secrets"),
    ("secrets-number", cmd(secrets=[1]), "secrets"),
    ("secrets-reserved", cmd(secrets=["LD_PRELOAD"]), "secrets"),
    ("secrets-twice", cmd(secrets=["A", "A"]), "secrets"),
    ("secrets-too-many", cmd(secrets=[f"S{i}" for i in range(65)]), "secrets"),
]


@pytest.mark.parametrize("case,data,field", BAD, ids=[c[0] for c in BAD])
def test_a_bad_own_code_field_is_400_naming_it(as_user, case, data, field):
    response = as_user("bob").post("/api/v1/jobs/", data, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


# Everything the platform sets: the brief's names and what workers/jobenv.py sets.
RESERVED = sorted(
    RESERVED_NAMES
    | {"MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "LD_LIBRARY_PATH", "GPUPLATFORM_JOB_ID"}
)


@pytest.mark.parametrize("name", RESERVED)
def test_a_name_the_platform_sets_is_refused_naming_it(as_user, name):
    response = as_user("bob").post("/api/v1/jobs/", cmd(env={name: "x"}), format="json")
    assert response.status_code == 400, response.content
    assert any(f"env.{name}" in message for message in response.json()["env"])


def test_the_reserved_names_cover_what_the_runner_sets():
    """Every variable workers/jobenv.py puts in a job's environment is refused."""
    import re

    from apps.platform.own_code import name_problem

    source = open("workers/jobenv.py").read()  # a member's environment (the runner's)
    start = source.index("def environment(")
    block = source[start:]
    names = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", block)) | set(
        re.findall(r'"([A-Z][A-Z0-9_]+)"', source[: source.index("def python3(")])
    )
    assert {"PATH", "HOME", "RANK", "CUDA_VISIBLE_DEVICES", "NODE_RANK", "LD_LIBRARY_PATH"} <= names
    assert {name for name in names if name_problem(name) is None} == set()


def test_a_good_command_with_bundle_env_python_and_secrets_is_submitted(as_user):
    as_user("alice").post("/api/v1/secrets/", {"name": "HF_TOKEN", "value": "v"}, format="json")
    digest = uploaded(as_user("bob"))
    Bundle.objects.update(last_used_at=timezone.now() - timezone.timedelta(days=5))
    body = cmd(bundle=digest, env={"LR": "3e-4", "_X": ""}, secrets=["HF_TOKEN"],
               python={"requirements": ["numpy>=1.26", "torch==2.4.0; python_version >= '3.10'",
                                        "requests[socks]~=2.31"]})  # fmt: skip
    response = as_user("bob").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["bundle"] == digest and answer["env"] == {"LR": "3e-4", "_X": ""}
    assert answer["secrets"] == ["HF_TOKEN"]
    assert answer["python"]["requirements"][0] == "numpy>=1.26"
    job = Job.objects.get()
    assert (job.bundle, job.env, job.secrets) == (digest, body["env"], ["HF_TOKEN"])
    detail = as_user("bob").get(f"/api/v1/jobs/{job.pk}/").json()
    assert {k: detail[k] for k in ("bundle", "env", "secrets", "python")} == {
        k: answer[k] for k in ("bundle", "env", "secrets", "python")
    }
    assert (timezone.now() - Bundle.objects.get().last_used_at).total_seconds() < 60  # touched


def test_another_tenants_bundle_is_answered_as_an_unknown_one(as_user):
    theirs = uploaded(as_user("dave"), b"print('globex')\n")
    unknown = hashlib.sha256(b"nobody uploaded this").hexdigest()
    answers = []
    for digest in (theirs, unknown):
        response = as_user("bob").post("/api/v1/jobs/", cmd(bundle=digest), format="json")
        assert response.status_code == 400
        answers.append(response.json()["bundle"][0].replace(digest, "<digest>"))
    assert answers[0] == answers[1]
    assert not Job.objects.exists()


def test_a_tenant_without_commands_may_run_one_in_its_bundle(as_user):
    """globex may not run commands (allow_commands off), except in a bundle of its own."""
    refused = as_user("dave").post("/api/v1/jobs/", cmd(), format="json")
    assert refused.status_code == 403 and "command" in refused.json()
    digest = uploaded(as_user("dave"))
    response = as_user("dave").post("/api/v1/jobs/", cmd(bundle=digest), format="json")
    assert response.status_code == 201, response.content


def test_a_viewer_still_may_not_submit_with_a_bundle(as_user):
    digest = uploaded(as_user("bob"))
    assert (
        as_user("carol").post("/api/v1/jobs/", cmd(bundle=digest), format="json").status_code == 403
    )


def test_the_assignment_carries_bundle_env_and_requirements(as_user):
    from tests.unit.test_dispatcher import dispatch_once

    digest = uploaded(as_user("bob"))
    body = cmd(bundle=digest, env={"LR": "1"}, python={"requirements": ["numpy==2.0.0"]})
    assert as_user("bob").post("/api/v1/jobs/", body, format="json").status_code == 201
    dispatch_once()
    member = Job.objects.get().attempts.get().members.get()
    work = assignment_for(member)
    assert (work.bundle, work.env, work.python_requirements) == (
        digest,
        {"LR": "1"},
        ["numpy==2.0.0"],
    )


def test_a_template_job_with_secrets_is_not_served_from_the_result_cache(cast):
    from apps.admission.cache import cache_key
    from apps.jobs.models import JobTemplate
    from apps.jobs.services import JobSpec
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.get(slug="acme")
    template = JobTemplate.objects.get(name="demo-infer")
    spec = dict(name="i", tier=tenant.tier, template=template, params={"prompt": "hi"}, command=None,
                gpus=1, nodes=1, gpu_sku=None, node_selector={}, max_runtime_seconds=60,
                checkpointable=False, cacheable=True)  # fmt: skip
    assert cache_key(JobSpec(**spec), tenant) is not None
    assert cache_key(JobSpec(**spec, secrets=["HF_TOKEN"]), tenant) is None

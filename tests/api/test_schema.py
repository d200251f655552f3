"""The OpenAPI document (`/api/schema/`, gpuplatform/openapi.py) says what the API answers:
the public API only, every error answer with the body the API really writes, the submit body's
one-of with the database's templates, tiers and SKUs, and examples the server accepts.
Real answers are validated against the document's own schemas here; tests/api/test_schema_fuzz.py
fuzzes a live server from it."""

import copy
import json
import uuid

import jsonschema
import pytest
from rest_framework.test import APIClient

from apps.jobs.models import Job
from tests.factories import client_for

SUBMIT_OPERATION = ("/api/v1/jobs/", "post")


@pytest.fixture
def document(cast):
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def json_schema(document: dict, schema: dict) -> dict:
    """An OpenAPI 3.0 schema as JSON Schema (`nullable` as a null type), its refs resolvable."""

    def convert(node):
        if isinstance(node, dict):
            node = {key: convert(value) for key, value in node.items()}
            if node.pop("nullable", False):
                node = {"anyOf": [node, {"type": "null"}]}
            return node
        if isinstance(node, list):
            return [convert(item) for item in node]
        return node

    return {**convert(copy.deepcopy(schema)), "components": convert(document["components"])}


def conforms(document: dict, path: str, method: str, response) -> None:
    """The answer's status is documented for the operation and its JSON body fits that schema."""
    answers = document["paths"][path][method]["responses"]
    assert str(response.status_code) in answers, (response.status_code, sorted(answers))
    schema = answers[str(response.status_code)]["content"]["application/json"]["schema"]
    jsonschema.validate(json.loads(response.content), json_schema(document, schema))


def test_only_the_public_api_is_in_the_document(document):
    assert document["paths"]
    assert all(
        path.startswith("/api/v1/") for path in document["paths"]
    )  # no agent API, pages, schema


def test_every_operation_lists_its_error_answers(document):
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "403"} <= codes, (method, path)
            if "{" in path:
                assert "404" in codes, (method, path)
            if operation.get("requestBody") or any(
                p["in"] == "query" for p in operation.get("parameters", [])
            ):
                assert "400" in codes, (method, path)
    submit = document["paths"]["/api/v1/jobs/"]["post"]["responses"]
    assert {"200", "201", "400", "409", "429", "503"} <= set(submit)
    assert submit["429"]["headers"]["Retry-After"]["required"] is True
    assert "X-RateLimit-Remaining" in submit["201"]["headers"]


def test_the_submit_body_is_one_of_a_template_shape_or_a_command(document):
    body = document["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]["application/json"]
    shapes = [ref["$ref"].rsplit("/", 1)[-1] for ref in body["schema"]["oneOf"]]
    assert shapes == ["TemplateJob_demo-infer", "TemplateJob_demo-train", "CommandJob"]
    schema = json_schema(document, body["schema"])
    valid = jsonschema.Draft7Validator(schema)
    assert valid.is_valid({"template": "demo-train"})
    assert valid.is_valid({"command": ["python", "train.py"], "gpus": 2})
    assert not valid.is_valid({"template": "demo-train", "command": ["python"]})  # both
    assert not valid.is_valid({"gpus": 1})  # neither
    assert not valid.is_valid({"template": "no-such-template"})
    assert not valid.is_valid({"template": "demo-infer"})  # its prompt is required
    assert not valid.is_valid(
        {"template": "demo-train", "params": {"steps": 0}}
    )  # below its minimum
    assert not valid.is_valid({"template": "demo-train", "gpu_sku": "B200"})  # no such SKU
    assert not valid.is_valid({"template": "demo-train", "tier": "platinum"})
    listing = {
        p["name"]: p["schema"] for p in document["paths"]["/api/v1/jobs/"]["get"]["parameters"]
    }
    assert listing["tier"]["enum"] == ["enterprise", "free", "pro"]
    assert "queued" in listing["state"]["enum"]
    train = document["components"]["schemas"]["TemplateJob_demo-train"]["properties"]
    assert train["tier"]["enum"] == ["enterprise", "free", "pro"]
    assert "H100-80GB" in train["gpu_sku"]["enum"]


def test_the_examples_fit_the_schema_and_the_server_makes_jobs_of_them(document, cast):
    body = document["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]["application/json"]
    schema = json_schema(document, body["schema"])
    assert set(body["examples"]) == {"demo-train", "demo-infer"}
    for example in body["examples"].values():
        jsonschema.validate(example["value"], schema)
        response = client_for(cast["bob"][1]).post("/api/v1/jobs/", example["value"], format="json")
        assert response.status_code == 201, response.content
        conforms(document, "/api/v1/jobs/", "post", response)
    assert Job.objects.count() == 2


def test_refusals_have_the_documented_bodies(document, cast):
    bob, dave, carol = (client_for(cast[name][1]) for name in ("bob", "dave", "carol"))
    job = bob.post("/api/v1/jobs/", {"template": "demo-train"}, format="json").json()
    cases = [
        (
            "/api/v1/jobs/",
            "post",
            bob.post("/api/v1/jobs/", {"template": "demo-train", "gpus": "2"}, format="json"),
        ),
        (
            "/api/v1/jobs/",
            "post",
            bob.post(
                "/api/v1/jobs/", {"template": "demo-train", "params": {"steps": -1}}, format="json"
            ),
        ),  # fmt: skip
        (
            "/api/v1/jobs/",
            "post",
            bob.post("/api/v1/jobs/", "{bad", content_type="application/json"),
        ),
        ("/api/v1/jobs/", "post", client_for(None).post("/api/v1/jobs/", {}, format="json")),
        (
            "/api/v1/jobs/",
            "post",
            dave.post("/api/v1/jobs/", {"command": ["python"]}, format="json"),
        ),
        ("/api/v1/jobs/", "get", bob.get("/api/v1/jobs/", {"state": "sideways"})),
        ("/api/v1/jobs/", "get", bob.get("/api/v1/jobs/", {"page": 99})),
        ("/api/v1/jobs/{id}/", "get", dave.get(f"/api/v1/jobs/{job['id']}/")),
        ("/api/v1/jobs/{id}/cancel/", "post", carol.post(f"/api/v1/jobs/{job['id']}/cancel/")),
        ("/api/v1/nodes/", "get", bob.get("/api/v1/nodes/")),
    ]
    key = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    bob.post("/api/v1/jobs/", {"template": "demo-train"}, format="json", **key)
    cases.append(("/api/v1/jobs/", "post", bob.post("/api/v1/jobs/", {"template": "demo-infer", "params":
                                                    {"prompt": "x"}}, format="json", **key)))  # fmt: skip
    for path, method, response in cases:
        assert 400 <= response.status_code < 500, response.content
        conforms(document, path, method, response)
    assert [response.status_code for *_, response in cases] == [
        400,
        400,
        400,
        401,
        403,
        400,
        404,
        404,
        403,
        403,
        409,
    ]


@pytest.mark.parametrize(
    "suffix", ["cancel/", "logs/", "artifacts/", "artifacts/result.json", "events/", ""]
)
def test_random_ids_get_the_documented_json_404(document, cast, suffix):
    bob = client_for(cast["bob"][1])
    path = f"/api/v1/jobs/{uuid.uuid4()}/{suffix}"
    response = (
        bob.post(path) if suffix == "cancel/" else bob.get(path, HTTP_ACCEPT="application/json")
    )
    assert response.status_code == 404
    template = "/api/v1/jobs/{id}/" + (
        "artifacts/{name}" if suffix == "artifacts/result.json" else suffix
    )
    conforms(document, template, "post" if suffix == "cancel/" else "get", response)


def test_a_url_under_api_that_no_route_matches_gets_a_json_404(cast):
    bob = client_for(cast["bob"][1])
    for path in ("/api/v1/jobs/not-a-uuid/", "/api/v1/no-such-thing/", "/api/v1/nodes/a.b/"):
        response = bob.get(path)
        assert response.status_code == 404
        assert response.json() == {"detail": "Not found."}


def test_the_usage_answer_fits_its_schema(document, cast):
    response = client_for(cast["bob"][1]).get("/api/v1/usage/")
    assert response.status_code == 200
    conforms(document, "/api/v1/usage/", "get", response)


def test_a_closed_tiers_submit_with_redis_down_gets_the_documented_503(
    document, cast, monkeypatch, settings
):
    import redis

    from apps.admission import buckets

    def down(*args, **kwargs):
        raise redis.ConnectionError("refused")

    settings.RATE_LIMIT_FAIL_OPEN_TIERS = []
    monkeypatch.setattr(buckets, "lease", down)  # how a web process takes its tokens
    response = client_for(cast["bob"][1]).post(
        "/api/v1/jobs/", {"template": "demo-train"}, format="json"
    )
    assert response.status_code == 503 and response["Retry-After"]
    conforms(document, "/api/v1/jobs/", "post", response)
    assert document["paths"]["/api/v1/jobs/"]["post"]["responses"]["503"]["headers"]["Retry-After"]


def test_the_submit_body_documents_depends_on_and_its_404(document, cast):
    """`depends_on` has a schema (drf-spectacular's W001 without one), in every submit shape, and
    an id the caller cannot see answers the documented 404 naming the field."""
    body = document["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]["application/json"]
    valid = jsonschema.Draft7Validator(json_schema(document, body["schema"]))
    parent = str(uuid.uuid4())
    assert valid.is_valid({"template": "demo-train", "depends_on": [{"job": parent}]})
    assert valid.is_valid(
        {"command": ["python"], "depends_on": [{"array": parent, "condition": "aftercorr"}]}
    )
    assert not valid.is_valid(
        {"template": "demo-train", "depends_on": [{"job": parent, "array": parent}]}
    )
    assert not valid.is_valid({"template": "demo-train", "depends_on": [{"condition": "afterok"}]})
    assert not valid.is_valid(
        {"template": "demo-train", "depends_on": [{"job": parent, "condition": "whenever"}]}
    )
    bob = client_for(cast["bob"][1])
    response = bob.post(
        "/api/v1/jobs/", {"template": "demo-train", "depends_on": [{"job": parent}]}, format="json"
    )
    assert response.status_code == 404 and "depends_on" in response.json()
    conforms(document, "/api/v1/jobs/", "post", response)


NAMES = ["result.json", "notes.txt", "train.log", "table.csv", "plot.PNG", "run.tar.gz", "model.pt",
         "page.html", "noext"]  # fmt: skip


def test_every_artifact_download_has_a_documented_content_type(document, cast):
    """A download's Content-Type is one the document lists for it (schemathesis found 189 that
    were not: Django guessed them from the machine's mime types); HTML is never served as such."""
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    from apps.jobs.models import Artifact

    bob = client_for(cast["bob"][1])
    job = Job.objects.get(
        pk=bob.post("/api/v1/jobs/", {"template": "demo-train"}, format="json").json()["id"]
    )
    for name in NAMES:
        body = b"{}" if name.endswith(".json") else b"<script>1</script>"
        Artifact.objects.create(job=job, name=name,
                                file=default_storage.save(f"artifacts/{job.pk}/{name}", ContentFile(body)))  # fmt: skip
    operation = document["paths"]["/api/v1/jobs/{id}/artifacts/{name}"]["get"]
    documented = operation["responses"]["200"]["content"]
    types = {}
    for name in NAMES:
        response = bob.get(f"/api/v1/jobs/{job.pk}/artifacts/{name}")
        assert response.status_code == 200
        # A client asking for the type the document gives it gets the file, not a 406.
        accepting = bob.get(
            f"/api/v1/jobs/{job.pk}/artifacts/{name}", HTTP_ACCEPT=response["Content-Type"]
        )
        assert accepting.status_code == 200
        assert response["Content-Disposition"].startswith("attachment")
        types[name] = response["Content-Type"].split(";")[0]
        assert types[name] in documented, (name, types[name], sorted(documented))
        if types[name] == "application/json":
            schema = json_schema(document, documented["application/json"]["schema"])
            jsonschema.validate(json.loads(b"".join(response.streaming_content)), schema)
    assert types["result.json"] == "application/json" and types["plot.PNG"] == "image/png"
    assert types["page.html"] == types["model.pt"] == types["noext"] == "application/octet-stream"


def test_a_missing_artifact_is_a_json_404_whatever_the_client_accepts(document, cast):
    bob = client_for(cast["bob"][1])
    job = bob.post("/api/v1/jobs/", {"template": "demo-train"}, format="json").json()
    response = bob.get(f"/api/v1/jobs/{job['id']}/artifacts/none.png", HTTP_ACCEPT="image/png")
    assert response.status_code == 404
    conforms(document, "/api/v1/jobs/{id}/artifacts/{name}", "get", response)

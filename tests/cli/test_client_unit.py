"""The `gpuplatform` command against a fake API (tests/cli/fake_api.py): what each new flag puts
in the submit body, the bundle upload (only when the digest is new), secrets, arrays, and how
refusals are reported. The real platform runs these flows in tests/e2e/test_quickstart.py."""

import gzip
import hashlib
import io
import json
import os
import tarfile

import pytest

from gpuplatform import _client_path  # noqa: F401
from gpuplatform_client import cli, pack
from tests.cli.fake_api import FakeApi

JOB = {"id": "job-1", "state": "queued", "name": "train", "progress": 0, "tier": "pro",
       "exit_code": None, "attempts": [], "array": None, "array_index": None}  # fmt: skip
ARRAY = {"id": "arr-1", "size": 4, "throttle": 2, "counts": {"queued": 3, "running": 1},
         "tasks_url": "/api/v1/jobs/?array=arr-1"}  # fmt: skip


@pytest.fixture
def api(monkeypatch):
    fake = FakeApi()
    monkeypatch.setenv("GPUPLATFORM_URL", fake.url)
    monkeypatch.setenv("GPUPLATFORM_TOKEN", "tok")
    fake.routes[("POST", "/api/v1/jobs/")] = lambda r: (
        201,
        dict(JOB, **{"name": r.json().get("name", "train")}),
    )
    yield fake
    fake.stop()


@pytest.fixture
def workdir(tmp_path):
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref")
    (root / "train.py").write_text("print('train')\n")
    (root / "requirements.txt").write_text("tinystats==0.1.0\n")
    return root


def run(*argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return cli.main(list(argv))


def submitted(api) -> dict:
    return api.sent("POST", "/api/v1/jobs/")[-1].json()


def test_submit_workdir_uploads_a_new_bundle_then_submits_every_field(
    api, workdir, tmp_path, capsys
):
    uploads = []

    def upload(request):
        uploads.append(request)
        return 201, {"sha256": hashlib.sha256(request.body).hexdigest(), "size": len(request.body)}

    api.routes[("POST", "/api/v1/bundles/")] = upload
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("# pinned\nnumpy==2.1.0\n\nrich>=13  # pretty\n")
    code = run("submit", "--workdir", str(workdir), "--gpus", "2", "--nodes", "1", "--sku", "H100-80GB",
               "--env", "LR=3e-4", "--env", "NOTE=a=b", "--secret", "HF_TOKEN", "--secret", "HF_TOKEN",
               "--requirements", str(reqs), "--name", "train", "--", "python", "train.py", "--lr", "3e-4")  # fmt: skip
    assert code == 0
    out, err = capsys.readouterr()
    expected = pack.pack(workdir, tmp_path / "again.tar.gz").sha256
    assert [r.path for r in api.requests[:2]] == [
        f"/api/v1/bundles/{expected}/",
        "/api/v1/bundles/",
    ]
    assert api.requests[0].method == "HEAD"
    (upload_request,) = uploads
    assert upload_request.headers["Content-Type"] == "application/gzip"
    assert upload_request.headers["Authorization"] == "Token tok"
    assert hashlib.sha256(upload_request.body).hexdigest() == expected
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(upload_request.body))) as tar:
        assert sorted(tar.getnames()) == ["requirements.txt", "train.py"]  # no .git
    assert submitted(api) == {
        "command": ["python", "train.py", "--lr", "3e-4"], "bundle": expected, "gpus": 2, "nodes": 1,
        "gpu_sku": "H100-80GB", "name": "train", "env": {"LR": "3e-4", "NOTE": "a=b"},
        "secrets": ["HF_TOKEN"], "python": {"requirements": ["numpy==2.1.0", "rich>=13"]},
    }  # fmt: skip
    assert f"bundle {expected[:12]}: 2 files" in err and "uploading bundle" in err and "100%" in err
    assert out.strip() == "job-1 queued train"


def test_an_unchanged_workdir_uploads_nothing_the_second_time(api, workdir, capsys):
    sha = pack.pack(workdir).sha256
    api.routes[("HEAD", f"/api/v1/bundles/{sha}/")] = (200, b"")
    assert (
        run(
            "submit",
            "-w",
            str(workdir),
            "--requirement",
            "a==1",
            "--requirement",
            "b",
            "--",
            "python",
            "x.py",
        )
        == 0
    )
    err = capsys.readouterr().err
    assert f"bundle {sha[:12]} already uploaded" in err and "uploading" not in err
    assert not api.sent("POST", "/api/v1/bundles/")
    assert submitted(api)["bundle"] == sha and submitted(api)["python"] == {
        "requirements": ["a==1", "b"]
    }


def test_the_servers_413_names_the_cap_and_nothing_is_submitted(api, workdir, capsys):
    api.routes[("POST", "/api/v1/bundles/")] = (
        413,
        {"bundle": ["2.0 KiB is over this tenant's cap of 1.0 KiB"]},
    )
    assert run("submit", "-w", str(workdir), "--", "python", "train.py") == 3
    err = capsys.readouterr().err
    assert "413" in err and "cap of 1.0 KiB" in err and ".gpuignore" in err
    assert "bundle: 2.0 KiB is over" in err  # the field, then its message
    assert not api.sent("POST", "/api/v1/jobs/")


def test_a_400_prints_each_field_and_message(api, capsys):
    api.routes[("POST", "/api/v1/jobs/")] = (400, {"env": {"PATH": ["is set by the platform"]},
                                                   "secrets": ["unknown secret: NOPE"]})  # fmt: skip
    assert run("submit", "--env", "PATH=/x", "--secret", "NOPE", "--", "true") == 3
    err = capsys.readouterr().err
    assert "env.PATH: is set by the platform" in err and "secrets: unknown secret: NOPE" in err


def test_a_link_out_of_the_workdir_stops_before_any_request(api, workdir, capsys):
    os.symlink("/etc/passwd", workdir / "passwd")
    assert run("submit", "-w", str(workdir), "--", "python", "train.py") == 2
    assert "passwd" in capsys.readouterr().err and not api.requests


@pytest.mark.parametrize("argv, message", [
    (["submit", "--gpus", "1"], "wants a command"),
    (["submit", "-t", "demo-train", "--", "python"], "one of them"),
    (["submit", "-w", ".", "-t", "demo-train"], "does not go with --template"),
    (["submit", "--env", "NOVALUE", "--", "x"], "--env wants NAME=VALUE"),
    (["submit", "--array-grid", "g.json", "--", "x"], "go with --array"),
    (["submit", "--depends-on", "afterwhat:a:b", "--", "x"], "--depends-on wants"),
])  # fmt: skip
def test_bad_usage_is_exit_2_before_any_request(api, capsys, argv, message):
    assert run(*argv) == 2
    assert message in capsys.readouterr().err and not api.requests


def test_requirements_files_with_options_are_refused(api, tmp_path, capsys):
    reqs = tmp_path / "r.txt"
    reqs.write_text("numpy\n--index-url http://x\n")
    assert run("submit", "-r", str(reqs), "--", "python", "x.py") == 2
    assert "r.txt:2" in capsys.readouterr().err


def test_the_old_command_flag_still_takes_the_rest_of_the_line(api):
    assert run("submit", "--gpus", "1", "--command", "python", "-c", "print(1)", "-v") == 0
    assert submitted(api) == {"command": ["python", "-c", "print(1)", "-v"], "gpus": 1}
    assert run("submit", "-t", "demo-train", "-p", "steps=5", "-p", "name=x") == 0
    assert submitted(api) == {"template": "demo-train", "params": {"steps": 5, "name": "x"}}


def test_submit_array_with_a_grid_prints_the_array_and_its_counts(api, tmp_path, capsys):
    api.routes[("POST", "/api/v1/jobs/")] = (201, ARRAY)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"lr": [0.1, 0.01], "batch": [8, 16]}))
    assert (
        run("submit", "--array", "0-3%2", "--array-grid", str(grid), "--", "python", "train.py")
        == 0
    )
    assert submitted(api) == {"command": ["python", "train.py"], "array": "0-3%2", "name": "train",
                              "array_grid": {"lr": [0.1, 0.01], "batch": [8, 16]}}  # fmt: skip
    out = capsys.readouterr().out
    assert (
        out.startswith("arr-1  array") and "0/4 done %2" in out and "(3 queued, 1 running)" in out
    )

    params = tmp_path / "params.json"
    params.write_text(json.dumps([{"lr": 0.1}, {"lr": 0.2}]))
    assert run("submit", "--array", "0,1", "--array-params", str(params), "--", "x") == 0
    assert submitted(api)["array_params"] == [{"lr": 0.1}, {"lr": 0.2}]
    params.write_text("{}")
    assert run("submit", "--array", "0,1", "--array-params", str(params), "--", "x") == 2


def test_depends_on_conditions_and_kinds(api):
    api.routes[("GET", "/api/v1/jobs/j-9/")] = (200, dict(JOB, id="j-9"))
    api.routes[("GET", "/api/v1/arrays/a-7/")] = (200, dict(ARRAY, id="a-7"))
    assert run("submit", "--depends-on", "j-9", "--depends-on", "afternotok:a-7", "--depends-on",
               "aftercorr:a-8", "--depends-on", "afterany:job:j-1", "--depends-on", "array:a-2", "--", "x") == 0  # fmt: skip
    assert submitted(api)["depends_on"] == [
        {"job": "j-9", "condition": "afterok"}, {"array": "a-7", "condition": "afternotok"},
        {"array": "a-8", "condition": "aftercorr"}, {"job": "j-1", "condition": "afterany"},
        {"array": "a-2", "condition": "afterok"},
    ]  # fmt: skip


def test_show_and_cancel_know_arrays(api, capsys):
    api.routes[("GET", "/api/v1/arrays/arr-1/")] = (200, ARRAY)
    api.routes[("POST", "/api/v1/arrays/arr-1/cancel/")] = (
        200,
        dict(ARRAY, counts={"cancelled": 4}),
    )
    assert run("show", "arr-1") == 0
    out = capsys.readouterr().out
    assert "arr-1  array" in out and "  queued     3" in out and "  running    1" in out
    assert run("cancel", "arr-1") == 0
    assert "arr-1 cancelled" in capsys.readouterr().out
    assert api.sent("POST", "/api/v1/arrays/arr-1/cancel/")
    assert run("show", "nope") == 3 and "404" in capsys.readouterr().err


def test_list_shows_an_array_as_one_row_and_filters_its_tasks(api, capsys):
    tasks = [dict(JOB, id=f"t{i}", array="arr-1", array_index=i) for i in range(3)]
    page = {"count": 4, "next": None, "results": [*tasks, dict(JOB, id="solo")]}
    api.routes[("GET", "/api/v1/jobs/")] = (200, page)
    api.routes[("GET", "/api/v1/arrays/arr-1/")] = (200, ARRAY)
    api.routes[("GET", "/api/v1/jobs/?array=arr-1")] = (200, dict(page, results=tasks))
    assert run("list") == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:2] == ["ID", "STATE"]
    assert len(lines) == 2 and lines[0].startswith("arr-1  array") and lines[1].startswith("solo")
    assert run("list", "--array", "arr-1") == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["t0", "t1", "t2"] and lines[2].endswith(
        "train[2]"
    )


def sse(*events) -> str:
    return "".join(
        f"id: {i}\nevent: {name}\ndata: {json.dumps(data)}\n\n"
        for i, (name, data) in enumerate(events)
    )


def test_wait_prints_the_live_log_and_exits_with_the_jobs_status(api, capsys):
    api.routes[("GET", "/api/v1/jobs/job-1/events/?timeout=30")] = (200, sse(
        ("state", {"to": "running", "at": "2026-12-01T23:00:00Z"}),
        ("log", {"line": "epoch 1/2 loss=1.0"}),
        ("state", {"to": "failed", "at": "2026-12-01T23:00:01Z", "reason": "exit 7"}),
        ("end", {"state": "failed"}),
    ))  # fmt: skip
    api.routes[("GET", "/api/v1/jobs/job-1/")] = (200, dict(JOB, state="failed", exit_code=7))
    assert run("submit", "--wait", "--", "python", "train.py") == 7
    out = capsys.readouterr().out
    assert (
        "] running" in out
        and "  | epoch 1/2 loss=1.0" in out
        and out.strip().endswith("job-1 failed exit=7")
    )
    api.routes[("GET", "/api/v1/jobs/job-1/")] = (200, dict(JOB, state="cancelled", exit_code=None))
    assert run("wait", "job-1", "-q") == 1


def test_secrets_list_set_and_delete(api, tmp_path, capsys, monkeypatch):
    api.routes[("GET", "/api/v1/secrets/")] = (200, {"count": 1, "next": None, "results": [
        {"name": "HF_TOKEN", "created_at": "2026-12-01T22:00:00Z", "updated_at": "2026-12-01T22:30:00Z"}]})  # fmt: skip
    assert run("secrets", "list") == 0
    assert capsys.readouterr().out.split() == ["HF_TOKEN", "updated", "2026-12-01T22:30:00Z"]

    api.routes[("PUT", "/api/v1/secrets/HF_TOKEN/")] = (200, {"name": "HF_TOKEN"})
    assert run("secrets", "set", "HF_TOKEN", stdin="hf_abc\n", monkeypatch=monkeypatch) == 0
    assert api.sent("PUT")[-1].json() == {"value": "hf_abc"}
    assert capsys.readouterr().out.strip() == "secret HF_TOKEN set"

    # A new name: PUT says 404, so it is created with POST.
    api.routes[("POST", "/api/v1/secrets/")] = (201, {"name": "NEW"})
    key = tmp_path / "key.pem"
    key.write_text("line1\nline2\n")
    assert run("secrets", "set", "NEW", "--from-file", str(key)) == 0
    assert api.sent("POST", "/api/v1/secrets/")[-1].json() == {
        "name": "NEW",
        "value": "line1\nline2\n",
    }
    assert "line1" not in capsys.readouterr().out  # never echoed

    api.routes[("DELETE", "/api/v1/secrets/NEW/")] = (204, b"")
    assert run("secrets", "delete", "NEW") == 0 and api.sent("DELETE")
    api.routes[("PUT", "/api/v1/secrets/X/")] = (
        403,
        {"detail": "You do not have permission to perform this action."},
    )
    assert run("secrets", "set", "X", stdin="v", monkeypatch=monkeypatch) == 3
    assert "403" in capsys.readouterr().err
    assert run("secrets", "set", "X", stdin="", monkeypatch=monkeypatch) == 2

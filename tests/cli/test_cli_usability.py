"""What a new user trips over at the command line (issue 31, "The client"), against the fake API
(tests/cli/fake_api.py): help on every option, hints for usage mistakes, the list's and show's
columns, names, errors printed once, Ctrl-C, an empty log, the order of the last lines, and an
array's results. tests/cli/test_cli_live.py runs the same command against a live platform."""

import json
import os
import subprocess
import sys
import time

import pytest

from gpuplatform import _client_path  # noqa: F401
from gpuplatform_client import __version__, cli
from gpuplatform_client.api import Client
from tests.cli.fake_api import FakeApi
from tests.cli.test_client_unit import ARRAY, JOB, run, sse, submitted
from tests.e2e.platform import ROOT

RAN = dict(JOB, id="job-1", state="succeeded", gpus=2, nodes=2, gpu_sku="H100-80GB", progress=1,
           created_at="2026-12-01T22:58:00Z", started_at="2026-12-01T23:00:00Z",
           finished_at="2026-12-01T23:03:20Z", exit_code=0,
           attempts=[{"number": 1, "state": "succeeded", "exit_code": 0,
                      "placements": [{"node": "a1", "gpu_indices": [0, 1]},
                                     {"node": "a2", "gpu_indices": [0, 1]}]}])  # fmt: skip


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    fake = FakeApi()
    monkeypatch.setenv("GPUPLATFORM_URL", fake.url)
    monkeypatch.setenv("GPUPLATFORM_TOKEN", "tok")
    fake.routes[("POST", "/api/v1/jobs/")] = (201, JOB)
    yield fake
    fake.stop()
    monkeypatch.undo()
    time.tzset()


def usage_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


# --- help and discovery ---------------------------------------------------------------------------


def test_every_option_and_argument_has_help():
    top = cli.parser()
    missing = [
        f"{name}: {action.option_strings or action.dest}"
        for name, parser in [("gpuplatform", top), *top.commands.items()]
        for action in parser._actions  # argparse lists them nowhere public
        if not action.help
    ]
    assert missing == []


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert (
        exited.value.code == 0 and capsys.readouterr().out.strip() == f"gpuplatform {__version__}"
    )


def test_a_mistyped_option_gets_a_hint_and_the_commands_own_usage(api, capsys):
    err = usage_error(capsys, "submit", "--gpsu", "2", "--", "python", "train.py")
    assert "unknown option --gpsu; did you mean --gpus?" in err
    assert err.startswith("usage: gpuplatform submit") and not api.requests
    err = usage_error(capsys, "list", "--stat", "queued")
    assert err.startswith("usage: gpuplatform list") and "did you mean --state?" in err


def test_a_command_without_the_double_dash_gets_a_hint(api, capsys):
    err = usage_error(capsys, "submit", "--gpus", "1", "python", "train.py")
    assert "the job's command goes after `--`" in err and "-- python train.py" in err
    assert err.startswith("usage: gpuplatform submit") and not api.requests


def test_a_shortened_option_is_not_taken_for_a_longer_one(api, capsys):
    err = usage_error(capsys, "submit", "--gpu", "2", "--", "python", "train.py")
    assert "did you mean --gpus?" in err and not api.requests


def test_a_bad_state_lists_the_valid_ones(api, capsys):
    err = usage_error(capsys, "list", "--state", "runing")
    for state in (
        "queued",
        "starting",
        "running",
        "preempting",
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert state in err
    assert "did you mean 'running'?" in err and not api.requests
    assert "did you mean 'list'?" in usage_error(capsys, "lsit")


def test_templates_and_nodes(api, capsys):
    api.routes[("GET", "/api/v1/templates/")] = (200, [
        {"name": "demo-train", "description": "A checkpointing training loop.",
         "params": {"steps": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 10}}},
    ])  # fmt: skip
    assert run("templates") == 0
    out = capsys.readouterr().out
    assert "demo-train" in out and "A checkpointing training loop." in out
    assert "steps=10 (integer 1..100000)" in out
    api.routes[("GET", "/api/v1/capacity/")] = (200, {"skus": [
        {"sku": "H100-80GB", "nodes": 2, "gpus": 16, "free": 11, "most_free_on_one_node": 8,
         "unavailable_nodes": 1},
    ]})  # fmt: skip
    assert run("nodes") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert "FREE" in header and row.split() == ["H100-80GB", "2", "16", "11", "8", "1"]


# --- list and show --------------------------------------------------------------------------------


def test_list_shows_submitted_started_duration_gpus_and_node(api, capsys):
    api.routes[("GET", "/api/v1/jobs/")] = (200, {"count": 1, "next": None, "results": [RAN]})
    assert run("list") == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "STATE", "PROG", "TIER", "GPUS", "SUBMITTED", "STARTED",
                              "DURATION", "NODE", "NAME"]  # fmt: skip
    assert row.split() == ["job-1", "succeeded", "100%", "pro", "2x2", "12-01", "22:58", "12-01",
                           "23:00", "3m20s", "a1+1", "train"]  # fmt: skip


def test_show_says_when_how_long_and_where(api, capsys):
    api.routes[("GET", "/api/v1/jobs/job-1/")] = (200, RAN)
    assert run("show", "job-1") == 0
    out = capsys.readouterr().out
    assert "submitted 2026-12-01 22:58:00  started 2026-12-01 23:00:00" in out
    assert "finished 2026-12-01 23:03:20  duration 3m20s" in out
    assert "gpus 2 x 2 nodes  sku H100-80GB" in out and "node a1, a2" in out


@pytest.mark.parametrize("argv, name", [
    (["--", "python", "src/train.py", "--lr", "3"], "train"),
    (["--", "torchrun", "--nproc_per_node", "2", "train.py"], "train"),
    (["--", "python3", "-m", "pkg.main"], "pkg.main"),
    (["--", "python", "-c", "print(1)"], "proj"),
    (["--name", "mine", "--", "python", "train.py"], "mine"),
])  # fmt: skip
def test_a_command_jobs_name_is_its_script_or_its_workdir(api, tmp_path, argv, name):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print(1)\n")
    api.routes[("POST", "/api/v1/bundles/")] = (201, None)
    assert run("submit", "-w", str(tmp_path / "proj"), *argv) == 0
    assert submitted(api)["name"] == name


def test_list_into_a_closed_pipe_ends_quietly(api):
    many = [dict(RAN, id=f"job-{i:05d}") for i in range(3000)]
    api.routes[("GET", "/api/v1/jobs/")] = (200, {"count": 3000, "next": None, "results": many})
    env = dict(os.environ, GPUPLATFORM_URL=api.url, GPUPLATFORM_TOKEN="tok")
    process = subprocess.Popen([sys.executable, "-m", "gpuplatform.cli", "list"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout.readline()  # `| head -1`
    process.stdout.close()
    err = process.stderr.read().decode()
    process.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_each_api_error_is_printed_once(api, capsys):
    api.routes[("POST", "/api/v1/jobs/")] = (400, {"gpus": ["must be at most 8"]})
    assert run("submit", "--gpus", "9", "--", "python", "train.py") == 3
    err = capsys.readouterr().err
    assert err.count("must be at most 8") == 1 and "{" not in err
    assert err.splitlines() == [
        "gpuplatform: the API answered 400:",
        "gpuplatform:   gpus: must be at most 8",
    ]
    assert run("show", "nope") == 3
    assert capsys.readouterr().err.strip() == "gpuplatform: the API answered 404: Not found."


# --- waiting and logs -----------------------------------------------------------------------------


def test_ctrl_c_while_waiting_says_the_job_goes_on(api, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "wait", interrupted)
    assert run("submit", "--wait", "--", "python", "train.py") == 130
    err = capsys.readouterr().err
    assert "the job goes on" in err and "gpuplatform wait job-1" in err


def test_logs_of_a_queued_job_say_it_is_queued(api, capsys):
    api.routes[("GET", "/api/v1/jobs/job-1/logs/")] = (200, "")
    api.routes[("GET", "/api/v1/jobs/job-1/")] = (200, dict(JOB, reason="waiting for 2 GPUs"))
    assert run("logs", "job-1") == 0
    err = capsys.readouterr().err
    assert "job job-1 is queued (waiting for 2 GPUs): no output yet" in err


def test_the_final_state_comes_after_the_last_log_lines(api, capsys):
    api.routes[("GET", "/api/v1/jobs/job-1/events/?timeout=30")] = (200, sse(
        ("state", {"to": "running", "at": "2026-12-01T23:00:00Z"}),
        ("log", {"line": "step 1"}),
        ("state", {"to": "succeeded", "at": "2026-12-01T23:00:02Z"}),
        ("log", {"line": "step 2 (the last)"}),
        ("end", {"state": "succeeded"}),
    ))  # fmt: skip
    api.routes[("GET", "/api/v1/jobs/job-1/")] = (200, RAN)
    assert run("wait", "job-1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[23:00:00] running", "  | step 1", "  | step 2 (the last)",
                     "[23:00:02] succeeded", "job-1 succeeded exit=0"]  # fmt: skip


def test_artifacts_of_an_array_gives_each_tasks_results(api, capsys, tmp_path):
    tasks = [dict(RAN, id="t0", array="arr-1", array_index=0),
             dict(JOB, id=None, array="arr-1", array_index=1, state="cancelled")]  # fmt: skip
    api.routes[("GET", "/api/v1/arrays/arr-1/")] = (200, ARRAY)
    api.routes[("GET", "/api/v1/jobs/?page=1&array=arr-1&page_size=1000")] = (
        200, {"count": 2, "next": None, "results": tasks},
    )  # fmt: skip
    api.routes[("GET", "/api/v1/jobs/t0/artifacts/")] = (200, [{"name": "result.json", "size": 2}])
    api.routes[("GET", "/api/v1/jobs/t0/artifacts/result.json")] = (200, b"{}")
    assert run("artifacts", "arr-1") == 0
    assert capsys.readouterr().out.splitlines() == [
        "[0] t0 succeeded", "           2  result.json", "[1] (never made) cancelled", "  (no results)",
    ]  # fmt: skip
    assert run("artifacts", "arr-1", "--download", str(tmp_path)) == 0
    assert (tmp_path / "0" / "result.json").read_bytes() == b"{}"
    capsys.readouterr()
    assert run("--json", "artifacts", "arr-1") == 0
    assert json.loads(capsys.readouterr().out)["0"]["artifacts"][0]["name"] == "result.json"


def test_wait_follows_an_array_too(api, capsys):
    api.routes[("GET", "/api/v1/arrays/arr-1/")] = (
        200, dict(ARRAY, counts={"succeeded": 4}, state="ended"),
    )  # fmt: skip
    assert run("wait", "arr-1") == 0
    assert "4/4 done" in capsys.readouterr().out


def test_depends_on_a_prefix_sends_the_whole_id(api):
    whole = "1a2b3c4d-0000-4000-8000-000000000001"
    api.routes[("GET", "/api/v1/jobs/1a2b3c4d/")] = (200, dict(JOB, id=whole))
    assert run("submit", "--depends-on", "1a2b3c4d", "--", "python", "train.py") == 0
    assert submitted(api)["depends_on"] == [{"job": whole, "condition": "afterok"}]

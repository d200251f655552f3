"""A member's argv and environment (workers/jobenv.py), through the runner's real processes,
unfenced and fenced: `python` is a Python 3 in every job, and the launcher variables."""

import json

from tests.unit.test_runner import Work, run_until_finished, runner  # noqa: F401 (the fixture)

REPORT_ENV = (
    "import json, os, sys; from gpuplatform_job import output_dir; "
    "(output_dir() / 'env.json').write_text(json.dumps({'version': sys.version_info[0], "
    "**{n: os.environ.get(n) for n in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'NODE_RANK', "
    "'NNODES', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')}}))"
)


def reported(runner) -> dict:  # noqa: F811
    artifact = next(e for e in runner.reporter.events if e[0] == "artifact")
    return json.loads(artifact[2])


def test_python_runs_a_python_3_in_a_job_without_an_environment(runner):  # noqa: F811
    """No `python.requirements`: PATH has only the system's dirs, where Debian has no `python`."""
    runner.launch(Work(argv=["python", "-c", REPORT_ENV]))
    assert run_until_finished(runner) == ("finished", 0, "")
    assert reported(runner)["version"] == 3


def test_a_gang_member_gets_the_launcher_variables_of_a_node_of_its_own(runner):  # noqa: F811
    member = Work(argv=["{python}", "-c", REPORT_ENV], rank=1, world_size=3, master_port=29611)
    runner.launch(member)
    assert run_until_finished(runner) == ("finished", 0, "")
    seen = reported(runner)
    assert {k: seen[k] for k in ("RANK", "WORLD_SIZE", "NODE_RANK", "NNODES")} == {
        "RANK": "1", "WORLD_SIZE": "3", "NODE_RANK": "1", "NNODES": "3",
    }  # fmt: skip
    assert (seen["LOCAL_RANK"], seen["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert seen["MASTER_ADDR"] == "127.0.0.1"

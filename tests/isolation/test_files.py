"""What a job writes is read back without trusting it: links in its dirs never lead the agent
to a file that is not the job's."""

import os

from tests.isolation.conftest import finish, launch, log_of, report


def test_a_symlinked_or_hard_linked_artifact_does_not_come_back(runner, tmp_path):
    secret = tmp_path / "agent" / "credential"
    secret.write_text("node credential")
    secret.chmod(0o644)
    code = report(
        "from gpuplatform_job import output_dir\n"
        "out = output_dir()\n"
        "(out / 'real.txt').write_text('mine')\n"
        f"os.symlink({str(secret)!r}, out / 'link-to-secret')\n"
        "os.symlink('/etc/passwd', out / 'passwd')\n"
        "(out / 'twice.txt').write_text('two names')\n"
        "os.link(out / 'twice.txt', out / 'twice-again.txt')\n"
        "try:\n"
        f"    os.link({str(secret)!r}, out / 'hard-secret')\n"
        "    result['hard'] = 'linked'\n"
        "except OSError as error:\n"
        "    result['hard'] = type(error).__name__\n"
        "os.mkfifo(out / 'fifo')\n"
    )
    key = launch(runner, code)
    assert finish(runner, key)[1:] == (0, "")
    artifacts = {e[1]: e[2] for e in runner.reporter.events if e[0] == "artifact"}
    assert artifacts == {
        "real.txt": "mine"
    }  # no link of either kind, no FIFO, nothing of the agent's


def test_the_log_is_the_agents_file_whatever_the_job_does_to_its_work_dir(runner, tmp_path):
    database = tmp_path / "agent" / "db.sqlite3"
    database.write_text("every user's API token")
    code = (
        "import os\n"
        f"os.symlink({str(database)!r}, 'job.log')\n"  # yesterday's attack: the log re-read by name
        "print('my own output', flush=True)\n"
    )
    key = launch(runner, code)
    assert finish(runner, key)[1:] == (0, "")
    run_log = runner.data_dir / "logs" / "job-1" / "attempt-1-rank-0.log"
    assert not run_log.is_symlink() and run_log.stat().st_uid == os.geteuid()
    assert "my own output" in log_of(runner, key) and "API token" not in log_of(runner, key)


def test_progress_and_checkpoint_files_that_are_links_are_ignored(runner, tmp_path):
    fake = tmp_path / "agent" / "fake-progress.json"
    fake.write_text('{"progress": 0.99, "path": "/etc/shadow"}')
    fake.chmod(0o644)
    code = (
        "import os, pathlib\n"
        f"os.symlink({str(fake)!r}, os.environ['GPUPLATFORM_PROGRESS_FILE'])\n"
        f"os.symlink({str(fake)!r}, os.environ['GPUPLATFORM_CHECKPOINT_FILE'])\n"
    )
    key = launch(runner, code)
    finished = finish(runner, key)
    assert finished[1:] == (0, "")
    assert not [e for e in runner.reporter.events if e[0] == "progress"]

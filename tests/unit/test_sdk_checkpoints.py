"""The job SDK's checkpoints (workers/sdk/gpuplatform_job): JSON, any bytes and a directory per
rank, each saved atomically and marked for the runner to store, then handed back to the next
attempt in a fresh checkpoint dir (another node's: only the stored file travels)."""

import io
import json
import pathlib
import shutil
import sys
import tarfile

import pytest

from tests.unit.test_runner import Recorder, Work, run_until_finished, runner  # noqa: F401
from workers.sdk import gpuplatform_job as job

sys.modules.setdefault("gpuplatform_job", job)


@pytest.fixture
def attempt(tmp_path, monkeypatch):
    """Start "attempt N" of a job: its own checkpoint dir and control dir, resuming from what
    the last attempt marked (copied as the agent downloads it onto the next node)."""

    def start(number: int, resume: pathlib.Path | None = None) -> pathlib.Path:
        root = tmp_path / f"node-{number}"
        (root / "control").mkdir(parents=True)
        monkeypatch.setenv("GPUPLATFORM_CHECKPOINT_DIR", str(root / "checkpoints"))
        monkeypatch.setenv("GPUPLATFORM_CHECKPOINT_FILE", str(root / "control" / "checkpoint.json"))
        monkeypatch.setenv("GPUPLATFORM_ATTEMPT", str(number))
        if resume is None:
            monkeypatch.delenv("GPUPLATFORM_RESUME_FROM", raising=False)
        else:
            (root / "checkpoints").mkdir()
            fetched = root / "checkpoints" / resume.name
            shutil.copyfile(resume, fetched)
            monkeypatch.setenv("GPUPLATFORM_RESUME_FROM", str(fetched))
        return root

    return start


def marked(root: pathlib.Path) -> pathlib.Path:
    """The file the runner would store: the SDK's marker names it."""
    return pathlib.Path(json.loads((root / "control" / "checkpoint.json").read_text())["path"])


def test_any_bytes_round_trip_and_are_not_taken_for_json_state(attempt):
    first = attempt(1)
    assert job.resume_path() is None and job.resume_from() is None and job.resume_dir() is None
    blob = bytes(range(256)) * 40
    with job.checkpoint_file("model.pt") as handle:
        handle.write(blob)
    assert marked(first).name == "model.pt" and marked(first).read_bytes() == blob
    assert not [p for p in marked(first).parent.iterdir() if p.name.startswith(".")]  # no temp left

    attempt(2, resume=marked(first))
    assert job.resume_path().read_bytes() == blob
    assert job.resume_from() is None  # bytes, not JSON state
    assert job.resume_dir() is None


def test_a_failed_save_keeps_the_last_checkpoint_whole(attempt):
    first = attempt(1)
    job.save_checkpoint_bytes(b"good", name="model.bin")
    with pytest.raises(RuntimeError), job.checkpoint_file("model.bin") as handle:
        handle.write(b"half")
        raise RuntimeError("killed half way")
    assert marked(first).read_bytes() == b"good"
    assert sorted(p.name for p in marked(first).parent.iterdir()) == ["model.bin"]


def test_a_directory_per_rank_round_trips_with_its_tree(attempt):
    first = attempt(1)
    with job.checkpoint_directory() as path:
        (path / "shards").mkdir()
        (path / "shards" / "rank-1.bin").write_bytes(b"\x00\x01" * 1000)
        (path / ".metadata").write_bytes(b"meta")
    assert marked(first).name == "checkpoint.dir.tar"
    assert [p.name for p in marked(first).parent.iterdir()] == ["checkpoint.dir.tar"]

    attempt(2, resume=marked(first))
    resumed = job.resume_dir()
    assert (resumed / "shards" / "rank-1.bin").read_bytes() == b"\x00\x01" * 1000
    assert (resumed / ".metadata").read_bytes() == b"meta"
    assert job.resume_from() is None
    assert job.resume_dir() == resumed  # again: unpacked anew, the same tree


def test_json_state_still_round_trips(attempt):
    first = attempt(1)
    job.save_checkpoint({"step": 12})
    attempt(2, resume=marked(first))
    assert job.resume_from() == {"step": 12}


def test_a_resumed_archive_cannot_write_outside_its_directory(attempt, tmp_path):
    evil = tmp_path / "evil.dir.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    attempt(1, resume=evil)
    with pytest.raises((tarfile.TarError, ValueError)):
        job.resume_dir()
    assert not list(tmp_path.rglob("escaped.txt"))


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", ".."])
def test_a_checkpoint_name_is_a_plain_file_name(attempt, name):
    attempt(1)
    with pytest.raises(ValueError), job.checkpoint_file(name):
        pass


def test_torch_save_and_load_through_a_checkpoint_file(attempt):
    torch = pytest.importorskip("torch", reason="torch is not installed here (pip install torch)")
    first = attempt(1)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    with job.checkpoint_file("model.pt") as handle:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3}, handle
        )

    attempt(2, resume=marked(first))
    state = torch.load(job.resume_path(), weights_only=True)
    again = torch.nn.Linear(4, 2)
    again.load_state_dict(state["model"])
    assert state["step"] == 3 and torch.equal(again.weight, model.weight)


class Storing(Recorder):
    def store_checkpoint(self, run, checkpoint):
        self.events.append(("stored", pathlib.Path(checkpoint).read_bytes()))


def test_a_rank_other_than_0_has_its_checkpoint_stored_as_it_saves_it(runner):  # noqa: F811
    """Not only at its end: a member lost with its node still has its last save stored."""
    runner.reporter = Storing()
    code = (
        "import time, gpuplatform_job as job\n"
        "job.save_checkpoint_bytes(b'one', name='shard.bin'); time.sleep(1.0)\n"
        "job.save_checkpoint_bytes(b'two', name='shard.bin'); time.sleep(1.0)\n"
    )
    runner.launch(Work(argv=["{python}", "-c", code], rank=1, world_size=2))
    assert run_until_finished(runner)[1:] == (0, "")
    events = runner.reporter.events
    stored = [e[1] for e in events if e[0] == "stored"]
    assert stored[-1] == b"two" and set(stored) <= {b"one", b"two"}  # each save, once seen
    assert events.index(("stored", b"two")) < events.index(run_until_finished(runner))

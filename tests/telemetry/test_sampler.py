"""The agent's GPU sampler (workers/telemetry.py) with --fake GPUs: a GPU's utilisation is its
job's CPU use and its memory the job's resident memory, attributed to the member holding it;
samples wait for the heartbeat (and go again after a failed one); an injected XID marks a GPU
unhealthy for good."""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from apps.platform.agent_protocol import Assignment
from workers.gpus import fake_gpus
from workers.runner import Run
from workers.telemetry import Sampler

BUSY = "x = bytearray(64 << 20)\nwhile True: pass"
SLEEPY = "import time\nx = bytearray(32 << 20)\ntime.sleep(120)"


class Runner:
    def __init__(self):
        self.lock = threading.RLock()
        self.runs = {}


def assignment(attempt_id: int, gpus: list[int], rank: int = 0) -> Assignment:
    return Assignment(job_id="j", attempt_id=attempt_id, attempt_number=1, rank=rank, token="t",
                      argv=[], params={}, gpu_indices=gpus, world_size=1, master_addr="",
                      master_port=0, max_runtime_seconds=60, checkpoint="", stop_requested="",
                      active=True)  # fmt: skip


@pytest.fixture
def runner():
    runner, processes = Runner(), []

    def run(attempt_id: int, gpus: list[int], code: str) -> None:
        process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        processes.append(process)
        work = Run(assignment=assignment(attempt_id, gpus), workdir=pathlib.Path("."),
                   log_path=pathlib.Path("."), process=process)  # fmt: skip
        runner.runs[work.key] = work

    runner.run = run
    yield runner
    for process in processes:
        process.kill()
        process.wait()


def test_a_busy_job_reads_busy_a_sleeping_one_idle_each_on_its_own_gpus(runner):
    runner.run(11, [0, 1], BUSY)
    runner.run(12, [2], SLEEPY)
    sampler = Sampler(runner, gpus=fake_gpus("n1", 4), nvml=None, interval=1.0)
    time.sleep(1.0)  # both have started and allocated their memory
    assert sampler.sample() == []  # the first reading is the baseline of CPU time
    time.sleep(1.5)
    samples = {s["index"]: s for s in sampler.sample()}
    assert set(samples) == {0, 1, 2}  # GPU 3 is nobody's: no sample
    assert samples[0]["attempt_id"] == samples[1]["attempt_id"] == 11
    assert samples[2]["attempt_id"] == 12 and samples[2]["rank"] == 0
    assert samples[0]["util"] > 10 and samples[1]["util"] > 10  # generous: 2 loaded cores
    assert samples[2]["util"] < 5
    assert samples[0]["memory_mib"] >= 64 and 32 <= samples[2]["memory_mib"] < 64 + 32
    assert 0 < samples[0]["seconds"] <= 3.0
    gpus, queued = sampler.take()
    assert queued == list(samples.values()) or sorted(queued, key=lambda s: s["index"]) == [
        samples[i] for i in (0, 1, 2)
    ]
    assert {g.index for g in gpus} == {0, 1, 2, 3}  # readings changed since registering
    assert sampler.take() == ([], [])  # nothing new until the next sample
    sampler.put_back(gpus, queued)  # the heartbeat failed: all of it goes with the next one
    again_gpus, again = sampler.take()
    assert again == queued and {g.index for g in again_gpus} == {0, 1, 2, 3}


def test_an_injected_xid_marks_the_gpu_unhealthy_and_its_samples_say_so(runner, tmp_path):
    runner.run(21, [1], SLEEPY)
    errors = tmp_path / "fake-gpu-errors"
    sampler = Sampler(runner, gpus=fake_gpus("n1", 2), nvml=None, interval=0.5, errors_file=errors)
    sampler.sample()
    errors.write_text("1 xid 79\n")
    time.sleep(0.3)
    (sample,) = sampler.sample()
    assert sample["health"] == "xid 79"
    gpus = {g.index: g for g in sampler.take()[0]}
    assert gpus[1].healthy is False and gpus[0].healthy is True
    errors.unlink()
    sampler.sample()
    assert {g.index: g.healthy for g in sampler.current.values()}[1] is False  # sticky


class FakeNvml:
    """What the sampler uses of pynvml, for two GPUs: GPU 1 has an uncorrected ECC error, and
    a critical XID 79 arrives for GPU 0."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.events = [type("Event", (), {"device": 0, "eventData": 79})()]

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_500  # mW

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        return 2 if handle == 1 else 0

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set):
        pass

    def nvmlEventSetWait(self, event_set, timeout_ms):
        if not self.events:
            raise self.NVMLError("timeout")
        return self.events.pop()

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}".encode()


class Wrapper:
    def __init__(self):
        self.nv = FakeNvml()

    def gpus(self, limit=None):
        from apps.platform.agent_protocol import GpuInfo

        return [GpuInfo(index=index, uuid=f"GPU-{index}", memory_mib=81920,
                        utilization_percent=97, memory_used_mib=5000) for index in range(limit)]  # fmt: skip


def test_with_nvml_samples_carry_power_and_temperature_and_xid_or_ecc_mark_a_gpu_unhealthy(
    runner,
):
    from apps.platform.agent_protocol import GpuInfo

    runner.run(31, [0, 1], SLEEPY)
    inventory = [GpuInfo(index=i, uuid=f"GPU-{i}", memory_mib=81920) for i in (0, 1)]
    sampler = Sampler(runner, gpus=inventory, nvml=Wrapper(), interval=10)
    samples = {s["index"]: s for s in sampler.sample()}
    assert samples[0]["util"] == 97 and samples[0]["memory_mib"] == 5000
    assert samples[0]["power_w"] == 312.5 and samples[0]["temperature_c"] == 61
    assert samples[0]["health"] == "xid 79" and samples[1]["health"] == "ecc 2"
    assert not any(g.healthy for g in sampler.take()[0])


def test_the_heartbeat_carries_the_samples_and_a_failed_one_carries_them_again(tmp_path, runner):
    import argparse

    from workers.agent import Agent, Config
    from workers.agent_client import ApiError

    config = Config(url="http://testserver", credential="gpn_unused.unused", data_dir=tmp_path)
    agent = Agent(argparse.Namespace(node="n1", sku="H100-80GB", gpus=2, fake=True, labels={},
                                     concurrency=1), config=config)  # fmt: skip
    sent, fail = [], [True]

    class Api:
        timeout = 5.0

        def heartbeat(self, **body):
            if fail[0]:
                raise ApiError("connection refused")
            sent.append(body)
            return {}

    agent.api = Api()
    agent.platform = {"gpu_sample_seconds": 0.2}
    agent.start_telemetry(fake_gpus("n1", 2))
    agent.telemetry.stop()  # sampled by hand below
    agent.telemetry.runner = runner
    runner.run(41, [1], SLEEPY)
    agent.telemetry.sample()
    time.sleep(0.3)
    (taken,) = agent.telemetry.sample()
    with pytest.raises(ApiError):
        agent.heartbeat_once()
    fail[0] = False
    agent.heartbeat_once()
    assert sent[0]["samples"] == [taken]  # not lost with the failed heartbeat
    assert {g.index for g in sent[0]["gpus"]} == {0, 1}
    agent.heartbeat_once()
    assert sent[1]["samples"] == [] and sent[1]["gpus"] == []  # nothing new: nothing sent
    agent.runner.kill_all()


def test_a_sample_is_marked_active_when_the_members_sessions_carried_a_byte_meanwhile(runner):
    runner.run(21, [0], SLEEPY)
    quiet: dict[tuple[int, int], float] = {}
    sampler = Sampler(runner, gpus=fake_gpus("n1", 2), nvml=None, interval=1.0,
                      activity=quiet.get)  # fmt: skip
    time.sleep(0.5)
    sampler.sample()  # the baseline
    time.sleep(1.0)
    (untouched,) = sampler.sample()
    assert "active" not in untouched  # no session: nothing typed
    quiet[(21, 0)] = 0.2  # a keystroke 0.2 s ago
    time.sleep(1.0)
    (typed,) = sampler.sample()
    assert typed["active"] is True and typed["util"] < 5  # an idle GPU, but in use
    quiet[(21, 0)] = 30.0  # the last one long before this sample's second
    time.sleep(1.0)
    assert "active" not in sampler.sample()[0]


def test_a_member_whose_cgroup_gives_no_reading_is_read_from_its_session(runner, tmp_path):
    from types import SimpleNamespace

    runner.run(31, [0], BUSY)
    # A hybrid host's v2 group: there, but without the cpu and memory controllers' files.
    runner.runs[(31, 0)].cgroup = SimpleNamespace(v2=tmp_path)
    sampler = Sampler(runner, gpus=fake_gpus("n1", 1), nvml=None, interval=1.0)
    time.sleep(1.0)
    sampler.sample()
    time.sleep(1.0)
    (busy,) = sampler.sample()
    assert busy["util"] > 10 and busy["memory_mib"] >= 64


def test_the_session_table_finds_new_processes_at_its_next_pass(monkeypatch):
    from workers import telemetry

    spawns = ("import subprocess, sys, time\ntime.sleep(1)\n"
              "subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20)\\n"
              "import time\\ntime.sleep(60)'])\ntime.sleep(60)")  # fmt: skip
    leader = subprocess.Popen([sys.executable, "-c", spawns], start_new_session=True)
    try:
        table = telemetry.SessionTable()
        time.sleep(0.3)
        assert table.usage({leader.pid}, 0.0)[leader.pid].rss_bytes < 64 << 20
        time.sleep(2.0)  # its child (same session) holds 64 MiB now
        # Between passes only the processes found last time are read.
        assert table.usage({leader.pid}, 1.0)[leader.pid].rss_bytes < 64 << 20
        monkeypatch.setattr(telemetry, "RESCAN_SECONDS", 0.0)  # the next call passes over /proc
        assert table.usage({leader.pid}, 2.0)[leader.pid].rss_bytes >= 64 << 20
        assert len(table.pids[leader.pid]) == 2
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_the_agents_sessions_say_how_long_each_member_has_been_quiet():
    from types import SimpleNamespace

    from workers.sessions import Sessions

    sessions = Sessions(SimpleNamespace())
    assert sessions.quiet_for((7, 1)) is None  # no session yet
    sessions.touch((7, 1))  # a byte on rank 1's exec
    time.sleep(0.2)
    assert 0.2 <= sessions.quiet_for((7, 1)) < 5 and sessions.quiet_for((7, 0)) is None

"""Where the agent cannot fence (not root, no cgroups, or turned off), it says so: `detect()`
answers "none" with the reason, the agent warns loudly, and jobs run as today."""

import logging
import os

import pytest

from tests.unit.test_runner import Recorder, Work, py, run_until_finished
from workers import isolation
from workers.runner import Runner


def test_an_agent_that_is_not_root_cannot_fence(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    found = isolation.detect("n1")
    assert found.name == "none" and not found.jailed and "not root" in found.reason


def test_the_operator_can_turn_fencing_off(monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "none")
    assert isolation.detect("n1").name == "none"


def test_a_machine_without_cgroups_cannot_fence(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolation, "find_cgroups", lambda node: None)
    assert isolation.detect("n1").reason == "no cgroups the agent may create"


def test_an_unfenced_agent_warns_loudly_and_runs_jobs_as_itself(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.isolation"):
        runner = Runner(node="n1", data_dir=tmp_path, reporter=Recorder(), kill_grace=1.0,
                        isolation=isolation.unfenced("the agent is not root"))  # fmt: skip
    assert "RUNS JOBS UNFENCED (isolation: none): the agent is not root" in caplog.text
    assert runner.isolation.name == "none"
    code = "import os; from gpuplatform_job import output_dir; (output_dir() / 'uid').write_text(str(os.getuid()))"
    runner.launch(Work(argv=py(code)))
    assert run_until_finished(runner) == ("finished", 0, "")
    assert ("artifact", "uid", str(os.getuid())) in runner.reporter.events
    assert (tmp_path).stat().st_mode & 0o777 == 0o700  # its data dir is its own all the same


def test_uid_leases_are_host_wide_and_a_restarted_node_takes_its_own_back(tmp_path):
    one = isolation.UidPool(base=5000, count=3, lease_dir=tmp_path / "uids")
    other = isolation.UidPool(
        base=5000, count=3, lease_dir=tmp_path / "uids"
    )  # another agent, same host
    a = one.lease(node="n1", member="1-0")
    b = other.lease(node="n2", member="2-0")
    c = one.lease(node="n1", member="3-0")
    assert len({a, b, c}) == 3
    assert (
        one.release_node("n1", keep={c}) == 1
    )  # what n1's dead agent left, not n2's, not a live one
    assert one.lease(node="n1", member="4-0") == a


def test_a_released_uid_rests_while_others_are_free(tmp_path):
    pool = isolation.UidPool(base=5000, count=3, lease_dir=tmp_path / "uids")
    first = pool.lease(node="n1", member="1-0")
    pool.release(first)
    assert pool.lease(node="n1", member="2-0") == first + 1
    assert pool.lease(node="n1", member="3-0") == first + 2
    assert pool.lease(node="n1", member="4-0") == first  # round the range, to the one free


# --- GPUPLATFORM_ISOLATION=strict: every limit, or no agent --------------------------------------


def _fenced(monkeypatch, tmp_path, *, pure_v2: bool, controllers=(), v1=()):
    """detect() as root, with the cgroups find_cgroups would give and uid leases in tmp_path."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("GPUPLATFORM_JOB_UID_LEASE_DIR", str(tmp_path / "uids"))
    cgroups = isolation.Cgroups(v2_base=tmp_path / "v2", v1_bases={name: tmp_path / name for name in v1},
                                pure_v2=pure_v2, v2_controllers=tuple(controllers))  # fmt: skip
    monkeypatch.setattr(isolation, "find_cgroups", lambda node: cgroups)


def test_strict_refuses_an_agent_that_cannot_fence(monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "strict")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(isolation.FenceRefused, match="unfenced .the agent is not root"):
        isolation.detect("n1")


def test_strict_refuses_a_fence_without_a_pids_limit(monkeypatch, tmp_path):
    """The device machine of 2026-12-04: cgroup v2 offered memory alone. `auto` fences there
    without a pids limit (a fork bomb fills the node's pid space); `strict` refuses to start."""
    _fenced(monkeypatch, tmp_path, pure_v2=True, controllers=("memory",))
    assert isolation.detect("n1").jailed  # auto: fenced, without the missing limits
    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "strict")
    with pytest.raises(
        isolation.FenceRefused, match="no pids/cpu controller .*pids.max/cpu.weight"
    ):
        isolation.detect("n1")


def test_strict_takes_a_fence_with_every_limit(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "strict")
    _fenced(monkeypatch, tmp_path, pure_v2=True, controllers=("memory", "pids", "cpu"))
    assert isolation.detect("n1").jailed
    _fenced(
        monkeypatch, tmp_path, pure_v2=False, v1=("memory", "pids", "cpu", "devices", "freezer")
    )
    assert isolation.detect("n1").jailed
    _fenced(monkeypatch, tmp_path, pure_v2=False, v1=("memory", "pids", "devices", "freezer"))
    with pytest.raises(isolation.FenceRefused, match="no cpu controller"):
        isolation.detect("n1")


def test_a_refused_agent_exits_2_naming_what_is_missing(monkeypatch, tmp_path, capsys):
    from workers import agent

    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "strict")
    monkeypatch.setenv("GPUPLATFORM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPUPLATFORM_NODE_CREDENTIAL", "gpn_x.y")
    monkeypatch.setenv("GPUPLATFORM_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert agent.main(["--node", "n1", "--sku", "H100-80GB", "--gpus", "1", "--fake"]) == 2
    assert "GPUPLATFORM_ISOLATION=strict" in capsys.readouterr().err


def test_the_isolation_setting_names_its_choices(monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_ISOLATION", "paranoid")
    with pytest.raises(ValueError, match="'auto', 'strict' or 'none'"):
        isolation.Settings.from_env()


def test_the_nodes_own_cgroups_go_with_a_clean_stop_on_this_kernel():
    """Real cgroups (root): what find_cgroups made for a node, remove_bases takes away."""
    node = f"iso-bases-{os.getpid()}"
    found = isolation.detect(node)
    if not found.jailed or found.cgroups is None:
        pytest.skip(f"this machine cannot fence jobs ({found.reason}): needs root and cgroups")
    cgroups = found.cgroups
    bases = ([cgroups.v2_base] if cgroups.v2_base else []) + list(cgroups.v1_bases.values())
    assert bases and all(base.is_dir() for base in bases)
    assert cgroups.remove_bases() == len(bases)
    assert not any(base.exists() for base in bases)

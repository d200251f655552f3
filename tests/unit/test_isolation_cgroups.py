"""The cgroup files a member's limits are written to, on pure cgroup v2 and on a hybrid host
(plain dirs stand in for cgroupfs: the names and values are what is checked here; the attack
tests in tests/isolation check that the kernel enforces them)."""

import pathlib

from workers.isolation import (
    Cgroups,
    Limits,
    Settings,
    _delegate_v2,
    _mounts,
    _under,
    favors_dynmods,
)


def fake_v2(tmp_path) -> pathlib.Path:
    base = tmp_path / "v2" / "gpuplatform" / "n1"
    base.mkdir(parents=True)
    return base


def test_pure_v2_writes_memory_max_pids_max_and_cpu_weight_in_one_group(tmp_path):
    cgroups = Cgroups(v2_base=fake_v2(tmp_path), v1_bases={}, pure_v2=True)
    group = cgroups.create(
        "7-0", Limits(memory_mib=512, pids_max=64, cpu_weight=300), deny_devices=[(195, 1)]
    )
    assert (group.v2 / "memory.max").read_text() == str(512 * 2**20)
    assert (group.v2 / "pids.max").read_text() == "64"
    assert (group.v2 / "cpu.weight").read_text() == "300"
    assert not (
        group.v2 / "devices.deny"
    ).exists()  # v2 has no devices file: the namespace hides them
    assert group.procs_files == [str(group.v2 / "cgroup.procs")]


def test_pure_v2_writes_no_limit_whose_controller_the_kernel_lacks(tmp_path):
    # Seen on a GPU machine (Firecracker, kernel 6.18): the agent's group was handed memory
    # alone (no pids, no cpu); its jobs still fence.
    cgroups = Cgroups(v2_base=fake_v2(tmp_path), v1_bases={}, pure_v2=True,
                      v2_controllers=("memory", "pids"))  # fmt: skip
    group = cgroups.create(
        "7-0", Limits(memory_mib=512, pids_max=64, cpu_weight=300), deny_devices=[]
    )
    assert (group.v2 / "memory.max").read_text() == str(512 * 2**20)
    assert (group.v2 / "pids.max").read_text() == "64"
    assert not (group.v2 / "cpu.weight").exists()


def test_delegation_asks_only_for_the_controllers_the_kernel_offers(tmp_path, caplog):
    own = tmp_path / "agent.scope"
    own.mkdir()
    (own / "cgroup.controllers").write_text("cpuset io memory pids\n")  # no cpu
    base, enabled = _delegate_v2(own, "n1")
    assert enabled == ("memory", "pids") and base == own / "gpuplatform" / "n1"
    for group in (own, own / "gpuplatform", base):
        assert (group / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert "no cpu controller" in caplog.text and "cpu.weight" in caplog.text

    bare = tmp_path / "bare.scope"
    bare.mkdir()
    (bare / "cgroup.controllers").write_text("\n")  # none at all: membership and kill only
    base, enabled = _delegate_v2(bare, "n1")
    assert enabled == () and base.is_dir() and not (bare / "cgroup.subtree_control").exists()


def test_hybrid_writes_v1_limits_and_denies_other_gpus(tmp_path):
    v1 = {}
    for controller in ("memory", "pids", "cpu", "devices", "freezer"):
        v1[controller] = tmp_path / controller / "gpuplatform" / "n1"
        v1[controller].mkdir(parents=True)
    cgroups = Cgroups(v2_base=fake_v2(tmp_path), v1_bases=v1, pure_v2=False)
    group = cgroups.create(
        "7-0", Limits(memory_mib=256, pids_max=32, cpu_weight=200), deny_devices=[(195, 0)]
    )
    assert (group.v1["memory"] / "memory.limit_in_bytes").read_text() == str(256 * 2**20)
    assert not (
        group.v1["memory"] / "memory.memsw.limit_in_bytes"
    ).exists()  # written only where the kernel has it
    assert (group.v1["pids"] / "pids.max").read_text() == "32"
    assert (group.v1["cpu"] / "cpu.shares").read_text() == "2048"
    assert (group.v1["devices"] / "devices.deny").read_text() == "c 195:0 rwm"
    assert len(group.procs_files) == 6  # the v2 group and every v1 one


def test_leftovers_are_the_groups_not_kept(tmp_path):
    base = fake_v2(tmp_path)
    for name in ("1-0", "2-0", "3-1"):
        (base / name).mkdir()
    cgroups = Cgroups(v2_base=base, v1_bases={}, pure_v2=True)
    assert [group.v2.name for group in cgroups.leftovers({"2-0"})] == ["1-0", "3-1"]


def test_a_members_limits_come_from_its_assignment_else_the_nodes_defaults(monkeypatch):
    monkeypatch.setenv("GPUPLATFORM_JOB_PIDS_MAX", "99")
    settings = Settings.from_env()

    class Asked:
        memory_mib, pids_max, cpu_weight = 1024, 0, 50000

    assert Limits.of(Asked(), settings) == Limits(memory_mib=1024, pids_max=99, cpu_weight=10000)
    assert Limits.of(object(), settings) == Limits(memory_mib=0, pids_max=99, cpu_weight=100)


def test_the_spare_launcher_is_on_unless_turned_off(monkeypatch):
    # On by default since the whole platform's start was measured shorter with it
    # (docs/bench/71-slurm-peer-notes.md, "h36start pass").
    monkeypatch.delenv("GPUPLATFORM_SPARE_LAUNCHER", raising=False)
    assert Settings.from_env().spare_launcher
    monkeypatch.setenv("GPUPLATFORM_SPARE_LAUNCHER", "0")
    assert not Settings.from_env().spare_launcher


def test_the_agents_own_group_is_found_under_each_mount():
    v2, v1 = _mounts()  # whatever this machine has; the paths must be real directories
    if v2 is not None:
        assert v2.is_dir()
    for mount, root in v1.values():
        assert mount.is_dir() and root.startswith("/")
    assert _under(pathlib.Path("/sys/fs/cgroup/memory"), "/", "/a/b") == pathlib.Path(
        "/sys/fs/cgroup/memory/a/b"
    )
    assert _under(pathlib.Path("/sys/fs/cgroup/memory"), "/a", "/a/b") == pathlib.Path(
        "/sys/fs/cgroup/memory/b"
    )


def test_the_agent_reads_whether_cgroup2_favors_dynamic_moves():
    hybrid = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    assert favors_dynmods(hybrid) is None  # no cgroup2 mount
    plain = hybrid + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    assert favors_dynmods(plain) is False
    assert favors_dynmods(plain.replace("rw,relatime 0", "rw,relatime,favordynmods 0")) is True
    assert favors_dynmods() in (True, False, None)  # this host's, whatever it is


def test_a_clean_stop_removes_the_nodes_empty_groups_and_keeps_one_a_job_is_in(tmp_path):
    base = fake_v2(tmp_path)
    v1 = {name: tmp_path / name / "gpuplatform" / "n1" for name in ("memory", "pids")}
    for path in v1.values():
        path.mkdir(parents=True)
    (v1["pids"] / "7-0").mkdir()  # a job's group, still there
    cgroups = Cgroups(v2_base=base, v1_bases=v1, pure_v2=False)
    assert cgroups.remove_bases() == 2
    assert not base.exists() and not v1["memory"].exists() and (v1["pids"] / "7-0").exists()
    assert cgroups.remove_bases() == 0  # gone already, or still in use: nothing raised


def test_a_job_group_is_made_after_another_agent_of_the_node_removed_the_nodes_groups(tmp_path):
    """Two agents of one node name on one host share `gpuplatform/<node>`: one's clean stop may
    remove it while the other runs; the other's next job makes it again."""
    base = fake_v2(tmp_path)
    v1 = {"pids": tmp_path / "pids" / "gpuplatform" / "n1"}
    v1["pids"].mkdir(parents=True)
    cgroups = Cgroups(v2_base=base, v1_bases=v1, pure_v2=False)
    assert cgroups.remove_bases() == 2
    group = cgroups.create(
        "a.1-0", Limits(memory_mib=0, pids_max=8, cpu_weight=100), deny_devices=[]
    )
    assert group.v2 == base / "a.1-0" and group.v2.is_dir()
    assert (v1["pids"] / "a.1-0" / "pids.max").read_text() == "8"
    pure = Cgroups(v2_base=base, v1_bases={}, pure_v2=True, v2_controllers=("memory", "pids"))
    group.remove()
    assert pure.remove_bases() == 1
    pure.create("a.2-0", Limits(memory_mib=0, pids_max=8, cpu_weight=100), deny_devices=[])
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids"

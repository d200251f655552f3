"""The agent's reaper: a small process that outlives a SIGKILLed agent just long enough to kill
every job cgroup the agent left, so no descendant of a job (double-forked, `setsid`) runs on
without its agent, even when no agent of the node ever starts again.

The agent holds the write end of a pipe whose read end is the reaper's stdin; nothing else
holds it (the fd is close-on-exec, and jobs are exec'd). However the agent ends (exit, crash,
SIGKILL, OOM kill), the kernel closes it and the reaper's read returns: it then kills the groups
under the agent's bases named with the agent's instance prefix, removes them and exits.

The reaper runs in its own session (a signal to the agent's process group does not reach it)
and in the agent's own cgroup (a systemd unit stopping the agent stops it too, which kills the
jobs' groups anyway: they are under the unit's). A successor agent still kills what is left at
its start (`Runner.kill_orphans`), for a reaper that was itself killed.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

from workers import isolation as fence

log = logging.getLogger("gpuplatform.reaper")


@dataclass(frozen=True)
class Reaper:
    pid: int
    pipe: int  # the write end: the agent keeps it open for as long as it lives, and never writes


def start(cgroups: fence.Cgroups, prefix: str) -> Reaper:
    """Start the reaper for the groups `cgroups` holds named `prefix...`."""
    read_end, write_end = os.pipe()  # both close-on-exec (PEP 446)
    argv = [sys.executable, "-m", "workers.reaper", "--prefix", prefix]
    if cgroups.v2_base is not None:
        argv += ["--v2", str(cgroups.v2_base)]
    for controller, base in cgroups.v1_bases.items():
        argv += ["--v1", f"{controller}={base}"]
    process = subprocess.Popen(
        argv,
        stdin=read_end,  # dup'ed onto fd 0 in the child; the parent's copy is closed below
        start_new_session=True,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _root()},
    )
    os.close(read_end)
    return Reaper(pid=process.pid, pipe=write_end)


def _root() -> str:
    return str(pathlib.Path(__file__).resolve().parents[1])


def reap(cgroups: fence.Cgroups, prefix: str) -> int:
    """Kill and remove every group named `prefix...`; the number that still had processes."""
    groups = cgroups.leftovers(set(), prefix=prefix)
    killed = 0
    for group in groups:
        if group.pids():
            killed += 1
        group.kill()
    for group in groups:
        if group.paths:
            fence.wait_empty(group.paths[0], timeout=5.0)
        group.remove()
    return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--v2", type=pathlib.Path)
    parser.add_argument("--v1", action="append", default=[], metavar="CONTROLLER=PATH")
    args = parser.parse_args(argv)
    v1 = {k: pathlib.Path(v) for k, v in (item.split("=", 1) for item in args.v1)}
    cgroups = fence.Cgroups(v2_base=args.v2, v1_bases=v1, pure_v2=args.v2 is not None and not v1)
    logging.basicConfig(level=logging.INFO, format="reaper: %(message)s")
    while os.read(0, 4096):  # the agent never writes: this returns b"" once it is gone
        pass
    killed = reap(cgroups, args.prefix)
    fence.remove_node_groups(cgroups)  # where no other agent's job group is left in them
    if killed:
        log.warning("the agent is gone: killed %d job cgroup(s) it left", killed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

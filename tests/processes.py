"""Helpers for tests that look at real processes."""

import os


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie is dead for our purpose)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


def group_cmdlines(pgid: int) -> dict[int, bytes]:
    """The command lines of every live process in a process group (a spawned service and all it forked)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    found[int(entry)] = cmdline.read()
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
    return found

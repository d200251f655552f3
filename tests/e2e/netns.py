"""Other hosts for end-to-end tests: network namespaces joined to this host by veth pairs,
addressed from 198.18.0.0/15 only (RFC 2544's benchmark range: never routed, never anyone's
real network), and a launcher that runs a process in one of them with its own mount namespace
(the control plane's files hidden) and an environment of exactly what it is given.

Needs root and iproute2 (`ip`), util-linux (`nsenter`, `unshare`, `mount`). Every name made here
carries the creating process's pid, so a run that crashed is cleaned up by the next one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import pathlib
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "gpe2e"  # namespaces gpe2e-<pid>-<n>; veth ends gpe2eh<pid>x<n> (host), gpe2en<pid>x<n>
NETWORK = ipaddress.ip_network("198.18.0.0/15")
PAIRS = 16  # /30 pairs per process (a block of 64 addresses chosen by pid)
_made: set[str] = set()  # names (namespaces, host links) this process made and has not removed
_counter = itertools.count()
STALE_NAMESPACE = re.compile(rf"^{PREFIX}-(\d+)-\d+$")
STALE_LINK = re.compile(rf"^{PREFIX}h(\d+)x\d+$")


class Unavailable(Exception):
    """Network or mount namespaces cannot be made here (the test skips, saying why)."""


@dataclass(frozen=True)
class Namespace:
    name: str
    host_address: str  # this host's end of the veth pair
    address: str  # the namespace's end
    host_link: str

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside this network namespace (and nothing else changed)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout)


def ip(*args: str) -> str:
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise Unavailable("`ip` (iproute2) is not installed") from None
    if result.returncode != 0:
        raise Unavailable(
            f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.returncode}"
        )
    return result.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(pid: int, name: str) -> bool:
    # Our own pid but not made by us: a dead run's whose pid came round again (a fresh container
    # starts its pids from the same place).
    if pid == os.getpid():
        return name not in _made
    return not _alive(pid)


def clean_stale() -> list[str]:
    """Remove the namespaces and host links of runs that are gone; returns what it removed."""
    removed = []
    for name in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        match = STALE_NAMESPACE.match(name)
        if match and _stale(int(match[1]), name):
            _kill_inside(name)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            removed.append(name)
    for line in ip("-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        match = STALE_LINK.match(link)
        if match and _stale(int(match[1]), link):
            subprocess.run(["ip", "link", "delete", link], capture_output=True)
            removed.append(link)
    return removed


def _kill_inside(name: str) -> None:
    """A dead run's agents (and their jobs) still inside its namespace: without this they would
    live on, and keep the namespace alive after its name is gone."""
    pids = subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True
    ).stdout.split()
    for pid in map(int, pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pair(number: int) -> ipaddress.IPv4Address:
    """The /30 of this process's `number`th namespace, in a block chosen by pid (so runs side by
    side on one host do not collide)."""
    blocks = NETWORK.num_addresses // (4 * PAIRS)
    return NETWORK.network_address + (os.getpid() % blocks) * 4 * PAIRS + 4 * (number % PAIRS)


def _name() -> Namespace:
    pid, number = os.getpid(), next(_counter)
    base = _pair(number)
    namespace = Namespace(name=f"{PREFIX}-{pid}-{number}", host_address=str(base + 1), address=str(base + 2),
                          host_link=f"{PREFIX}h{pid}x{number}")  # fmt: skip
    _made.update((namespace.name, namespace.host_link))
    return namespace


def _make(namespace: Namespace) -> None:
    inner = namespace.host_link.replace(f"{PREFIX}h", f"{PREFIX}n", 1)
    ip("netns", "add", namespace.name)
    ip(
        "link",
        "add",
        namespace.host_link,
        "type",
        "veth",
        "peer",
        "name",
        inner,
        "netns",
        namespace.name,
    )
    ip("address", "add", f"{namespace.host_address}/30", "dev", namespace.host_link)
    ip("link", "set", namespace.host_link, "up")
    ip("-n", namespace.name, "link", "set", "lo", "up")
    ip("-n", namespace.name, "address", "add", f"{namespace.address}/30", "dev", inner)
    ip("-n", namespace.name, "link", "set", inner, "up")
    # Everything beyond the pair goes to this host: so every namespace reaches the one address the
    # platform listens on (the first pair's host end), as nodes reach one control plane.
    ip("-n", namespace.name, "route", "add", "default", "via", namespace.host_address)


def _remove(namespace: Namespace) -> None:
    # Deleting the namespace destroys its veth end, and with it the host's end.
    subprocess.run(["ip", "netns", "delete", namespace.name], capture_output=True)
    subprocess.run(["ip", "link", "delete", namespace.host_link], capture_output=True)
    _made.difference_update((namespace.name, namespace.host_link))


@contextlib.contextmanager
def namespaces(count: int = 2) -> Iterator[list[Namespace]]:
    """`count` network namespaces, removed on the way out whatever happens (at most 16 at once
    in one process: their addresses come round again)."""
    if os.geteuid() != 0:
        raise Unavailable("network namespaces need root (this run is not root)")
    if len(_made) + count > PAIRS:
        raise ValueError(f"at most {PAIRS} namespaces at once")
    clean_stale()
    made: list[Namespace] = []
    try:
        for _ in range(count):
            made.append(_name())  # before it exists: a step that fails half way is undone too
            _make(made[-1])
        yield made
    finally:
        for namespace in made:
            _remove(namespace)


def host_argv(
    namespace: Namespace, argv: list[str], *, env: dict[str, str], hide: list[pathlib.Path]
) -> list[str]:
    """`argv` as a process on another host: in `namespace`'s network, in a mount namespace of its
    own where every dir in `hide` is an empty tmpfs, with exactly `env` as its environment.

    nsenter rather than `ip netns exec`: the latter mounts a fresh /sys, which loses the cgroup
    hierarchy an agent running as root fences its jobs with. The exec chain (nsenter, unshare, sh,
    env) keeps one pid, so the process started is the one signalled and inspected."""
    script = "set -e\n"
    script += "".join(
        f"mount -t tmpfs -o size=1m,mode=0700 hidden {shlex.quote(str(p))}\n" for p in hide
    )
    script += 'exec env -i "$@"\n'
    assignments = [f"{key}={value}" for key, value in env.items()]
    return ["nsenter", f"--net=/run/netns/{namespace.name}", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", script, "host", *assignments, *argv]  # fmt: skip


def check_mount_namespaces(namespace: Namespace, probe: pathlib.Path) -> None:
    """Raise Unavailable unless a process in `namespace` can hide a dir (`probe`, which exists)."""
    argv = host_argv(namespace, ["ls", "-A", str(probe)], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                     hide=[probe])  # fmt: skip
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as error:
        raise Unavailable(f"{error.filename} (util-linux) is not installed") from None
    if result.returncode != 0 or result.stdout.strip():
        raise Unavailable(
            f"cannot hide a dir in a mount namespace here: {result.stderr.strip() or result.stdout.strip()}"
        )

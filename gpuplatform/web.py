"""The web: `python -m gpuplatform.web [--workers N] [gunicorn's options]` (the Procfile's `web`).

It runs N gunicorn masters (default 2) of one worker each (gpuplatform/web_worker.py, with
`--threads` serving the sync views), all listening on the same addresses through SO_REUSEPORT
(gunicorn's `--reuse-port`). Each master has a listening socket of its own, and the kernel hands
each new connection to one of them by its address hash.

One master with N workers shares one listening socket instead, and uvloop's accept takes every
connection pending on it at once. Clients that connect together (the bench's 8 keep-alive
sessions, a proxy's upstream pool) then all sit on one worker: in 29 of 36 runs all 8 did, and
submits went at one process's speed (docs/bench/71-slurm-peer-notes.md, the h36web pass).

Before starting, each TCP address is bound once without SO_REUSEPORT. If something already
listens there, the web refuses to start, and does not silently share connections with another web
of the same user. A unix socket cannot be shared this way, so it is served by one master
(`--workers 1`). When a master exits, the others are stopped and the web exits with its status.
SIGTERM, SIGINT, SIGQUIT and SIGHUP go to every master (gunicorn's meanings: stop gracefully,
stop, stop now, reload the worker).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

APPLICATION = "gpuplatform.asgi:application"
WORKER = "gpuplatform.web_worker.Worker"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


class AddressInUse(Exception):
    pass


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m gpuplatform.web",
        description="N gunicorn masters of one worker each on the same addresses (SO_REUSEPORT); "
        "other options go to gunicorn",
    )
    parser.add_argument("-w", "--workers", type=int, default=2,
                        help="masters, each with one worker (default 2)")  # fmt: skip
    parser.add_argument("-b", "--bind", action="append", default=[],
                        help="HOST:PORT or unix:PATH, as gunicorn's (default 127.0.0.1:8000)")  # fmt: skip
    options, rest = parser.parse_known_args(argv)
    if options.workers < 1:
        parser.error("--workers: at least 1")
    options.bind = options.bind or ["127.0.0.1:8000"]
    if options.workers > 1 and any(b.startswith(("unix:", "fd://")) for b in options.bind):
        parser.error("--bind: a unix socket or an inherited fd cannot be shared by several "
                     "masters; give --workers 1")  # fmt: skip
    return options, rest


def host_port(bind: str) -> tuple[str, int]:
    """gunicorn's TCP forms: HOST:PORT, [IPv6]:PORT, HOST (port 8000)."""
    if bind.startswith("["):
        host, _, port = bind[1:].partition("]")
        port = port.removeprefix(":") or "8000"
    elif ":" in bind:
        host, _, port = bind.rpartition(":")
    else:
        host, port = bind, "8000"
    return host or "0.0.0.0", int(port)


def check_free(bind: str) -> None:
    """Bind the address once without SO_REUSEPORT: this fails if anything listens there."""
    host, port = host_port(bind)
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        # SO_REUSEADDR as gunicorn's own sockets: a port in TIME_WAIT is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise AddressInUse(f"the web's address {bind} is taken ({error.strerror})") from error


def command(options: argparse.Namespace, rest: list[str]) -> list[str]:
    binds = [f"--bind={b}" for b in options.bind]
    shared = ["--reuse-port"] if options.workers > 1 else []
    return [sys.executable, "-m", "gunicorn", APPLICATION, "--worker-class", WORKER, *binds,
            "--workers", "1", *shared, *rest]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    options, rest = parse(sys.argv[1:] if argv is None else argv)
    try:
        for bind in options.bind:
            if not bind.startswith(("unix:", "fd://")):
                check_free(bind)
    except AddressInUse as error:
        print(f"gpuplatform.web: {error}", file=sys.stderr)
        return 2
    masters: list[subprocess.Popen] = []
    stopping = False

    def forward(signum, _frame):
        nonlocal stopping
        stopping = stopping or signum != signal.SIGHUP
        for master in masters:
            if master.returncode is None:
                master.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    for _ in range(options.workers):
        if not stopping:
            masters.append(subprocess.Popen(command(options, rest)))
    status = 0
    live = {master.pid: master for master in masters}
    while live:
        pid, wait_status = os.wait()
        master = live.pop(pid, None)
        if master is None:
            continue
        master.returncode = os.waitstatus_to_exitcode(wait_status)
        status = status or (
            master.returncode if master.returncode >= 0 else 128 - master.returncode
        )
        if not stopping:  # a master died on its own: the web is not whole, stop it all
            stopping = True
            print(f"gpuplatform.web: a master (pid {pid}) exited with {master.returncode}; "
                  "stopping the others", file=sys.stderr)  # fmt: skip
            for other in live.values():
                other.send_signal(signal.SIGTERM)
    return status


if __name__ == "__main__":
    sys.exit(main())

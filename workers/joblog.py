"""What a member leaves for the platform, read without trusting it: its log (copied from its
pipe into the agent's own dir, masked, up to the cap), its control files (progress.json,
checkpoint.json: the SDK's), and its output files (collected as artifacts at its end)."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from typing import BinaryIO

from workers import masking
from workers.run import Reporter, Run
from workers.safefiles import open_job_file, tree_size

log = logging.getLogger(__name__)
CONTROL_FILE_BYTES = 1 << 20  # progress.json / checkpoint.json larger than this are ignored


def start_log_reader(run: Run, fd: int, cap: int, woken: threading.Event) -> None:
    """Copy the member's pipe (read end `fd`) into its log on a thread; `woken` is set when
    the pipe closes (the member may have ended)."""
    # Opened here, so it is there once launch returns; the reader closes it. The agent's alone.
    out = os.fdopen(
        os.open(run.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600),
        "ab",
    )
    run.log_reader = threading.Thread(
        target=_copy_log, args=(run, fd, out, cap, woken), name=f"log-{run.key}", daemon=True
    )
    run.log_reader.start()


def _copy_log(run: Run, fd: int, out: BinaryIO, cap: int, woken: threading.Event) -> None:
    """The job's stdout and stderr, from the pipe into the agent's log file, up to the cap;
    past it the rest is drained and dropped and the job is stopped."""
    masker = masking.Masker(run.secret_values.values())
    with os.fdopen(fd, "rb", buffering=0) as pipe, out:
        written = out.tell()
        while True:
            raw = pipe.read(65536)
            # Masked before a byte is stored: a value split across two reads is held back.
            chunk = masker.feed(raw) if raw else masker.flush()
            if chunk and not run.over_limit.startswith("log"):
                if written + len(chunk) > cap:
                    out.write(chunk[: max(0, cap - written)])
                    out.write(
                        f"\n[gpuplatform] log over {cap} bytes: the job is stopped\n".encode()
                    )
                    run.over_limit = f"log over {cap} bytes"
                else:
                    out.write(chunk)
                written += len(chunk)
                out.flush()
            if not raw:
                break
    woken.set()


def output_over(run: Run, cap: int) -> bool:
    return tree_size(run.workdir / "output") > cap


def read_control(run: Run, name: str) -> dict:
    """One of the SDK's control files (`.gpuplatform/<name>` in the work dir), {} if absent,
    not the job's own plain file, too large or not a JSON object."""
    handle = run.open_job_file(run.workdir / ".gpuplatform" / name)
    if handle is None:
        return {}
    with handle:
        try:
            data = json.loads(handle.read(CONTROL_FILE_BYTES + 1)[:CONTROL_FILE_BYTES])
        except ValueError:
            return {}
    return data if isinstance(data, dict) else {}


def checkpoint_path(run: Run) -> str:
    """The file the member's last saved checkpoint is in (the SDK's marker), or ""."""
    return str(read_control(run, "checkpoint.json").get("path", ""))


def collect_outputs(run: Run, reporter: Reporter) -> None:
    """Every regular, singly linked file the job owns in its output dir; links (symbolic
    or hard) are never followed back out."""
    output = run.workdir / "output"
    prefix = "" if run.assignment.rank == 0 else f"rank-{run.assignment.rank}/"
    for path in _files_below(output):
        handle = open_job_file(path, root=run.workdir, owner=run.owner)
        if handle is None:
            log.warning(
                "attempt %s rank %s: %s is a link or not the job's; not collected", *run.key, path
            )
            continue
        with handle:
            reporter.collect(run, prefix + path.relative_to(output).as_posix(), handle)


def _files_below(root: pathlib.Path) -> list[pathlib.Path]:
    found = []
    for directory, _, filenames in os.walk(root, followlinks=False):
        found += [pathlib.Path(directory) / name for name in filenames]
    return sorted(found)

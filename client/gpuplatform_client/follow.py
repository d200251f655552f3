"""`gpuplatform wait` and `submit --wait`: follow a job's events (or an array's counts) until it
ends, and exit with its status. Ctrl-C stops the following, never the job."""

from __future__ import annotations

import json
import sys

from .api import TERMINAL, Client, Event
from .views import array_line, job_or_array


def cmd_wait(client: Client, args) -> int:
    kind, found = job_or_array(client, args.job_id, client.get, client.array)
    if kind == "array":
        return follow_array(client, found["id"], as_json=args.json, timeout=args.timeout)
    return follow_job(
        client, found["id"], quiet=args.quiet, timeout=args.timeout, as_json=args.json
    )


def job_status(job: dict) -> int:
    """The exit status for a finished job: 0 succeeded; the job's own status if it failed with
    one; 1 otherwise (cancelled, or failed without one)."""
    if job["state"] == "succeeded":
        return 0
    code = job.get("exit_code")
    if job["state"] == "failed" and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


class _Printer:
    """Prints a job's events as they come. The line of its last state waits for the stream's
    `end`: the log lines the server sends after it (the tail of the output) come first."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.held: list[str] = []

    def __call__(self, event: Event) -> None:
        if self.quiet:
            return
        if event.event == "state":
            reason = f" ({event.data['reason']})" if event.data.get("reason") else ""
            line = f"[{event.data['at'][11:19]}] {event.data['to']}{reason}"
            if event.data["to"] in TERMINAL:
                self.held.append(line)
            else:
                print(line, flush=True)
        elif event.event == "log":
            print(f"  | {event.data['line']}", flush=True)
        elif event.event == "progress":
            print(f"  progress {round(100 * event.data['progress'])}%", flush=True)
        elif event.event == "end":
            self.flush()

    def flush(self) -> None:
        for line in self.held:
            print(line, flush=True)
        self.held = []


def follow_job(
    client: Client, job_id: str, *, quiet: bool, timeout: float | None, as_json: bool
) -> int:
    printer = _Printer(quiet)
    try:
        job = client.wait(job_id, timeout=timeout, on_event=printer)
    except TimeoutError as error:
        print(f"gpuplatform: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _still_running("job", job_id)
        return 130
    printer.flush()
    _out(
        as_json,
        job,
        f"{job['id']} {job['state']}"
        + (f" exit={job['exit_code']}" if job["exit_code"] is not None else ""),
    )
    return job_status(job)


def follow_array(
    client: Client, array_id: str, *, as_json: bool, timeout: float | None = None
) -> int:
    try:
        array = client.wait_array(
            array_id,
            timeout=timeout,
            on_change=None if as_json else lambda a: print(array_line(a), flush=True),
        )
    except TimeoutError as error:
        print(f"gpuplatform: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _still_running("array", array_id)
        return 130
    if as_json:
        print(json.dumps(array, indent=2))
    counts = array.get("counts") or {}
    return 0 if counts.get("succeeded", 0) == array.get("size") else 1


def _still_running(kind: str, ident: str) -> None:
    """Ctrl-C: only the following stops; say so, and how to pick it up again."""
    print(
        f"\ngpuplatform: stopped following; the {kind} goes on.\n"
        f"  follow it again: gpuplatform wait {ident}\n"
        f"  stop it:         gpuplatform cancel {ident}",
        file=sys.stderr,
        flush=True,
    )


def _out(as_json: bool, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2) if as_json else text, flush=True)

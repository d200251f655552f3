"""`gpuplatform shell`, `gpuplatform exec` and `gpuplatform port-forward` (docs/interactive.md).

Each session is opened with `POST /api/v1/jobs/{id}/sessions/` (the token is checked there, as
for any call) and then carried on a websocket to the web (`/api/v1/sessions/{id}/`), which joins
it to the job's node agent. Frames, both ways: `\\x00` + data, `\\x01` + JSON control
(`resize`, `eof` from here; `exit`, `error` from the node).

Exit status: the remote command's own; 255 when the session ended without one (the node's agent
or the web went away, the token was revoked), saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from .api import TERMINAL, ApiError, Client

DATA, CONTROL = b"\x00", b"\x01"
CHUNK = 256 * 1024  # data a frame at most (gpuplatform/relay.py MAX_FRAME)
LOST = 255  # as ssh: the session ended without the remote command's status
CLOSE_REASONS = {
    4001: "the token was revoked",
    4002: "the connection between the web and the node was lost",
    4003: "the node's agent did not answer",
    1012: "the web restarted",
    1001: "the web is going away",
}


def register(add) -> None:
    """Add the three commands to cli.py's parser (`add(name, **kwargs)` makes a command's)."""
    shell = add("shell", help="a shell on GPUs: submit an interactive job and attach "
                                "(or attach to interactive job ID)")  # fmt: skip
    shell.add_argument("job_id", metavar="ID", nargs="?",
                       help="attach to this running interactive job instead of submitting one")  # fmt: skip
    shell.add_argument(
        "--gpus", type=int, default=1, metavar="N", help="GPUs on each node (default: 1)"
    )
    shell.add_argument("--sku", dest="gpu_sku", metavar="SKU", help="the GPU model, e.g. H100-80GB")
    shell.add_argument("--nodes", type=int, metavar="N", help="nodes for a gang (default: 1)")
    shell.add_argument(
        "--image", help="an OCI image as the job's root, where the platform has them"
    )
    shell.add_argument(
        "--workdir", "-w", metavar="DIR", help="pack DIR, upload it, start the shell in it"
    )
    shell.add_argument("--idle-timeout", type=float, metavar="MIN", dest="idle_timeout_minutes",
                       help="end the job after MIN minutes with nothing typed or printed")  # fmt: skip
    shell.add_argument("--max-runtime", type=int, dest="max_runtime_seconds", metavar="SECONDS",
                       help="end the job after this long")  # fmt: skip
    shell.add_argument("--tier", help="run under this tier (default: your tenant's)")
    shell.set_defaults(run=cmd_shell)
    run = add("exec", help="run a command inside a running job: exec ID [--rank N] -- ARGV")
    run.add_argument("job_id", metavar="ID", help="the running job")
    run.add_argument("--rank", type=int, default=0, help="the gang member (default 0)")
    run.add_argument("--no-tty", action="store_true", help="no terminal even if stdin is one")
    run.set_defaults(run=cmd_exec, trailing=[])
    forward = add("port-forward", help="reach a port a running job listens on: "
                                  "port-forward ID [LOCAL:]REMOTE")  # fmt: skip
    forward.add_argument("job_id", metavar="ID", help="the running job")
    forward.add_argument("ports", metavar="[LOCAL:]REMOTE",
                         help="the job's port, and the local one (default: the same number)")  # fmt: skip
    forward.add_argument("--rank", type=int, default=0, help="the gang member (default 0)")
    forward.set_defaults(run=cmd_port_forward)


# --- the commands -------------------------------------------------------------------------------


def cmd_shell(client: Client, args) -> int:
    job_id = args.job_id
    if job_id is None:
        body = {"interactive": True, "gpus": args.gpus}
        for name in (
            "gpu_sku",
            "nodes",
            "image",
            "idle_timeout_minutes",
            "max_runtime_seconds",
            "tier",
        ):
            if getattr(args, name, None) is not None:
                body[name] = getattr(args, name)
        if args.workdir:
            from .submit import upload_workdir

            body["bundle"] = upload_workdir(client, args.workdir)
        job = client.submit(**body)
        job_id = job["id"]
        print(f"gpuplatform: interactive job {job_id} submitted", file=sys.stderr, flush=True)
    if not wait_running(client, job_id):
        return 1
    print(f"gpuplatform: attaching to job {job_id}; `exit` ends it", file=sys.stderr, flush=True)
    return attach(client, job_id, {"kind": "shell"}, tty=sys.stdin.isatty())


def cmd_exec(client: Client, args) -> int:
    if not args.trailing:
        print("gpuplatform: exec needs a command: gpuplatform exec ID -- ARGV...", file=sys.stderr)
        return 2
    tty = sys.stdin.isatty() and not args.no_tty
    return attach(
        client, args.job_id, {"kind": "exec", "rank": args.rank, "argv": args.trailing}, tty=tty
    )


def cmd_port_forward(client: Client, args) -> int:
    local, _, remote = args.ports.rpartition(":")
    try:
        remote_port = int(remote)
        local_port = int(local) if local else remote_port
    except ValueError:
        print(f"gpuplatform: ports want [LOCAL:]REMOTE, got {args.ports!r}", file=sys.stderr)
        return 2
    probe = {"kind": "forward", "rank": args.rank, "port": remote_port, "argv": ["probe"]}
    with Connection.open(client, args.job_id, probe) as conn:
        answer = conn.finish()
    if "error" in answer:
        print(
            f"gpuplatform: job {args.job_id} port {remote_port}: {answer['error']}", file=sys.stderr
        )
        return 1
    listener = socket.create_server(("127.0.0.1", local_port))
    print(f"Forwarding from 127.0.0.1:{listener.getsockname()[1]} -> job {args.job_id} port {remote_port}",
          flush=True)  # fmt: skip
    spec = {"kind": "forward", "rank": args.rank, "port": remote_port}
    with listener:
        while True:
            local_conn, _ = listener.accept()
            threading.Thread(
                target=forward_one, args=(client, args.job_id, spec, local_conn), daemon=True
            ).start()


# --- waiting for a queued job ---------------------------------------------------------------------


def wait_running(client: Client, job_id: str) -> bool:
    """Until the job runs, saying where it stands; False (and why) when it never will."""
    shown = None
    while True:
        job = client.get(job_id)
        state = job["state"]
        if state == "running":
            return True
        if state in TERMINAL:
            print(f"gpuplatform: job {job_id} is {state}" + (f": {job['reason']}" if job.get("reason") else ""),
                  file=sys.stderr)  # fmt: skip
            return False
        line = f"waiting: job {job_id} is {state}"
        if job.get("queue_position") is not None:
            line += f", position {job['queue_position']}"
        if job.get("estimated_start_at"):
            line += f", estimated start {job['estimated_start_at']}"
        if job.get("reason"):
            line += f" ({job['reason']})"
        if line != shown:
            print(f"gpuplatform: {line}", file=sys.stderr, flush=True)
            shown = line
        time.sleep(1)


# --- one session -----------------------------------------------------------------------------------


class Connection:
    """An opened session's websocket."""

    def __init__(self, ws):
        self.ws = ws
        self.close_reason = ""

    @classmethod
    def open(cls, client: Client, job_id: str, body: dict) -> Connection:
        from websockets.sync.client import connect

        opened = client.open_session(job_id, body)
        parts = urllib.parse.urlsplit(client.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        url = f"{scheme}://{parts.netloc}{opened['url']}"
        ws = connect(url, additional_headers={"X-Session-Ticket": opened["ticket"]}, compression=None,
                     max_size=2 * CHUNK, open_timeout=30, close_timeout=5)  # fmt: skip
        return cls(ws)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.ws.close()

    def send(self, data: bytes) -> None:
        for start in range(0, len(data), CHUNK):
            self.ws.send(DATA + data[start : start + CHUNK])

    def control(self, message: dict) -> None:
        self.ws.send(CONTROL + json.dumps(message).encode())

    def finish(self) -> dict:
        """Read until the end: the last control message ({} if none came)."""
        last: dict = {}
        for _, message in self.frames():
            if message is not None:
                last = message
        return last

    def frames(self):
        """(data, None) or (None, control) until the socket closes."""
        from websockets.exceptions import ConnectionClosed

        try:
            for frame in self.ws:
                if not isinstance(frame, bytes) or not frame:
                    continue
                if frame[:1] == DATA:
                    yield frame[1:], None
                elif frame[:1] == CONTROL:
                    yield None, json.loads(frame[1:])
        except ConnectionClosed:
            pass
        code, reason = self.ws.close_code, self.ws.close_reason
        if code is None or code == 1006:
            self.close_reason = "the connection to the web was lost"
        else:
            self.close_reason = CLOSE_REASONS.get(code) or reason or f"code {code}"


def attach(client: Client, job_id: str, body: dict, *, tty: bool) -> int:
    """Run a command or shell with this terminal (or stdin/stdout): its exit status."""
    rows, cols = terminal_size() if tty else (24, 80)
    body = {
        **body,
        "tty": tty,
        "rows": rows,
        "cols": cols,
        "term": os.environ.get("TERM") or "xterm-256color",
    }
    with Connection.open(client, job_id, body) as conn, raw_terminal(tty):
        resized = threading.Event()
        if tty:  # the pump sends it: a send from the handler could wait on a lock its thread holds
            signal.signal(signal.SIGWINCH, lambda *_: resized.set())
        done = threading.Event()
        threading.Thread(target=pump_stdin, args=(conn, done, resized), daemon=True).start()
        code = None
        out = sys.stdout.buffer
        for data, message in conn.frames():
            if data is not None:
                out.write(data)
                out.flush()
            elif "exit" in message:
                code = int(message["exit"])
            elif "error" in message:
                sys.stderr.write(f"gpuplatform: {message['error']}\r\n")
                code = 1
        done.set()
    if code is None:
        sys.stderr.write(f"gpuplatform: the session ended: {conn.close_reason}\n")
        return LOST
    return code


def pump_stdin(conn: Connection, done: threading.Event, resized: threading.Event) -> None:
    """Keys (or piped input) to the session, and the terminal's new size when it changed."""
    from websockets.exceptions import ConnectionClosed

    fd = sys.stdin.fileno()
    try:
        while not done.is_set():
            if resized.is_set():
                resized.clear()
                conn.control({"resize": list(terminal_size())})
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            data = os.read(fd, CHUNK)
            if not data:
                conn.control({"eof": True})
                return
            conn.send(data)
    except (ConnectionClosed, OSError):
        return


def forward_one(client: Client, job_id: str, spec: dict, local: socket.socket) -> None:
    """One local connection, carried by a session of its own (so one slow connection never
    holds up another's bytes)."""
    from websockets.exceptions import ConnectionClosed

    try:
        conn = Connection.open(client, job_id, spec)
    except (ApiError, OSError) as error:
        print(f"gpuplatform: could not forward a connection: {error}", file=sys.stderr)
        local.close()
        return

    def upstream() -> None:
        try:
            while data := local.recv(CHUNK):
                conn.send(data)
            conn.control({"eof": True})
        except (ConnectionClosed, OSError):
            pass

    with conn, local:
        threading.Thread(target=upstream, daemon=True).start()
        for data, message in conn.frames():
            if data is not None:
                try:
                    local.sendall(data)
                except OSError:
                    break
            elif "error" in message:
                print(f"gpuplatform: {message['error']}", file=sys.stderr)
        with contextlib.suppress(OSError):
            local.shutdown(socket.SHUT_RDWR)


# --- the terminal -------------------------------------------------------------------------------------


def terminal_size() -> tuple[int, int]:
    size = os.get_terminal_size(sys.stdout.fileno() if sys.stdout.isatty() else sys.stdin.fileno())
    return size.lines, size.columns


@contextlib.contextmanager
def raw_terminal(tty: bool):
    """The local terminal in raw mode (keys go to the remote one as typed), restored after."""
    if not tty:
        yield
        return
    import termios
    import tty as ttymod

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    ttymod.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)

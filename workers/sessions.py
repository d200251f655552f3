"""The node's side of interactive sessions (docs/interactive.md): a shell, an exec or a forwarded
port, run inside the job's fence and joined to the client through the web's relay.

The platform's hint (`workers.open_session`, on the node's queue) names only a session id: the
agent dials the web (`/internal/agent/v1/sessions/{id}/`) with its node credential, and the web
answers with the session's spec only if it was opened on this node. Nothing is trusted from the
message, and no inbound port is opened on the node.

Frames, both ways, binary: `\\x00` + bytes (a terminal's or a socket's data), `\\x01` + JSON
(control: `{"resize": [rows, cols]}`, `{"eof": true}` from the client; `{"exit": code}`,
`{"error": text}` from the agent). Sends block while the socket is full, and the agent reads its
process or socket only as fast as it can send: backpressure end to end.

A command runs as the job's uid, in its cgroup and mount namespace (entered with setns from one
of the job's processes), with the job's environment (read from that process) and GPUs, on a PTY
when the client has a terminal. Pure Python, no Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pathlib
import signal
import socket
import stat
import struct
import subprocess
import termios
import threading
import time
from typing import TYPE_CHECKING

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from workers import jail

if TYPE_CHECKING:
    from workers.agent import Agent
    from workers.runner import Run

log = logging.getLogger(__name__)

DATA, CONTROL = b"\x00", b"\x01"
CHUNK = 256 * 1024  # data a frame at most (gpuplatform/relay.py MAX_FRAME)
CLONE_NEWNS = 0x00020000
START_WAIT_SECONDS = 60.0  # a session for a member that is still starting waits this long for it
HANGUP_GRACE = 2.0  # SIGHUP, then SIGKILL after this when a session's client is gone
RECHECK_SECONDS = 10.0  # a gang's rank 0 that could not ask the platform asks again after this
EXIT_FILE = "interactive-exit"  # beside the job's progress file: apps/platform/agent_protocol.py


def control(message: dict) -> bytes:
    return CONTROL + json.dumps(message).encode()


class Sessions:
    """This agent's open sessions, and the activity that keeps interactive jobs alive."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.activity: dict[tuple[int, int], float] = {}  # (attempt, rank) -> last byte, monotonic
        self.open: set[Session] = set()
        self.lock = threading.Lock()
        self.recheck_at: dict[tuple[int, int], float] = {}  # a gang's: ask the platform again

    def open_session(self, session: str) -> None:
        threading.Thread(target=self._run, args=(session,), name=f"session-{session[:8]}",
                         daemon=True).start()  # fmt: skip

    def _run(self, session_id: str) -> None:
        session = Session(self, session_id)
        with self.lock:
            self.open.add(session)
        try:
            session.run()
        except Exception:
            log.exception("session %s failed", session_id[:8])
        finally:
            with self.lock:
                self.open.discard(session)

    def touch(self, key: tuple[int, int]) -> None:
        self.activity[key] = time.monotonic()

    def quiet_for(self, key: tuple[int, int]) -> float | None:
        """Seconds since a session of member `key` (attempt, rank) carried a byte; None if none
        has. The GPU sampler asks (workers/telemetry.py): typing keeps GPUs out of the idle policy."""
        last = self.activity.get(key)
        return None if last is None else time.monotonic() - last

    def idle_loop(self) -> None:
        """End interactive jobs idle past their timeout: nothing typed, nothing printed."""
        while not self.agent.stopping.wait(1.0):
            try:
                self.check_idle()
            except Exception:
                log.exception("idle check failed")

    def check_idle(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for key, run in self.agent.local_runs().items():
            limit = getattr(run.assignment, "idle_timeout_seconds", 0)
            if not getattr(run.assignment, "interactive", False) or not limit or not run.started:
                continue
            if run.assignment.rank:  # rank 0 decides for the gang, and its end ends every rank
                continue
            last = max(run.started, self.activity.get(key, 0.0))
            if now - last <= limit or run.stop_reason:
                continue
            if run.assignment.world_size > 1 and self.busy_elsewhere(run, now, limit):
                continue
            minutes = f"{limit / 60:g}"
            log.info("interactive attempt %s rank %s idle for %s min; ending it", *key, minutes)
            self.agent.runner.stop(
                *key, why=f"idle timeout: nothing typed or printed for {minutes} min"
            )

    def busy_elsewhere(self, run: Run, now: float, limit: float) -> bool:
        """A gang's sessions may be on any rank's node, and this agent sees only its own: before
        rank 0 ends the job, it asks the platform how long the attempt's sessions have been quiet
        on every rank (the relay records each byte's time). Not knowing is not idle: it asks again
        after RECHECK_SECONDS."""
        if now < self.recheck_at.get(run.key, 0.0):
            return True
        try:
            quiet = self.platform_quiet_for(run)
        except Exception as error:
            log.warning("attempt %s: could not ask how long its sessions were quiet (%s)",
                        run.key[0], error)  # fmt: skip
            self.recheck_at[run.key] = now + RECHECK_SECONDS
            return True
        if quiet is None or quiet > limit:
            return False
        self.activity[run.key] = max(self.activity.get(run.key, 0.0), now - quiet)
        return True

    def platform_quiet_for(self, run: Run) -> float | None:
        return self.agent.api.session_quiet_for(run.assignment)

    def close_all(self) -> None:
        with self.lock:
            sessions = list(self.open)
        for session in sessions:
            session.hang_up()


class Session:
    def __init__(self, sessions: Sessions, session_id: str):
        self.sessions, self.id = sessions, session_id
        self.agent = sessions.agent
        self.ws: ClientConnection | None = None
        self.process: subprocess.Popen | None = None
        self.hung_up = False
        self.stdin_closed = False
        self.key = (0, 0)

    def url(self) -> str:
        base = self.agent.config.url.rstrip("/")
        scheme = "wss" if base.startswith("https") else "ws"
        return f"{scheme}://{base.split('://', 1)[1]}/internal/agent/v1/sessions/{self.id}/"

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.agent.config.credential}"}
        try:
            ws = connect(self.url(), additional_headers=headers, compression=None,
                         max_size=2 * CHUNK, open_timeout=15, close_timeout=5)  # fmt: skip
        except Exception as error:
            log.warning("could not dial the web for session %s (%s)", self.id[:8], error)
            return
        self.ws = ws
        with ws:
            spec = json.loads(ws.recv(timeout=15))
            run = self.find_run(spec)
            if run is None:
                ws.send(control({"error": "this job does not run on this node any more"}))
                return
            self.key = run.key
            self.sessions.touch(run.key)
            log.info("session %s: %s on attempt %s rank %s", self.id[:8], spec["kind"], *run.key)
            if spec["kind"] == "forward":
                self.forward(run, spec)
            else:
                self.command(run, spec)

    def find_run(self, spec: dict) -> Run | None:
        key = (int(spec["attempt_id"]), int(spec["rank"]))
        run = self.agent.local_runs().get(key)
        if run is None or run.assignment.token != spec["token"]:
            return None
        # A member still being prepared (its environment built, or a gang member waiting for
        # rank 0's MASTER_PORT: workers/prepare.py) has no process yet: wait for it a while.
        deadline = time.monotonic() + START_WAIT_SECONDS
        while run.process is None and not run.finished and time.monotonic() < deadline:
            time.sleep(0.1)
        if run.process is None or run.finished or run.process.poll() is not None:
            return None
        return run

    def hang_up(self) -> None:
        if self.ws is not None:
            self.ws.close(1001, "the node's agent is stopping")

    # --- a command (shell or exec) ---------------------------------------------------------------

    def command(self, run: Run, spec: dict) -> None:
        assert self.ws is not None
        tty = bool(spec.get("tty"))
        try:
            process, output, stdin = spawn(run, spec)
        except Exception as error:
            self.ws.send(control({"error": f"could not start {spec['argv'][:1]}: {error}"}))
            return
        self.process = process
        reader = threading.Thread(target=self.to_process, args=(process, stdin, tty), daemon=True,
                                  name=f"session-in-{self.id[:8]}")  # fmt: skip
        reader.start()
        try:
            self.from_process(output)
            code = process.wait()
            code = 128 - code if code < 0 else code
            if self.hung_up:
                return  # its client left: the job goes on (until its idle timeout)
            with contextlib.suppress(ConnectionClosed):
                self.ws.send(control({"exit": code}))
            if spec.get("ends_job"):
                end_interactive_job(run, code)
        finally:
            self.ws.close()
            reader.join(5)
            with contextlib.suppress(OSError):
                os.close(output)
            if not tty:
                self.close_stdin()

    def from_process(self, fd: int) -> None:
        """The process's terminal (or stdout+stderr) -> the socket, until it closes."""
        assert self.ws is not None
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:  # EIO: the terminal's last holder is gone
                data = b""
            if not data:
                break
            self.sessions.touch(self.key)
            try:
                self.ws.send(DATA + data)
            except ConnectionClosed:
                break

    def to_process(self, process: subprocess.Popen, fd: int, tty: bool) -> None:
        """The socket -> the process's terminal (or stdin); a closed socket hangs it up."""
        assert self.ws is not None
        try:
            for message in self.ws:
                if not isinstance(message, bytes) or not message:
                    continue
                if message[:1] == DATA and not self.stdin_closed:
                    self.sessions.touch(self.key)
                    with contextlib.suppress(OSError):  # it closed its input: the rest is dropped
                        write_all(fd, message[1:])
                elif message[:1] == CONTROL:
                    self.control_message(json.loads(message[1:]), fd, tty)
        except ConnectionClosed:
            pass
        if process.poll() is None:
            self.hung_up = True
            hang_up(process)

    def control_message(self, message: dict, fd: int, tty: bool) -> None:
        if "resize" in message and tty:
            rows, cols = (int(v) for v in message["resize"])
            set_size(fd, rows, cols)
        if message.get("eof"):
            if tty:
                write_all(fd, b"\x04")
            else:
                self.close_stdin()

    def close_stdin(self) -> None:
        self.stdin_closed = True
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # (its fd is the one to_process writes to)

    # --- a forwarded port -------------------------------------------------------------------------

    def forward(self, run: Run, spec: dict) -> None:
        assert self.ws is not None
        port = int(spec["port"])
        address = job_listens(run, port)
        if address is None:
            self.ws.send(control({"error": f"port {port} is not a port this job listens on"}))
            return
        if spec.get("argv") == ["probe"]:
            self.ws.send(control({"exit": 0}))
            return
        try:
            sock = socket.create_connection((address, port), timeout=10)
        except OSError as error:
            self.ws.send(control({"error": f"could not connect to port {port}: {error}"}))
            return
        sock.settimeout(None)
        with sock:
            threading.Thread(target=self.to_socket, args=(sock,), daemon=True).start()
            self.from_socket(sock)

    def from_socket(self, sock: socket.socket) -> None:
        assert self.ws is not None
        while True:
            try:
                data = sock.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            self.sessions.touch(self.key)
            try:
                self.ws.send(DATA + data)
            except ConnectionClosed:
                return
        with contextlib.suppress(ConnectionClosed):
            self.ws.send(control({"exit": 0}))

    def to_socket(self, sock: socket.socket) -> None:
        assert self.ws is not None
        try:
            for message in self.ws:
                if isinstance(message, bytes) and message[:1] == DATA:
                    self.sessions.touch(self.key)
                    sock.sendall(message[1:])
                elif isinstance(message, bytes) and message[:1] == CONTROL:
                    if json.loads(message[1:]).get("eof"):
                        sock.shutdown(socket.SHUT_WR)
        except (ConnectionClosed, OSError):
            pass
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


# --- inside the fence --------------------------------------------------------------------------------


def job_environment(run: Run) -> dict[str, str]:
    """The job's own environment (its secrets too), as its first process holds it."""
    assert run.process is not None
    raw = pathlib.Path(f"/proc/{run.process.pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def login_shell(argv: list[str]) -> list[str]:
    if argv and argv[0] == "/bin/bash" and not os.path.exists("/bin/bash"):
        return ["/bin/sh", *argv[1:]]
    return argv


def spawn(run: Run, spec: dict) -> tuple[subprocess.Popen, int, int]:
    """Start the session's command in the job's fence; (the process, the fd its output comes
    from, the fd its input goes to): both its terminal's agent end, or two pipes."""
    assert run.process is not None
    env = job_environment(run)
    tty = bool(spec.get("tty"))
    if tty:
        env["TERM"] = str(spec.get("term") or "xterm-256color")
    argv = login_shell([str(part) for part in spec["argv"]])
    uid = run.uid
    if tty:
        ours, theirs = os.openpty()
        set_size(ours, int(spec.get("rows") or 24), int(spec.get("cols") or 80))
        stdin = stdout = theirs
    else:
        ours, theirs = os.pipe()
        stdin, stdout = subprocess.PIPE, theirs
    if uid is not None:
        os.fchown(theirs, uid, uid)
    namespace = os.open(f"/proc/{run.process.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    procs = run.cgroup.procs_files if run.cgroup is not None else []
    workdir = str(run.workdir)

    def enter() -> None:  # in the child, between fork and exec: os calls and libc only
        if tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if uid is not None:
            jail.join_cgroups(procs)
            if jail.libc.setns(namespace, CLONE_NEWNS) != 0:
                raise OSError("setns into the job's mount namespace failed")
            jail.become(uid, uid)
        os.chdir(workdir)

    try:
        process = subprocess.Popen(  # noqa: S603 (argv list, no shell)
            argv, stdin=stdin, stdout=stdout, stderr=stdout, env=env, start_new_session=True,
            preexec_fn=enter, pass_fds=(namespace,),
        )  # fmt: skip
    except BaseException:
        os.close(ours)
        raise
    finally:
        os.close(theirs)
        os.close(namespace)
    if tty:
        return process, ours, ours
    assert process.stdin is not None
    return process, ours, process.stdin.fileno()


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def hang_up(process: subprocess.Popen) -> None:
    """Its client is gone: SIGHUP its process group, SIGKILL after a grace."""
    for signum, wait in ((signal.SIGHUP, HANGUP_GRACE), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def end_interactive_job(run: Run, code: int) -> None:
    """The job's shell exited: its holding process exits with the shell's status."""
    if end_hold(run, code):
        log.info(
            "interactive attempt %s rank %s: its shell exited %s; the job ends", *run.key, code
        )


def end_hold(run: Run, code: int) -> bool:
    """Tell an interactive job's holding process to exit with `code`: its exit file, written
    into the job's own control dir without trusting it (no link followed, a regular file of one
    link: a job cannot turn this root write onto another file). False where that was refused."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.open(run.workdir, flags)
    except OSError:
        return False
    try:
        control = os.open(".gpuplatform", flags, dir_fd=top)
        try:
            fd = os.open(EXIT_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o644, dir_fd=control)  # fmt: skip
        finally:
            os.close(control)
    except OSError:
        return False
    finally:
        os.close(top)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(code).encode())
        return True
    finally:
        os.close(fd)


# --- which job a listening port belongs to -------------------------------------------------------


def listening_inodes(port: int) -> dict[int, str]:
    """Socket inode -> the address it listens on, for TCP listeners on `port` (IPv4 and IPv6)."""
    found: dict[int, str] = {}
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:
                continue
            found[int(fields[9])] = connect_address(address, family)
    return found


def connect_address(hex_address: str, family: int) -> str:
    """Where to connect for a listener bound to this address (any address: loopback)."""
    raw = bytes.fromhex(hex_address)
    if family == 4:
        text = socket.inet_ntop(socket.AF_INET, raw[::-1])
        return "127.0.0.1" if text == "0.0.0.0" else text  # noqa: S104 (a bound address read, not bound)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    text = socket.inet_ntop(socket.AF_INET6, words)
    if text == "::":
        return "::1"
    return text.removeprefix("::ffff:")


def job_pids(run: Run) -> set[int]:
    """The job's processes: its cgroup's, else (unfenced) those of its session."""
    if run.cgroup is not None:
        return run.cgroup.pids()
    assert run.process is not None
    pids = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) == run.process.pid:
                    pids.add(int(entry.name))
    return pids


def job_listens(run: Run, port: int) -> str | None:
    """The address to connect to if a process of this job holds a socket listening on `port`."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    for pid in job_pids(run):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                        return inodes[int(target[8:-1])]
    return None

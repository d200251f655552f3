"""A small resident process that forks the agent's fenced jobs: `ForkServer` in the agent, and
`serve`, what runs in it (`python -I -S workers/forkserver.py AGENT_PID FD`).

Forking the agent itself for every job copied the page tables of a 60 MB interpreter and then
tore the copy down again at the exec: on a drain of short jobs that was a third of the runner's
CPU (docs/bench/13-drain.md). This process imports nothing but the standard library and
workers/jail.py, so its fork is a small one. For each job the agent sends the argv, the
environment, the fence's spec (workers/jail.py `enter`) and the log pipe's write end over a
socket; the server forks, the child takes the log as its stdout and stderr, starts a session,
runs the fence's steps and execs the job, and the server answers with the job's pid once the
exec happened (or with why it did not). The jobs are its children: it reaps them and sends each
one's exit status, which the agent's `Launched` gives as `poll()`'s answer.

The spare: on an idle node the first cgroup move after a quiet spell waits for an RCU grace
period (the kernel's threadgroup lock leaves its fast mode; 8-13 ms here, docs/bench/71), and
the fork costs a little more. So the agent may ask for a spare (`spare(cgroup_procs)`): a child
forked ahead of time that joins the given (empty, not yet limited) cgroups and waits. A launch
whose spec names the same cgroups hands the job to it, which then only takes the log, enters
its namespace, drops to the job's uid and execs; any other launch (no spare, a spare that died,
other cgroups) forks afresh as before, so the spare is never needed for a correct start.

It dies with the agent (a parent-death signal, and the socket's end), and then its jobs with it
(each asks for SIGKILL when its parent dies, workers/jail.py `become`); the agent's cgroup
reaper (workers/reaper.py) kills whatever forked away from that. It ignores SIGTERM, SIGINT and
SIGHUP: those are for the agent, whose graceful stop signals the jobs itself.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

MAX_MESSAGE = 192 << 10  # a request: argv, environment, spec; under the socket buffer (~208 KiB)
PR_SET_PDEATHSIG = 1
# Ignored by the server (a SIGTERM to the agent's process group or service must not kill the
# jobs before the agent's graceful stop has asked them to end), or by Python itself (SIGPIPE,
# SIGXFSZ): the child puts each back to its default before the exec, as subprocess does.
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)


# --- in the agent ----------------------------------------------------------------------------


class LaunchFailed(Exception):
    """The job did not start: the fence's step or the exec failed (the message says which)."""


class Launched:
    """A job the fork server started: what the runner reads of a `subprocess.Popen`."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._ended.set()


class ForkServer:
    """The agent's end. `launch` is called from one thread at a time (the runner's launcher);
    a thread of its own reads the answers and the jobs' exits. `on_exit` is called (from that
    thread) after a job's exit status is known: the runner's tick then sees it at once."""

    def __init__(self, on_exit=None):
        import queue

        self.on_exit = on_exit
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.process = subprocess.Popen(  # noqa: S603 (argv list, our own interpreter and file)
            [sys.executable, "-I", "-S", __file__, str(os.getpid()), str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
        )  # fmt: skip
        theirs.close()
        self.pid = self.process.pid
        self._answers: queue.Queue = queue.Queue()
        self._jobs: dict[int, Launched] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def launch(self, argv: list[str], env: dict[str, str], spec: dict, output_fd: int) -> Launched:
        """Start `argv` through the fence (`spec`), its stdout and stderr on `output_fd`."""
        message = json.dumps({"argv": argv, "env": env, "spec": spec}).encode()
        if len(message) > MAX_MESSAGE:
            raise LaunchFailed("the job's argv and environment are too large")
        self.sock.sendmsg(
            [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [output_fd]))]
        )
        answer = self._answers.get()
        if isinstance(answer, Launched):
            return answer
        raise LaunchFailed(answer)

    def spare(self, cgroup_procs: list[str]) -> None:
        """Have a child forked and moved into these cgroups now, for the next launch whose spec
        names them (no answer: a spare that could not join just ends, and that launch forks)."""
        self.sock.send(json.dumps({"spare": cgroup_procs}).encode())

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self._gone()
                return
            message = json.loads(data)
            if "exited" in message:
                self._exited(message["exited"], message["code"])
            elif "pid" in message:
                job = Launched(message["pid"])
                with self._lock:  # before the next message is read, which may be its exit
                    self._jobs[job.pid] = job
                self._answers.put(job)
            else:
                self._answers.put(message.get("error") or "the fork server refused the job")

    def _exited(self, pid: int, code: int) -> None:
        with self._lock:
            job = self._jobs.pop(pid, None)
        if job is not None:
            job._exited(code)
            if self.on_exit is not None:
                self.on_exit()

    def _gone(self) -> None:
        """The server is gone, and its jobs with it (their parent-death signal): killed."""
        with self._lock:
            pids = list(self._jobs)
        for pid in pids:
            self._exited(pid, -signal.SIGKILL)
        self._answers.put("the fork server is gone")

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        # Shut down first: the reader thread's recv holds the socket open past a bare close.
        self.sock.shutdown(socket.SHUT_RDWR)  # the server sees the end and exits (its jobs die)
        self.sock.close()
        self.process.wait(5)


# --- in the fork server -----------------------------------------------------------------------


def _load_jail():
    """workers/jail.py, beside this file (`-I` puts no directory on the path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
    spec = importlib.util.spec_from_file_location("gpuplatform_jail", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reset_signals() -> None:
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, *IGNORED):
        signal.signal(signum, signal.SIG_DFL)


def _close_all_but(*keep: int) -> None:
    """Close every fd from 3 up but `keep`: the server's socket, its wakeup pipe, the spare's."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX") if low < 1024 else 65536)


def _take_output(output_fd: int) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)


def _exec(request: dict, status_fd: int) -> None:
    try:
        os.execvpe(request["argv"][0], request["argv"], request["env"])
    except BaseException as error:
        os.write(status_fd, f"{error}"[:500].encode(errors="replace"))
    os._exit(127)


def _child(jail, request: dict, output_fd: int, status_fd: int) -> None:
    """In the forked child: never returns (execs the job, or exits 127 saying why not)."""
    try:
        _reset_signals()
        os.setsid()
        _take_output(output_fd)
        _close_all_but(status_fd)  # the socket, the wakeup pipe, the log's own fd
        jail.enter(request["spec"], status_fd)  # writes why to status_fd when a step fails
    except BaseException:
        os._exit(127)
    _exec(request, status_fd)


def _spare_child(jail, cgroup_procs: list[str], channel: socket.socket, status_fd: int) -> None:
    """The spare, forked ahead: joins the cgroups, then waits on `channel` for its job (the
    request and the log's fd); never returns. Ends without a word when the server goes."""
    try:
        _reset_signals()
        jail.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # root until `become`
        os.setsid()
        _close_all_but(channel.fileno(), status_fd)
        try:
            jail.join_cgroups(cgroup_procs)
        except OSError as error:  # said at the hand-over, as a fork's failed join would be
            os.write(status_fd, f"{error}"[:500].encode(errors="replace"))
            raise
        data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 1)
        if not data or not fds:
            os._exit(0)  # dropped: another spare, or the server is gone
        channel.close()
        request = json.loads(data)
        _take_output(fds[0])
        os.close(fds[0])
        jail.enter(request["spec"], status_fd, joined=True)
    except BaseException:
        os._exit(127)
    _exec(request, status_fd)


class Spare:
    """The server's end of its spare: its pid, the cgroups it joined, its channel and status."""

    def __init__(self, pid: int, cgroup_procs: list[str], channel: socket.socket, status_read: int):
        self.pid, self.cgroup_procs = pid, cgroup_procs
        self.channel, self.status_read = channel, status_read

    def drop(self) -> None:
        """Closing its channel ends it (it has not joined the job's fence yet)."""
        self.channel.close()
        os.close(self.status_read)


def _fork_spare(jail, cgroup_procs: list[str]) -> Spare | None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_read, status_write = os.pipe()  # close-on-exec, as for any launch
    try:
        pid = os.fork()
    except OSError:
        for end in (ours, theirs):
            end.close()
        for fd in (status_read, status_write):
            os.close(fd)
        return None
    if pid == 0:
        ours.close()
        os.close(status_read)
        _spare_child(jail, cgroup_procs, theirs, status_write)
    theirs.close()
    os.close(status_write)
    return Spare(pid, cgroup_procs, ours, status_read)


def _status(status_read: int) -> list[bytes]:
    """What the child wrote before its exec closed the pipe: nothing when the exec happened."""
    chunks = []
    try:
        while chunk := os.read(status_read, 4096):
            chunks.append(chunk)
    finally:
        os.close(status_read)
    return chunks


def _hand_to_spare(spare: Spare, data: bytes, output_fd: int) -> dict | None:
    """The job given to the spare; None when the spare is gone (the caller then forks)."""
    try:
        socket.send_fds(spare.channel, [data], [output_fd])
    except OSError:
        spare.drop()
        return None
    spare.channel.close()
    chunks = _status(spare.status_read)
    if not chunks:
        return {"pid": spare.pid}
    os.waitpid(spare.pid, 0)
    return {"error": b"".join(chunks).decode(errors="replace")}


def _start(jail, request: dict, output_fd: int) -> dict:
    status_read, status_write = os.pipe()  # close-on-exec: empty at the exec, else why not
    try:
        pid = os.fork()
    except BaseException:
        os.close(status_read)
        os.close(status_write)
        raise
    if pid == 0:
        os.close(status_read)
        _child(jail, request, output_fd, status_write)
    os.close(status_write)
    chunks = _status(status_read)
    if not chunks:
        return {"pid": pid}
    os.waitpid(pid, 0)
    return {"error": b"".join(chunks).decode(errors="replace")}


def serve(agent_pid: int, fd: int) -> None:
    jail = _load_jail()
    jail.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent_pid:
        return  # the agent died before we asked for the signal
    sock = socket.socket(fileno=fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for signum in IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    spare: Spare | None = None
    while True:
        readable, _, _ = select.select([sock, wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(sock)
        if sock in readable:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            if not data:
                return  # the agent closed its end, or is gone
            for extra in fds[1:]:
                os.close(extra)
            request = json.loads(data)
            if "spare" in request:
                for extra in fds:
                    os.close(extra)
                if spare is not None:
                    spare.drop()
                spare = _fork_spare(jail, request["spare"])
                continue
            if not fds:
                sock.send(json.dumps({"error": "no output pipe sent"}).encode())
                continue
            answer = None
            try:
                if spare is not None and spare.cgroup_procs == request["spec"]["cgroup_procs"]:
                    answer = _hand_to_spare(spare, data, fds[0])
                    spare = None
                if answer is None:
                    answer = _start(jail, request, fds[0])
            except Exception as error:  # a fork that failed: the job did not start
                answer = {"error": f"{error}"}
            finally:
                os.close(fds[0])
            sock.send(json.dumps(answer).encode())
            _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))

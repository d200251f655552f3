"""A real terminal for the client in tests: `gpuplatform ...` run on a PTY of its own (python's pty
module), read and typed into as a person would, resized with TIOCSWINSZ (the kernel then sends
SIGWINCH to the client, as a terminal emulator's resize does)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

CLIENT = [sys.executable, "-m", "gpuplatform_client"]


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], *, rows: int = 24, cols: int = 80):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the client, with the PTY as its terminal
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.resize(rows, cols)
        self.output = b""
        self.status: int | None = None

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str | bytes) -> None:
        os.write(self.fd, text.encode() if isinstance(text, str) else text)

    def read_some(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.output += os.read(self.fd, 65536)
            except OSError:  # EIO: the client exited and closed its side
                self.reap(timeout=5)

    def expect(self, pattern: str, timeout: float = 60) -> re.Match:
        """Wait for `pattern` in what was printed since the last match."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while time.monotonic() < deadline:
            match = regex.search(self.output)
            if match:
                self.output = self.output[match.end() :]
                return match
            if self.status is not None:
                break
            self.read_some(0.2)
        raise AssertionError(f"no {pattern!r} within {timeout}s; printed: {self.output[-3000:]!r}")

    def reap(self, timeout: float = 60) -> int | None:
        deadline = time.monotonic() + timeout
        while self.status is None and time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.05)
        return self.status

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.status is None and time.monotonic() < deadline:
            self.read_some(0.2)
            self.reap(timeout=0)
        assert self.status is not None, f"the client did not exit; printed: {self.output[-3000:]!r}"
        return self.status

    def kill(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reap(timeout=10)
        try:
            os.close(self.fd)
        except OSError:
            pass

"""Whose turn it is to write a submission, on SQLite.

SQLite has one writer at a time. A transaction that finds the write lock taken does not wait in
a queue: its busy handler sleeps and retries (1, 2, 5, 10, ... up to 100 ms a try), so under a
burst of submissions most of the time goes to sleeping while the lock is free, and threads of
one web process fight for the GIL while one of them holds the database. Here submissions take
turns first, on a lock every web process shares (`flock` on a file beside the database, behind
a mutex for this process's threads): a waiter is woken the moment the lock is released, and
only one submission at a time asks SQLite for its write lock. The turn ends at the commit,
before the commit hooks (the dispatch request) run.

Each process that takes turns also keeps the database open (`_keep_open`): one idle SQLite
connection, never in a transaction. A request's connection still closes now and then (after
CONN_MAX_AGE, or when it becomes unusable), and when the last one to a WAL database closes,
SQLite checkpoints the whole WAL into the database, fsyncs it and deletes the WAL, under an
exclusive lock: ~20 ms, during which no other submission can write (when connections lived for
one request, that was every submission). With a
connection kept open, closing is just closing; the WAL is checkpointed as usual by the commit
that grows it past `wal_autocheckpoint` pages.

On PostgreSQL this does nothing: the tenant's row lock orders one tenant's submissions, and
other tenants' never wait for each other.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from contextlib import contextmanager

from django.db import connection, transaction

_mutex = threading.Lock()
_file: dict[int, int] = {}  # pid -> descriptor of the lock file (a forked child opens its own)
_kept: dict[int, sqlite3.Connection] = {}  # pid -> the connection that keeps the database open


def _keep_open(database: str) -> None:
    """Under _mutex: open this process's idle connection to `database`, once."""
    pid = os.getpid()
    if pid in _kept:
        return
    try:
        keeper = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
        keeper.execute(
            "SELECT 1 FROM sqlite_master LIMIT 1"
        ).fetchall()  # opens the file and the WAL index
    except sqlite3.Error:
        return  # only a cost saving: requests work the same without it
    _kept[pid] = keeper


def _descriptor(path: str) -> int:
    pid = os.getpid()
    if pid not in _file:
        _file[pid] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    return _file[pid]


def _lock_path() -> str | None:
    if connection.vendor != "sqlite":
        return None
    name = str(connection.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    return f"{name}.submit-turn"


class _Turn:
    def __init__(self, fd: int | None):
        self.fd, self.held = fd, True

    def release(self) -> None:
        if self.held:
            self.held = False
            if self.fd is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            _mutex.release()


@contextmanager
def write_turn():
    """Wrap a submission's transaction: `with write_turn(): with transaction.atomic(): ...`.
    Inside an enclosing transaction (which may hold the write lock already) it takes no turn."""
    path = _lock_path()
    if path is None or connection.in_atomic_block:
        yield
        return
    _mutex.acquire()
    turn = _Turn(None)
    try:
        _keep_open(str(connection.settings_dict["NAME"]))
        turn.fd = _descriptor(path)
        fcntl.flock(turn.fd, fcntl.LOCK_EX)
    except OSError:
        turn.fd = None  # no lock file (read-only directory): SQLite's own busy handler still orders writers
    try:
        yield turn
    finally:
        turn.release()


def end_turn_at_commit(turn) -> None:
    """Inside the transaction: the turn ends right after the commit, before later commit hooks."""
    if turn is not None:
        transaction.on_commit(turn.release)

"""PostgreSQL (settings.DATABASES' ENGINE for a postgres:// DATABASE_URL): Django's own backend,
subclassed as Django documents ("Subclassing the built-in database backends"), with one change:
the connection health check (CONN_HEALTH_CHECKS, on: gpuplatform/settings.py) costs no round
trip while the server has sent nothing.

Django's check runs `SELECT 1` before the first statement of every request (and of each
dispatcher pass and Celery task), so that a connection the server closed (a restart,
`pg_terminate_backend`, `idle_session_timeout`) is replaced instead of failing the request with a
500. That was one more round trip on every request: ~35 us of the web's CPU and ~25 us of its
backend's in a tight loop, more with the wake-ups in a running platform
(docs/bench/71-slurm-peer-notes.md, h39submit pass).

A server that closes a connection says so on it first (a FATAL error message, then the end of
the stream), so an idle connection that closed has something to read and a healthy idle one has
nothing. Here the check looks at the socket without waiting (poll, no round trip): nothing there
and no transaction open, the connection is usable; anything there (the server's goodbye, the
stream's end, or a message we did not expect: a notice, a parameter change), Django's `SELECT 1`
decides as before. A connection that vanished without a word (a network cut) is found out by
neither check any sooner: `SELECT 1` would wait on it as a statement does.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        driver = self.connection
        if driver is None or driver.closed:
            return False
        if quiet(driver):
            return True
        return super().is_usable()


def quiet(driver) -> bool:
    """An open psycopg connection outside a transaction with nothing from the server to read."""
    if driver.broken or driver.info.transaction_status != pq.TransactionStatus.IDLE:
        return False
    poller = select.poll()
    poller.register(driver.fileno(), select.POLLIN)
    return not poller.poll(0)  # POLLHUP and POLLERR come whatever was asked

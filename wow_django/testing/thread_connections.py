"""Test harness for the django backend: the database connections that other threads open are closed.

Django gives each thread a connection of its own per database alias, so the
threads of a concurrency case (``run_together`` of the contracts) really run
side by side on PostgreSQL; nothing closes those connections when the threads
end. A test database with connections left open cannot be dropped, so
:class:`ClosesThreadConnections` closes them when the test ends, after its
threads were joined.
"""

from __future__ import annotations

import contextlib
import threading

from django.db import DatabaseError
from django.db.backends.signals import connection_created


class ClosesThreadConnections:
    """Mix into a ``django.test.TransactionTestCase``: connections opened by other threads are closed after each test."""

    def setUp(self) -> None:
        main = threading.get_ident()
        opened: list = []
        lock = threading.Lock()

        def record(sender, connection, **kwargs) -> None:
            if threading.get_ident() != main:
                with lock:
                    opened.append(connection)

        uid = f"wow-thread-connections-{id(self)}"
        connection_created.connect(record, weak=False, dispatch_uid=uid)
        self.addCleanup(self._close_thread_connections, uid, opened)
        super().setUp()

    @staticmethod
    def _close_thread_connections(uid: str, opened: list) -> None:
        connection_created.disconnect(dispatch_uid=uid)
        for connection in opened:
            connection.inc_thread_sharing()  # it belongs to a thread that has ended
            try:
                with contextlib.suppress(DatabaseError):
                    connection.close()
            finally:
                connection.dec_thread_sharing()

"""Mapping Django database errors of the bus store to wow_django errors.

A lost connection, a PostgreSQL serialization failure or deadlock, a cancelled
or timed-out statement, and SQLite's "database is locked" are transient:
:class:`~wow_django.exceptions.RecoverableStoreError` (retrying may succeed).
A broken connection is closed when no transaction holds it, so the next call
of the store connects again. A missing bus table means the ``wow_bus``
migrations have not run on the database: ImproperlyConfigured says so.
Anything else is raised as it is.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError, ProgrammingError, connections

from wow_django.exceptions import RecoverableStoreError

# PostgreSQL SQLSTATEs after which a retry may succeed.
RECOVERABLE_SQLSTATES = frozenset({
    "40001",  # serialization_failure
    "40003",  # statement_completion_unknown
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown (pg_terminate_backend)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "57P05",  # idle_session_timeout
    "25P03",  # idle_in_transaction_session_timeout
    "53300",  # too_many_connections
})
RECOVERABLE_SQLSTATE_CLASSES = frozenset({"08"})  # connection_exception
UNDEFINED_TABLE = "42P01"

# SQLite primary result codes: SQLITE_BUSY, SQLITE_LOCKED.
RECOVERABLE_SQLITE_CODES = frozenset({5, 6})
RECOVERABLE_SQLITE_MESSAGES = ("database is locked", "database table is locked", "database is busy")

BUS_TABLE_PREFIX = "wow_bus_"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL driver error (psycopg 3 or 2), if it has one."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def is_recoverable(exc: BaseException) -> bool:
    """Whether a Django database error is transient (see the module docstring)."""
    if isinstance(exc, InterfaceError):  # the connection is closed or broken
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if isinstance(cause, sqlite3.OperationalError):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in RECOVERABLE_SQLITE_CODES
        return any(text in str(cause) for text in RECOVERABLE_SQLITE_MESSAGES)
    if cause is None or type(cause).__module__.split(".")[0] not in ("psycopg", "psycopg2"):
        return False
    state = sqlstate(cause)
    if state is None:  # no answer from the server: the connection was lost or never made
        return True
    return state in RECOVERABLE_SQLSTATES or state[:2] in RECOVERABLE_SQLSTATE_CLASSES


def is_missing_bus_table(exc: BaseException) -> bool:
    """Whether ``exc`` says a ``wow_bus_*`` table does not exist (the migrations have not run)."""
    if not isinstance(exc, (OperationalError, ProgrammingError)):
        return False
    cause = exc.__cause__
    text = str(cause if cause is not None else exc)
    if isinstance(cause, sqlite3.OperationalError):
        return text.startswith(f"no such table: {BUS_TABLE_PREFIX}")
    return sqlstate(cause) == UNDEFINED_TABLE and f'"{BUS_TABLE_PREFIX}' in text


def discard_broken_connection(using: str) -> None:
    """Close the connection of ``using`` in this thread if it no longer works and no transaction holds it."""
    connection = connections[using]
    if connection.connection is None or connection.in_atomic_block:
        return  # the transaction's owner rolls back; Django closes it then
    try:
        usable = connection.is_usable()
    except DatabaseError:
        usable = False
    if not usable:
        with contextlib.suppress(DatabaseError):
            connection.close()


@contextlib.contextmanager
def bus_store_errors(action: str, using: str) -> Iterator[None]:
    """Run one operation of the django bus store, mapping its database errors (see the module docstring)."""
    try:
        yield
    except DatabaseError as exc:
        if is_recoverable(exc):
            discard_broken_connection(using)
            raise RecoverableStoreError(
                f"{action} failed on database {using!r}: {str(exc).strip()} (transient; retrying may succeed)"
            ) from exc
        if is_missing_bus_table(exc):
            raise ImproperlyConfigured(
                f"{action} failed: the bus tables are missing on database {using!r} ({str(exc).strip()}). "
                f"Run `manage.py migrate wow_bus --database {using}`."
            ) from exc
        raise

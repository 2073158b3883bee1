"""Mapping database errors of the django backend to wow_django errors.

A unique violation is told apart by the constraint it hit: PostgreSQL names it
(``diag.constraint_name``); SQLite names the columns ("UNIQUE constraint
failed: wow_event_stream.aggregate_name, …"), which are matched to the
model's constraints. Where neither is available the caller confirms with a
read of the conflicting key (see ``DjangoEventStore``).

Transient failures become ``RecoverableStoreError``: a lost or refused
connection, an administrator's or a crash shutdown, a serialization failure
or a deadlock, a statement or lock timeout, a read-only primary after a
failover (PostgreSQL), and a busy or locked database (SQLite).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator

from django.db import IntegrityError, InterfaceError, InternalError, OperationalError, models
from django.db.backends.base.base import BaseDatabaseWrapper

from wow_django.backends.django.connection import discard_if_broken
from wow_django.exceptions import RecoverableStoreError

# SQLite result codes (the low byte of an extended code).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6

# PostgreSQL SQLSTATE classes after which a retry may succeed: connection
# exception, transaction rollback (serialization failure, deadlock),
# insufficient resources, operator intervention (shutdown, query canceled).
PG_RECOVERABLE_CLASSES = ("08", "40", "53", "57")
PG_RECOVERABLE_STATES = (
    "55P03",  # lock_not_available (lock_timeout)
    "25006",  # read_only_sql_transaction: connected to a standby (after a failover)
)

_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (?P<target>.+)$")
_SQLITE_INDEX = re.compile(r"index '(?P<name>[^']+)'")


def violated_constraint(exc: IntegrityError, model: type[models.Model]) -> str | None:
    """The name of the unique constraint of ``model`` that ``exc`` reports, or ``None``."""
    cause = exc.__cause__
    name = getattr(getattr(cause, "diag", None), "constraint_name", None)  # psycopg 3 and psycopg2
    if name:
        return name
    match = _SQLITE_UNIQUE.search(str(exc))
    if match is None:
        return None
    target = match.group("target").strip()
    index = _SQLITE_INDEX.fullmatch(target)
    if index is not None:
        return index.group("name")
    columns = tuple(part.strip().rpartition(".")[2] for part in target.split(","))
    for constraint in model._meta.constraints:
        fields = getattr(constraint, "fields", ())
        if fields and tuple(model._meta.get_field(f).column for f in fields) == columns:
            return constraint.name
    return None


def is_recoverable(exc: BaseException) -> bool:
    """Whether a retry of the failed operation may succeed."""
    if isinstance(exc, InterfaceError):  # e.g. "connection already closed"
        return True
    if not isinstance(exc, OperationalError | InternalError):
        return False
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
        return "locked" in str(cause)
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if state is None:
        # psycopg reports a lost, refused or timed-out connection without a SQLSTATE.
        return isinstance(exc, OperationalError)
    return state[:2] in PG_RECOVERABLE_CLASSES or state in PG_RECOVERABLE_STATES


@contextlib.contextmanager
def recoverable_errors(connection: BaseDatabaseWrapper, action: str) -> Iterator[None]:
    """Re-raise transient database failures as ``RecoverableStoreError``.

    A connection the server dropped is closed, so the next call opens a new one.
    """
    try:
        yield
    except (OperationalError, InterfaceError, InternalError) as exc:
        if not is_recoverable(exc):
            raise
        discard_if_broken(connection)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise RecoverableStoreError(
            f"{action} failed transiently ({type(cause).__name__}: {str(exc).strip()}); retry"
        ) from exc

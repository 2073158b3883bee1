"""Mapping database errors of the django backend to wow_django errors (every store of the backend).

A unique violation is told apart by the constraint it hit: PostgreSQL names it
(``diag.constraint_name``); SQLite names the columns ("UNIQUE constraint
failed: wow_event_stream.aggregate_name, …"), which are matched to the
model's constraints. Where neither is available the caller confirms with a
read of the conflicting key (see ``DjangoEventStore``).

:func:`store_errors` wraps every operation of a store:

* transient failures become ``RecoverableStoreError`` (:func:`is_recoverable`:
  a lost or refused connection, an administrator's or a crash shutdown, a
  serialization failure or a deadlock, a statement, lock or idle-session
  timeout, too many connections, a read-only primary after a failover on
  PostgreSQL; a busy or locked database on SQLite). A connection that no
  longer works is closed when no transaction holds it, so the next call of
  the store connects again;
* a missing table of the backend (``wow_django``'s or ``wow_bus``'s) means the
  app's migrations have not run on the database: ``ImproperlyConfigured``
  names the ``migrate`` command;
* anything else is raised as it is.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    InternalError,
    OperationalError,
    ProgrammingError,
    models,
)
from django.db.backends.base.base import BaseDatabaseWrapper

from wow_django.backends.django.connection import discard_if_broken
from wow_django.backends.django.meta import concrete_field
from wow_django.exceptions import RecoverableStoreError

# SQLite result codes (the low byte of an extended code).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
#: What an error without a result code says when the database is busy or locked.
SQLITE_RECOVERABLE_MESSAGES = ("locked", "database is busy")

# PostgreSQL SQLSTATE classes after which a retry may succeed: connection
# exception, transaction rollback (serialization failure, deadlock),
# insufficient resources (too many connections, out of memory), operator
# intervention (shutdown, query canceled by a statement timeout).
PG_RECOVERABLE_CLASSES = ("08", "40", "53", "57")
PG_RECOVERABLE_STATES = (
    "55P03",  # lock_not_available (lock_timeout)
    "25006",  # read_only_sql_transaction: connected to a standby (after a failover)
    "25P03",  # idle_in_transaction_session_timeout
)
PG_PERMANENT_STATES = (
    "53100",  # disk_full: a retry fails the same way until someone frees space
)
PG_UNDEFINED_TABLE = "42P01"
PG_DRIVERS = ("psycopg", "psycopg2")

#: The apps whose tables the backend's stores use, and the command that creates them.
BACKEND_APPS = ("wow_django", "wow_bus")

_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (?P<target>.+)$")
_SQLITE_INDEX = re.compile(r"index '(?P<name>[^']+)'")
_SQLITE_NO_TABLE = re.compile(r"no such table: (?:\w+\.)?(?P<table>\w+)")
_PG_NO_TABLE = re.compile(r'relation "(?:[^"]+\.)?(?P<table>[^".]+)" does not exist')


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
        if fields and tuple(concrete_field(model, f).column for f in fields) == columns:
            return constraint.name
    return None


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a PostgreSQL driver error (psycopg 3 or 2), if it has one."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def is_recoverable(exc: BaseException) -> bool:
    """Whether a retry of the failed operation may succeed (see the module docstring)."""
    if isinstance(exc, InterfaceError):  # e.g. "connection already closed"
        return True
    if not isinstance(exc, OperationalError | InternalError):
        return False
    cause = exc.__cause__
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
        return any(text in str(cause) for text in SQLITE_RECOVERABLE_MESSAGES)
    if cause is None or type(cause).__module__.split(".")[0] not in PG_DRIVERS:
        return False
    state = sqlstate(cause)
    if state is None:
        # psycopg reports a lost, refused or timed-out connection without a SQLSTATE.
        return isinstance(exc, OperationalError)
    if state in PG_PERMANENT_STATES:
        return False
    return state[:2] in PG_RECOVERABLE_CLASSES or state in PG_RECOVERABLE_STATES


def missing_table(exc: BaseException) -> str | None:
    """The table that ``exc`` says does not exist, or ``None``."""
    if not isinstance(exc, OperationalError | ProgrammingError):
        return None
    cause = exc.__cause__
    if isinstance(cause, sqlite3.OperationalError):
        match = _SQLITE_NO_TABLE.match(str(cause))
    elif sqlstate(cause) == PG_UNDEFINED_TABLE:
        match = _PG_NO_TABLE.search(str(cause))
    else:
        return None
    return match.group("table") if match else None


def backend_app_of(table: str) -> str | None:
    """The label of the backend app (:data:`BACKEND_APPS`) whose model has ``table``, or ``None``."""
    for label in BACKEND_APPS:
        try:
            config = apps.get_app_config(label)
        except LookupError:
            continue
        if any(model._meta.db_table == table for model in config.get_models()):
            return label
    return None


@contextlib.contextmanager
def store_errors(connection: BaseDatabaseWrapper, action: str) -> Iterator[None]:
    """Run one operation of a store on ``connection``, mapping its database errors (see the module docstring)."""
    try:
        yield
    except DatabaseError as exc:
        using = connection.alias
        if is_recoverable(exc):
            discard_if_broken(connection)
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise RecoverableStoreError(
                f"{action} failed on database {using!r} ({type(cause).__name__}: {str(exc).strip()}); "
                "transient, retrying may succeed"
            ) from exc
        table = missing_table(exc)
        app = backend_app_of(table) if table is not None else None
        if app is not None:
            raise ImproperlyConfigured(
                f"{action} failed: table {table} is missing on database {using!r} ({str(exc).strip()}). "
                f"Run `manage.py migrate {app} --database {using}`."
            ) from exc
        raise

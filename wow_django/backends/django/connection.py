"""The database connection a django-backend store works with.

* Which databases: PostgreSQL and SQLite (the stores use ``INSERT … ON
  CONFLICT … DO UPDATE … WHERE``, SQLite ≥ 3.24); any other engine is an
  ``ImproperlyConfigured`` when a store is built.
* Per thread: Django gives each thread its own connection of an alias. A
  thread other than the main one that uses a store gets its connection closed
  when it ends (Django closes a request's connections, nobody closes those of
  other threads: batching lanes, followers, bus consumers and relays, a test's worker
  threads). Every store of the backend takes its connection through :func:`database`.
* SQLite: every new connection of a store's alias runs in WAL mode with a busy
  timeout, so readers do not block the writer and writers of several
  processes wait for each other instead of failing at once.
* SQLite has one writer at a time. The threads of one process that write
  outside a transaction queue for it on a process-wide lock per database
  file (:func:`sqlite_writer`) instead of in SQLite's busy handler, which
  sleeps between retries (1 ms, 2 ms, 5 ms … 100 ms) and so leaves the file
  idle while they wait. A write inside the caller's transaction does not take
  the lock: that transaction may already hold the file, and waiting on the
  lock then would stall whoever holds the lock until the busy timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Iterator, Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.backends.utils import CursorWrapper

SUPPORTED_VENDORS = ("postgresql", "sqlite")

#: The least busy timeout of a SQLite connection (a longer ``OPTIONS['timeout']`` is kept).
SQLITE_BUSY_TIMEOUT_MS = 10_000

_sqlite_aliases: set[str] = set()
_sqlite_lock = threading.Lock()


def prepare_database(using: str) -> BaseDatabaseWrapper:
    """:func:`validate_database`, and for SQLite WAL mode and the busy timeout on each of the alias's connections."""
    connection = validate_database(using)
    if connection.vendor == "sqlite":
        _share_sqlite(using, connection)
    return connection


def validate_database(using: str) -> BaseDatabaseWrapper:
    """The wrapper of ``using`` if it is configured and PostgreSQL or SQLite; ``ImproperlyConfigured`` otherwise.

    Runs no query.
    """
    if not isinstance(using, str) or using not in connections.settings:
        configured = ", ".join(repr(alias) for alias in connections.settings)
        raise ImproperlyConfigured(
            f"The django storage backend uses database {using!r}, which is not in settings.DATABASES "
            f"({configured}). Set WOW['DATABASE_ALIAS'] to one of them."
        )
    connection = connections[using]
    if connection.vendor not in SUPPORTED_VENDORS:
        raise ImproperlyConfigured(
            f"The django storage backend needs PostgreSQL or SQLite; database {using!r} is "
            f"{connection.vendor} ({connection.settings_dict.get('ENGINE')}). Point WOW['DATABASE_ALIAS'] "
            "at a PostgreSQL or SQLite database, or use WOW['STORAGE'] = 'mongo'."
        )
    return connection


def database(using: str) -> BaseDatabaseWrapper:
    """The calling thread's connection of ``using``; closed when that thread ends (unless it is the main thread)."""
    connection = connections[using]
    if threading.current_thread() is not threading.main_thread():
        closer = getattr(_thread_state, "closer", None)
        if closer is None:
            closer = _thread_state.closer = _CloseAtThreadExit()
        closer.keep(using, connection)
    return connection


def discard_if_broken(connection: BaseDatabaseWrapper) -> None:
    """Close a connection the server dropped so that the next use opens a new one.

    Inside a transaction the connection is left alone: the transaction is lost
    either way, and leaving the ``atomic`` block deals with it.
    """
    if connection.connection is None or connection.in_atomic_block:
        return
    try:
        usable = connection.is_usable()
    except DatabaseError:
        usable = False
    if not usable:
        try:
            connection.close()
        except DatabaseError:
            connection.connection = None


# --- reads on the hot path --------------------------------------------------------------------

_running_loop = asyncio.events._get_running_loop


def _django_original(function):
    """``function`` if it is Django's own (not a replacement a tool installed before this module was imported)."""
    return function if function.__module__.startswith("django.") else None


#: Django's cursor and CursorWrapper.execute as Django defines them (None: replaced already at import).
_DJANGO_EXECUTE = _django_original(CursorWrapper.execute)
_DJANGO_CURSOR = _django_original(BaseDatabaseWrapper.cursor)
_QMARKS: dict[str, str] = {}
_FORMAT = re.compile(r"(?<!%)%s")


def _qmark(sql: str) -> str:
    """``sql`` with SQLite's placeholders, as Django's SQLite cursor writes them (``%s`` → ``?``, ``%%`` → ``%``)."""
    converted = _QMARKS.get(sql)
    if converted is None:
        converted = _QMARKS[sql] = _FORMAT.sub("?", sql).replace("%%", "%")
    return converted


def _django_is_alone(connection: BaseDatabaseWrapper) -> bool:
    """Whether nothing hooks Django's cursors of ``connection``: no ``execute_wrapper``, no query logging
    (``DEBUG``, ``CaptureQueriesContext``), no health check due, no tool that replaced Django's cursor or its
    ``execute`` (Sentry patches ``CursorWrapper.execute`` for its SQL spans, django-debug-toolbar sets each
    connection's ``cursor``), and no running event loop in this thread (Django's cursor refuses that with
    ``SynchronousOnlyOperation``, unless ``DJANGO_ALLOW_ASYNC_UNSAFE``)."""
    return not (
        connection.execute_wrappers or connection.queries_logged
        or (connection.health_check_enabled and not connection.health_check_done)  # type: ignore[attr-defined]
        or CursorWrapper.execute is not _DJANGO_EXECUTE or type(connection).cursor is not _DJANGO_CURSOR
        or _cursor_replaced(connection)
        or (_running_loop() is not None and not os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"))
    )


def _cursor_replaced(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` has a ``cursor`` of its own other than Django's bound method (Django's test cases
    leave that bound method on connections they once refused; anything else is a hook, or that refusal
    itself, which Django's cursor then raises)."""
    own = vars(connection).get("cursor")
    return own is not None and getattr(own, "__func__", None) is not _DJANGO_CURSOR


def fetch(connection: BaseDatabaseWrapper, sql: str, params: Sequence, *, one: bool = False):
    """The rows (``one``: the first row or None) of one read statement ``sql`` (``%s`` placeholders).

    A store's hot reads (loading an aggregate's streams, its snapshot, its snapshot and tail) go straight to
    the driver's cursor when the connection is open and nothing hooks Django's cursors (see
    :func:`_django_is_alone`): Django's cursor wrapper, its placeholder rewrite on SQLite and its checks cost
    about as much Python as decoding the rows. Everything else Django does for a statement still happens,
    in its order: the cursor is made, the thread-sharing and broken-transaction checks run, and the driver's
    errors become Django's (which also marks the connection for ``close_if_unusable_or_obsolete``).
    Otherwise the statement goes through ``connection.cursor()`` as usual.

    Not for ``timestamptz`` columns: Django's PostgreSQL cursors apply the connection's time zone to those
    (the hot reads select integers, text and JSON).
    """
    raw = connection.connection
    if raw is None or not _django_is_alone(connection):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
    with connection.wrap_database_errors:  # a connection the server or the driver closed fails here
        cursor = raw.cursor()
    try:
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        if connection.vendor == "sqlite":
            sql = _qmark(sql)
        with connection.wrap_database_errors:
            cursor.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
    finally:
        try:
            cursor.close()
        except connection.Database.Error:  # type: ignore[attr-defined]  # as Django's cursor wrapper does
            pass


# --- per-thread connections -------------------------------------------------------------------

_thread_state = threading.local()


class _CloseAtThreadExit:
    """Lives in a thread-local: when the thread ends and its locals go, it closes the connections it kept."""

    def __init__(self) -> None:
        self.connections: dict[str, BaseDatabaseWrapper] = {}

    def keep(self, using: str, connection: BaseDatabaseWrapper) -> None:
        if self.connections.get(using) is not connection:
            self.connections[using] = connection

    def __del__(self) -> None:
        for connection in self.connections.values():
            try:
                if connection.connection is None:
                    continue
                connection.inc_thread_sharing()  # the finalizer may run outside the owning thread
                try:
                    connection.close()
                finally:
                    connection.dec_thread_sharing()
            except Exception:  # a finalizer must not raise; the server ends the session anyway
                pass


# --- SQLite -------------------------------------------------------------------------------------


def _share_sqlite(using: str, connection: BaseDatabaseWrapper) -> None:
    with _sqlite_lock:
        if using not in _sqlite_aliases:
            _sqlite_aliases.add(using)
            connection_created.connect(_on_connection_created, dispatch_uid="wow_django.backends.django.sqlite")
    if connection.connection is not None:  # already open in this thread: the signal has passed
        configure_sqlite(connection.connection)


def _on_connection_created(sender, connection, **kwargs) -> None:
    if connection.vendor == "sqlite" and connection.alias in _sqlite_aliases:
        configure_sqlite(connection.connection)


_writer_locks: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def sqlite_writer(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Around a write: on SQLite outside a transaction, this process's lock of the database file; else nothing."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        yield
        return
    name = str(connection.settings_dict["NAME"])
    lock = _writer_locks.get(name)
    if lock is None:
        with _sqlite_lock:
            lock = _writer_locks.setdefault(name, threading.Lock())
    with lock:
        yield


def _new_writer_locks_in_child() -> None:
    # A lock held by another thread of the parent at the fork would stay held in the child forever.
    global _sqlite_lock
    _sqlite_lock = threading.Lock()
    _writer_locks.clear()


def configure_sqlite(raw) -> None:
    """WAL journal and a busy timeout ≥ :data:`SQLITE_BUSY_TIMEOUT_MS` on a ``sqlite3`` connection."""
    current = raw.execute("PRAGMA busy_timeout").fetchone()[0]
    if current < SQLITE_BUSY_TIMEOUT_MS:
        raw.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_MS)}")
    # Persistent in the file; a no-op when already set; in-memory databases stay "memory". SQLite refuses
    # it inside a transaction (a store first built in a Django TestCase): the next connection sets it.
    if not raw.in_transaction:
        raw.execute("PRAGMA journal_mode = WAL")


# --- fork ---------------------------------------------------------------------------------------

#: Driver connections a forked child inherited from its parent: kept (never used, never finalized
#: while the child lives) so that nothing the child does reaches the parent's database session.
_inherited: list[object] = []


def after_fork() -> None:
    """In a forked child (gunicorn ``--preload``, Celery prefork, ``multiprocessing``): forget the
    database connections the forking thread had open, so the child opens its own.

    A connection copied by ``fork`` shares its socket with the parent; a query from the child would
    interleave with the parent's on one session, and closing it — which Celery's Django fixup and
    ``close_old_connections`` do in a new child — would end the parent's session (PostgreSQL's
    terminate message). So the wrapper forgets it unclosed: on PostgreSQL the child's copy of the
    socket descriptor is also pointed at ``/dev/null`` (the parent's socket is untouched; whatever
    the driver might still write goes nowhere), and the driver object is kept until the child
    exits. Django's wrapper opens a new connection on first use. The SQLite writer locks are new too
    (one held by another thread of the parent at the fork would stay held in the child forever).
    """
    _new_writer_locks_in_child()
    for wrapper in connections.all(initialized_only=True):
        raw = wrapper.connection
        if raw is None:
            continue
        if wrapper.vendor == "postgresql":
            _blind(raw)
        _inherited.append(raw)
        wrapper.connection = None
        wrapper.in_atomic_block = False
        wrapper.needs_rollback = False
        wrapper.savepoint_ids = []
        wrapper.run_on_commit = []


def _blind(raw) -> None:
    """Point the child's descriptor of a PostgreSQL connection's socket at ``/dev/null``."""
    try:
        pgconn = getattr(raw, "pgconn", None)  # psycopg 3
        fd = pgconn.socket if pgconn is not None else raw.fileno()  # psycopg2
    except Exception:  # already broken: nothing of the parent's left to protect
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)

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

import contextlib
import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

logger = logging.getLogger("wow_django.backends.django.connection")

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

_QMARKS: dict[str, str] = {}
_FORMAT = re.compile(r"(?<!%)%s")


def _qmark(sql: str) -> str:
    """``sql`` with SQLite's placeholders, as Django's SQLite cursor writes them (``%s`` → ``?``, ``%%`` → ``%``)."""
    converted = _QMARKS.get(sql)
    if converted is None:
        converted = _QMARKS[sql] = _FORMAT.sub("?", sql).replace("%%", "%")
    return converted


def fetch(connection: BaseDatabaseWrapper, sql: str, params: Sequence, *, one: bool = False):
    """The rows (``one``: the first row or None) of one read statement ``sql`` (``%s`` placeholders).

    A store's hot reads (loading an aggregate's streams, its snapshot and tail) go straight to the driver's
    cursor when nothing of Django's is watching the connection's statements: no ``execute_wrapper`` is
    installed, queries are not logged (``DEBUG``, ``CaptureQueriesContext``), no health check is due, and the
    connection is open. Django's cursor wrapper, its placeholder rewrite on SQLite and its checks cost
    about as much Python as decoding the rows. Everything else Django does for a statement still happens:
    the thread-sharing and broken-transaction checks, and the mapping of driver errors to Django's (which
    also marks the connection for ``close_if_unusable_or_obsolete``). Otherwise, and whenever someone
    watches, the statement goes through ``connection.cursor()`` as usual.

    On PostgreSQL, outside a transaction, such a read runs as a statement prepared on the server session
    (see :class:`_Prepared`): the server skips parsing and planning it again.
    """
    raw = connection.connection
    if (raw is None or connection.execute_wrappers or connection.queries_logged
            or (connection.health_check_enabled and not connection.health_check_done)):  # type: ignore[attr-defined]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
    # In the order of Django's cursor: a connection the server closed fails here (a DatabaseError the stores
    # call recoverable), before a transaction broken by that failure is refused.
    with connection.wrap_database_errors:
        cursor = raw.cursor()
    try:
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        vendor = connection.vendor
        with connection.wrap_database_errors:
            if vendor == "sqlite":
                cursor.execute(_qmark(sql), params)
            elif raw.autocommit and _Prepared.suits(connection):
                rows = _Prepared.of(sql).rows(connection, cursor, params)
                return (rows[0] if rows else None) if one else rows
            else:
                cursor.execute(sql, params)
            return cursor.fetchone() if one else cursor.fetchall()
    finally:
        cursor.close()


class _Prepared:
    """A read statement prepared on PostgreSQL server sessions under a name taken from its text.

    Django sends every statement unprepared by default (``prepare_threshold`` None): the server parses and
    plans each one again, which on a load of a few rows is most of the server's work. psycopg's own
    prepared statements (Django's ``OPTIONS``) are named per client connection (``_pg3_0``, ``_pg3_1``…), so
    behind a pooler that hands one server session to several clients (PgBouncer in transaction mode) a name
    can mean another client's statement: an error, or another query's rows. These are SQL-level
    ``PREPARE``/``EXECUTE`` instead, named ``wow_`` + a hash of the statement's text: a name found on a
    session is always this very statement, whoever prepared it there.

    * ``EXECUTE`` only where a failure costs nothing: in autocommit (outside any transaction) and with
      Django's default client-side binding (with ``server_side_binding``, psycopg's own preparing applies).
    * Not prepared on a session, or no longer (a pooler's other session, ``DISCARD ALL``, ``DEALLOCATE``,
      a plan the schema made stale): the plain statement answers, and ``PREPARE`` follows for next time.
      The client remembers per connection what it prepared, so a new connection's first read costs one
      more statement, never a failed one.
    """

    _all: dict[str, _Prepared] = {}

    def __init__(self, sql: str):
        numbers = iter(range(1, 10_000))
        body = re.sub(r"%%|%s", lambda m: "%" if m.group() == "%%" else f"${next(numbers)}", sql)
        self.name = f"wow_{hashlib.blake2b(body.encode(), digest_size=12).hexdigest()}"
        self.unpreparable = f"-{self.name}"
        self.sql = sql
        self.prepare_sql = f"PREPARE {self.name} AS {body}"
        arguments = ", ".join(["%s"] * (next(numbers) - 1))
        self.execute_sql = f"EXECUTE {self.name}({arguments})" if arguments else f"EXECUTE {self.name}"

    @classmethod
    def of(cls, sql: str) -> _Prepared:
        prepared = cls._all.get(sql)
        if prepared is None:
            prepared = cls._all[sql] = cls(sql)
        return prepared

    @staticmethod
    def suits(connection: BaseDatabaseWrapper) -> bool:
        """Whether the connection binds on the client (Django's default, as Django itself decides): an
        ``EXECUTE`` with literal arguments. With ``server_side_binding``, psycopg's own preparing applies."""
        return connection.settings_dict["OPTIONS"].get("server_side_binding") is not True

    def rows(self, connection: BaseDatabaseWrapper, cursor, params: Sequence) -> list:
        """The statement's rows on ``cursor`` (autocommit): executed as prepared where this client prepared it.

        The driver's errors are told by SQLSTATE (psycopg's ``sqlstate``, psycopg2's ``pgcode``).
        """
        known = _prepared_on(connection)
        stale = False
        if self.name in known:
            try:
                cursor.execute(self.execute_sql, params)
                return cursor.fetchall()
            except Exception as exc:
                state = _sqlstate(exc)
                if state not in (INVALID_SQL_STATEMENT_NAME, FEATURE_NOT_SUPPORTED):
                    raise
                # Not on this session (any more), or its plan no longer fits the table: plain, then again.
                known.discard(self.name)
                stale = state == FEATURE_NOT_SUPPORTED
        cursor.execute(self.sql, params)
        rows = cursor.fetchall()
        if self.unpreparable not in known:
            try:
                if stale:
                    cursor.execute(f"DEALLOCATE {self.name}")
                cursor.execute(self.prepare_sql)
                known.add(self.name)
            except Exception as exc:
                if _sqlstate(exc) == DUPLICATE_PREPARED_STATEMENT:
                    known.add(self.name)  # already on this session: the same name is the same text
                elif _sqlstate(exc) is None:
                    raise  # not the server's answer
                else:  # a session that refuses PREPARE: this connection reads the statement plain
                    logger.info("statement %s not prepared, read unprepared on this connection: %s", self.name, exc)
                    known.add(self.unpreparable)
        return rows


#: SQLSTATEs of the prepared reads: no such prepared statement, a cached plan that must not change its
#: result type (the schema changed under it), a name already prepared on the session.
INVALID_SQL_STATEMENT_NAME = "26000"
FEATURE_NOT_SUPPORTED = "0A000"
DUPLICATE_PREPARED_STATEMENT = "42P05"


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def _prepared_on(connection: BaseDatabaseWrapper) -> set[str]:
    """The statement names this client prepared on ``connection``'s current driver connection."""
    raw = connection.connection
    state = getattr(connection, "_wow_prepared", None)
    if state is None or state[0] is not raw:
        state = connection._wow_prepared = (raw, set())  # type: ignore[attr-defined]
    return state[1]


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

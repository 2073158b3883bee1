"""Event store on the Django ORM: one ``INSERT`` per append, or per batch of concurrent appends (DESIGN part A).

Optimistic concurrency and idempotency come from the unique constraints of
``wow_event_stream`` (see :mod:`wow_django.backends.django.models`); this
class only tells which one refused a stream: by the constraint's name for an
append, by one read of the refused streams' keys for a batch (whose single
statement skips conflicts instead of failing).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
import sqlite3
import threading
from collections.abc import Sequence
from types import EllipsisType
from typing import cast

from django.db import DataError, IntegrityError, OperationalError, transaction

from wow_django.backends.django.connection import database, fetch, prepare_database, sqlite_writer
from wow_django.backends.django.errors import store_errors, violated_constraint
from wow_django.backends.django.meta import concrete_field
from wow_django.backends.django.models import CanonicalJSONEncoder, EventStreamRow, StreamContextRow
from wow_django.conf import wow_settings
from wow_django.domain.values import loads
from wow_django.exceptions import (
    ContextLockTimeout,
    DuplicateAggregateId,
    DuplicateEventStreamId,
    DuplicateRequestId,
    EventStoreError,
    EventVersionConflict,
    RecoverableStoreError,
    SchemaConflictError,
)
from wow_django.persistence.combining import TIMED_OUT, BatchFailed, Combiner
from wow_django.persistence.contracts import EventStore, check_scan_args, check_time_range, check_version_range
from wow_django.persistence.followers import AppendNotifier
from wow_django.persistence.records import MAX_VERSION, AggregateId, EventStream, stored_events, stored_stream

#: What a violated constraint means.
CONSTRAINT_KINDS = {
    "wow_stream_agg_version_uniq": "version",
    "wow_stream_agg_request_uniq": "request",
    "wow_stream_scope_request_uniq": "request",
    "wow_stream_id_uniq": "id",
}

# What a read selects: not the aggregate's name and id, which the query fixes (``=`` on code-point text).
STREAM_COLUMNS = _COLUMNS = ("stream_id", "context_name", "tenant_id", "owner_id", "request_id", "command_id", "version", "header",
            "body", "create_time")


_INSERT_FIELDS = [field for field in EventStreamRow._meta.concrete_fields if not field.primary_key]
_JSON_FIELDS = {"header", "body"}
_encode_json = CanonicalJSONEncoder().encode
# What RETURNING gives back to tell the inserted streams of a batch.
_IDENTITY = ("stream_id", "aggregate_name", "aggregate_id", "version")


logger = logging.getLogger("wow_django.backends.django.event_store")

def _identity(stream: EventStream) -> tuple:
    return stream.id, stream.aggregate_name, stream.aggregate_id.id, stream.version


def _conflict_error(kind: str, stream: EventStream) -> EventStoreError:
    agg = stream.aggregate_id
    if kind == "version":
        if stream.version == 1:
            return DuplicateAggregateId(agg.aggregate_name, agg.id)
        return EventVersionConflict(agg.aggregate_name, agg.id, stream.version)
    if kind == "request":
        return DuplicateRequestId(agg.aggregate_name, agg.id, stream.request_id)
    return DuplicateEventStreamId(f"event stream {stream.id!r} was already appended")


def _json(value):
    """A JSON column's value: Django's connections hand JSON to the ORM as text."""
    return loads(value) if isinstance(value, str | bytes) else value


def decode_json_columns(found: list[tuple]) -> list:
    """The header and body of each row, decoded: [header0, body0, header1, body1, ...].

    The columns come as JSON text, so one ``json.loads`` of their array reads
    every row at once (per call, the decoder's overhead is most of the cost of
    a small document); a connection that hands decoded values gets them as they are.
    """
    texts = [text for row in found for text in row[7:9]]
    if all(isinstance(text, str) for text in texts):
        return loads("[" + ",".join(texts) + "]")
    return [_json(text) for text in texts]


def streams_of(aggregate_id: AggregateId, found: Sequence[Sequence], *, decoded: bool = False) -> list[EventStream]:
    """The streams of the rows of ``aggregate_id`` (in :data:`STREAM_COLUMNS` order) that a read found; with
    ``decoded``, rows whose header and body are decoded already."""
    texts = None if decoded else decode_json_columns(found)  # type: ignore[arg-type]
    ids = {(aggregate_id.context_name, aggregate_id.tenant_id): aggregate_id}
    streams = []
    for index, (stream_id, context_name, tenant_id, owner_id, request_id, command_id, version, header, body,
                create_time) in enumerate(found):
        if texts is not None:
            header, body = texts[2 * index], texts[2 * index + 1]
        agg = ids.get((context_name, tenant_id))
        if agg is None:  # stored under another context or tenant than the caller's id says
            agg = ids[context_name, tenant_id] = AggregateId(
                aggregate_name=aggregate_id.aggregate_name, id=aggregate_id.id, context_name=context_name,
                tenant_id=tenant_id)
        streams.append(stored_stream(stream_id, agg, version, stored_events(body), request_id, command_id,
                                     owner_id, header, create_time))
    return streams


_by_version = operator.itemgetter(_COLUMNS.index("version"))


def _milliseconds(seconds: float) -> str:
    """A PostgreSQL duration for ``seconds`` (at least 1 ms: 0 would mean no limit)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _lock_waited(exc: OperationalError) -> bool:
    """Whether ``exc`` is a lock wait that ran out (PostgreSQL 55P03 lock_not_available, SQLite busy/locked)."""
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "55P03":
        return True
    return type(cause).__module__.startswith("sqlite3") and "locked" in str(exc).lower()



def _own_copy(error: BaseException) -> BaseException:
    """A copy of ``error`` for one more caller to raise (an exception raised in several threads at once would
    share one traceback); the error itself where it cannot be copied."""
    try:
        return copy.copy(error)
    except Exception:
        return error


def _unstorable(stream: EventStream, exc: DataError) -> EventStoreError:
    """The error for a stream the database refuses (a value it cannot store): what was refused, not the
    database's text (parts of the statement), which goes to the log."""
    logger.warning("event stream %r refused by the database: %s: %s", stream.id, type(exc).__name__, exc)
    error = EventStoreError(f"event stream {stream.id!r} cannot be stored: a value the database refuses "
                            "(e.g. a NUL character, a number out of range)")
    error.__cause__ = exc
    return error

class DjangoEventStore(EventStore):
    """Event streams of every aggregate type in ``wow_event_stream`` of database ``using``.

    ``request_id_index``: ``"aggregate"`` makes a request id unique per
    aggregate, ``"global"`` per aggregate type (``WOW['REQUEST_ID_INDEX']``).
    """

    #: Whether :meth:`append_many` may use one statement per chunk (tests turn it off to check the other way).
    one_statement = True

    def __init__(self, using: str = "default", *, request_id_index: str = "aggregate",
                 lock_timeout_s: float | None | EllipsisType = ..., combine: bool = True):
        #: How long an append waits for its context's lock; ``...``: ``WOW['APPEND_LOCK_TIMEOUT_S']`` at each append.
        self.lock_timeout_s = lock_timeout_s
        if request_id_index not in ("aggregate", "global"):
            raise ValueError(f"request_id_index must be 'aggregate' or 'global', got {request_id_index!r}")
        connection = prepare_database(using)
        self.using = using
        quote = connection.ops.quote_name
        self._names = {field.name: quote(field.column) for field in EventStreamRow._meta.concrete_fields}
        self._select_sql = (
            f"SELECT {', '.join('{' + column + '}' for column in _COLUMNS)} "
            f"FROM {quote(EventStreamRow._meta.db_table)} "
            # The tenant too: another tenant's aggregate id finds nothing (defence in depth behind the callers).
            f"WHERE {{aggregate_name}} = %s AND {{aggregate_id}} = %s AND {{tenant_id}} = %s"
        )
        # SQLite with its JSON functions built in: a load by version reads the rows as one JSON array (one
        # step of the statement, one C decode), not a row at a time (each step gives the GIL away and back).
        self._json_read_sql: str | None = None
        if connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 38):
            names = self._names
            values = ", ".join(f"json({names[c]})" if c in _JSON_FIELDS else names[c] for c in _COLUMNS)
            self._json_read_sql = (f"SELECT json_group_array(json_array({values})) FROM ("
                                   f"{self._select_sql.format_map(names)} {{condition}} ORDER BY {names['version']})")
        self._insert_head = (f"INSERT INTO {quote(EventStreamRow._meta.db_table)} "
                             f"({', '.join(quote(field.column) for field in _INSERT_FIELDS)})")
        self._insert_sql = self._insert_head + " VALUES "
        self._row_sql = "(" + ", ".join(["%s"] * len(_INSERT_FIELDS)) + ")"
        # PostgreSQL: each insert first locks its contexts' rows of wow_stream_context (see _locked).
        self._serialise = connection.vendor == "postgresql"
        if self._serialise:
            self._typed_row_sql = "(" + ", ".join(f"%s::{field.db_type(connection)}" for field in _INSERT_FIELDS) + ")"
            context_table = quote(StreamContextRow._meta.db_table)
            self._lock_sql = (f"INSERT INTO {context_table} ({quote('context_name')}, {quote('appends')}) VALUES {{}} "
                              f"ON CONFLICT ({quote('context_name')}) DO UPDATE SET {quote('appends')} = "
                              f"{context_table}.{quote('appends')} + 1")
            # The same lock bounded by APPEND_LOCK_TIMEOUT_S within the one statement: the contexts' rows are
            # joined to set_config's answer, so lock_timeout is set (for this statement's transaction) before
            # any row is inserted and its lock waited for. One round trip, committed as one statement.
            self._bounded_lock_sql = (
                f"INSERT INTO {context_table} ({quote('context_name')}, {quote('appends')}) "
                f"SELECT wow_ctx.name, 1 FROM (SELECT set_config('lock_timeout', %s, true)) AS wow_cfg(lock_timeout), "
                f"(VALUES {{}}) AS wow_ctx(name) ORDER BY wow_ctx.name "
                f"ON CONFLICT ({quote('context_name')}) DO UPDATE SET {quote('appends')} = "
                f"{context_table}.{quote('appends')} + 1")
        self.append_notifier = AppendNotifier()
        self.request_id_index = request_id_index
        self._global = request_id_index == "global"
        self._scopes_checked: set[str] = set()
        self._read_sql: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        #: Whether concurrent appends outside a transaction are written together (see :meth:`append`).
        self.combine = combine
        self._combiners: dict[tuple, Combiner] = {}

    def _rows(self):
        return EventStreamRow.objects.using(self.using)

    def queryset(self, aggregate_name: str):
        """The rows of one aggregate type (what the query services compile against)."""
        return self._rows().filter(aggregate_name=aggregate_name)

    def _values(self, stream: EventStream) -> list:
        """The row of ``stream`` in the order of :data:`_INSERT_FIELDS`, JSON columns as canonical JSON text.

        Text suits both engines (PostgreSQL casts it to ``jsonb``, as a column
        of the insert), and encoding here, with one encoder, spares building an
        encoder per value; a body that is not JSON is a ``TypeError``/``ValueError``
        before any statement runs, on either engine.
        """
        agg = stream.aggregate_id
        row = {
            "stream_id": stream.id, "context_name": agg.context_name, "aggregate_name": agg.aggregate_name,
            "aggregate_id": agg.id, "tenant_id": agg.tenant_id, "owner_id": stream.owner_id,
            "request_id": stream.request_id, "request_scope": "" if self._global else agg.id,
            "command_id": stream.command_id, "version": stream.version, "header": dict(stream.header),
            "body": [{"id": e.id, "name": e.name, "revision": e.revision, "bodyType": e.body_type, "body": e.body}
                     for e in stream.body],
            "size": len(stream.body), "create_time": stream.create_time,
        }
        return [_encode_json(row[field.attname]) if field.attname in _JSON_FIELDS else row[field.attname]
                for field in _INSERT_FIELDS]

    # --- the request-id mode ----------------------------------------------------------------------

    def _check_scope(self, aggregate_name: str) -> None:
        """In "global" mode, refuse a type whose stored rows were written in "aggregate" mode (once per type)."""
        if not self._global or aggregate_name in self._scopes_checked:
            return
        connection = database(self.using)
        with store_errors(connection, f"checking the request-id mode of {aggregate_name}"):
            scoped = self._rows().filter(aggregate_name=aggregate_name, request_scope__gt="").exists()
        if scoped:
            raise SchemaConflictError(
                f"WOW['REQUEST_ID_INDEX'] is 'global' but event streams of {aggregate_name!r} in database "
                f"{self.using!r} were stored in 'aggregate' mode, so their request ids are only unique per "
                "aggregate. Move them into the global scope (this fails if a request id repeats across "
                f"aggregates): UPDATE wow_event_stream SET request_scope = '' WHERE aggregate_name = "
                f"'{aggregate_name}'; or set REQUEST_ID_INDEX back to 'aggregate'."
            )
        with self._lock:
            self._scopes_checked.add(aggregate_name)

    # --- writes -------------------------------------------------------------------------------------

    def append(self, stream: EventStream) -> None:
        """Store ``stream``; outside a transaction, together with other threads' concurrent appends.

        Inside the caller's transaction (or with autocommit off) the stream is
        inserted there, alone (under a savepoint). Outside one, and unless
        ``combine`` is off (``WOW['EVENT_STORE_COMBINE']``), concurrent appends
        of this process to one context are written together by one of their
        threads on its connection (see :mod:`wow_django.persistence.combining`):
        one statement and one commit for all of them, each stream refused or
        stored on its own as if alone. A lone append is written at once.

        What a combined write cannot tell apart, every caller of it gets as
        its own :class:`RecoverableStoreError` (the batch may have been stored,
        as when a lone append's answer is lost). A queued append gives up
        (:class:`ContextLockTimeout`, nothing stored) when no write of its
        context finished for ``APPEND_LOCK_TIMEOUT_S``.
        """
        self._check_scope(stream.aggregate_name)
        connection = database(self.using)
        values = self._values(stream)  # encoded in the caller's thread: a bad body fails here, alone
        agg = stream.aggregate_id
        action = f"appending {agg.aggregate_name} {agg.id!r} v{stream.version}"
        alone = True
        if self.combine:
            with store_errors(connection, action):  # get_autocommit connects: an unreachable database
                alone = connection.in_atomic_block or not connection.get_autocommit()
        if alone:
            self._append_one(connection, stream, values)
            return
        timeout = self._timeout()
        result = self._combiner(agg.context_name, connection).submit((stream, values), timeout=timeout)
        if result is TIMED_OUT:
            raise ContextLockTimeout(
                f"an append waited behind other appends of this process to context {agg.context_name!r} "
                f"on database {self.using!r}, and no write of them finished for {timeout}s (one holds or "
                "waits for the context's lock). Nothing was stored; retry with the same request id. "
                "WOW['APPEND_LOCK_TIMEOUT_S'] sets the wait.")
        if isinstance(result, BatchFailed):
            if result.by_this_thread:  # this thread's own write failed: its error, as when alone
                raise result.error
            # Another thread's write of this append failed as a whole (the schema is missing, the disk is
            # full, a bug): the same error, as this append alone would have met it; its own copy.
            raise _own_copy(result.error) from result.error
        if result is not None:
            raise cast(Exception, result)

    def _combiner(self, context_name: str, connection) -> Combiner:
        """The combiner of ``context_name`` for connections like ``connection``: those of one PostgreSQL
        schema (``schema_name``, as django-tenants sets it on the connection) are written together only."""
        key = (context_name, getattr(connection, "schema_name", None))
        combiner = self._combiners.get(key)
        if combiner is None:
            with self._lock:
                combiner = self._combiners.setdefault(key, Combiner(self._write_combined))
        return combiner

    def _write_combined(self, items: list[tuple[EventStream, list]]) -> list[Exception | None]:
        """A batch of :meth:`append` calls, written in this (one of their) thread(s): one result each."""
        connection = database(self.using)
        streams = [stream for stream, _ in items]
        values = [v for _, v in items]
        results: list[Exception | None] = [None] * len(items)
        indexes = list(range(len(items)))
        if len(items) == 1:  # its one caller gets what it would alone
            self._insert_alone(connection, streams, indexes, results, values)
            return results
        if self.one_statement and connection.features.can_return_columns_from_insert:
            self._insert_together(connection, streams, indexes, results, values=values)
        else:
            self._insert_alone(connection, streams, indexes, results, values)
        for index, result in enumerate(results):
            if isinstance(result, RecoverableStoreError):
                # One error for the whole write (a lock timeout, a lost connection or answer): each caller
                # raises its own copy, caused by what the database said.
                own = cast(RecoverableStoreError, _own_copy(result))
                own.__cause__ = result.__cause__
                results[index] = own
        return results

    def _insert_alone(self, connection, streams: Sequence[EventStream], indexes: list[int],
                      results: list[Exception | None], values: Sequence[list]) -> None:
        """Each stream of a combined write in a statement of its own (as :meth:`_append_one`, each bounded by
        the lock timeout): a write of one, or when their one statement failed for one of them. Once the
        context's lock timed out, the rest get that timeout without waiting again (the same error object:
        :meth:`_write_combined` gives each caller its copy)."""
        timed_out: ContextLockTimeout | None = None
        for index in indexes:
            if timed_out is not None:
                results[index] = timed_out
                continue
            try:
                self._append_one(connection, streams[index], values[index])
            except ContextLockTimeout as exc:
                results[index] = timed_out = exc
            except (EventStoreError, RecoverableStoreError) as exc:
                results[index] = exc

    def _append_one(self, connection, stream: EventStream, values: list) -> None:
        agg = stream.aggregate_id
        try:
            with store_errors(connection, f"appending {agg.aggregate_name} {agg.id!r} v{stream.version}"):
                # Inside the caller's transaction a savepoint keeps a conflict from breaking it.
                atomic = transaction.atomic(using=self.using) if connection.in_atomic_block else contextlib.nullcontext()
                with sqlite_writer(connection), self._bounded(connection, atomic) as cursor:
                    cursor.execute(*self._locked([stream], values))
        except IntegrityError as exc:
            raise self._conflict(connection, stream, exc) from exc
        except DataError as exc:
            raise _unstorable(stream, exc) from exc
        self._appended(connection)

    def _timeout(self) -> float | None:
        return wow_settings.APPEND_LOCK_TIMEOUT_S if self.lock_timeout_s is ... else self.lock_timeout_s

    @contextlib.contextmanager
    def _bounded(self, connection, atomic):
        """A cursor inside ``atomic`` whose statements wait at most :meth:`_timeout` for the context's lock.

        PostgreSQL: the append's own statement sets ``lock_timeout`` (see :meth:`_locked`), so on its own it
        stays one autocommitted statement; inside a caller's transaction the caller's value is put back after.
        SQLite: the connection's busy timeout, put back afterwards. Waiting longer raises
        :class:`ContextLockTimeout`.
        """
        timeout = self._timeout()
        if timeout is None or connection.vendor not in ("postgresql", "sqlite"):
            with atomic, connection.cursor() as cursor:
                yield cursor
            return
        try:
            if connection.vendor == "postgresql":
                with atomic, connection.cursor() as cursor:
                    if connection.in_atomic_block:
                        cursor.execute("SELECT current_setting('lock_timeout')")
                        previous = cursor.fetchone()[0]
                        yield cursor
                        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
                    else:
                        yield cursor
            else:
                with atomic, connection.cursor() as cursor:
                    connection.ensure_connection()
                    raw = connection.connection
                    previous = raw.execute("PRAGMA busy_timeout").fetchone()[0]
                    raw.execute(f"PRAGMA busy_timeout = {max(1, round(timeout * 1000))}")
                    try:
                        yield cursor
                    finally:
                        raw.execute(f"PRAGMA busy_timeout = {int(previous)}")
        except OperationalError as exc:
            if not _lock_waited(exc):
                raise
            raise ContextLockTimeout(
                f"an append waited {timeout}s for its context's lock on database {self.using!r} "
                f"({type(exc.__cause__ or exc).__name__}: {str(exc).strip()}): another writer "
                "holds it in a transaction that has not committed (a hung process, a long ATOMIC_REQUESTS "
                "request). Nothing was stored; retry with the same request id. "
                "WOW['APPEND_LOCK_TIMEOUT_S'] sets the wait.") from exc

    def _locked(self, streams: Sequence[EventStream], params: list, suffix: str = "") -> tuple[str, list]:
        """The insert of ``streams`` (``params``: their rows' values) with ``suffix``, and its parameters.

        On PostgreSQL the insert locks the streams' contexts first, in the same
        statement: a data-modifying ``WITH`` upserts each context's row of
        ``wow_stream_context`` (in name order, so concurrent batches never
        deadlock), and the insert reads from it, so the rows' ``position``
        values (drawn as each row is built) come after the locks. The locks
        last until the transaction ends: appends to one context commit in
        position order.
        """
        if not self._serialise:
            return f"{self._insert_sql}{', '.join([self._row_sql] * len(streams))}{suffix}", params
        contexts = sorted({stream.aggregate_id.context_name for stream in streams})
        timeout = self._timeout()
        if timeout is None:
            lock = self._lock_sql.format(", ".join(["(%s, 1)"] * len(contexts)))
            lock_params: list = contexts
        else:
            lock = self._bounded_lock_sql.format(", ".join(["(%s)"] * len(contexts)))
            lock_params = [_milliseconds(timeout), *contexts]
        sql = (f"WITH wow_lock AS ({lock} RETURNING 1) {self._insert_head} SELECT * FROM (VALUES "
               f"{', '.join([self._typed_row_sql] * len(streams))}) AS wow_rows "
               f"WHERE (SELECT count(*) FROM wow_lock) > 0{suffix}")
        return sql, [*lock_params, *params]

    def _appended(self, connection) -> None:
        """Wake this process's followers once what was appended is committed."""
        if connection.in_atomic_block:
            transaction.on_commit(self.append_notifier.notify, using=self.using)
        else:
            self.append_notifier.notify()

    def append_many(self, streams: Sequence[EventStream]) -> list[Exception | None]:
        """Each stream stored or refused on its own; one result per stream.

        Where the database returns rows from an insert (PostgreSQL, SQLite ≥
        3.35), one ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per chunk of
        streams: the database skips each stream that breaks a unique
        constraint, and a read of its keys tells which one. Otherwise one
        transaction with a savepoint per stream. Streams go in (type,
        aggregate id, version) order, so concurrent batches take their locks
        in one order; a transient failure is the result of every stream it
        left unstored.
        """
        results: list[Exception | None] = [None] * len(streams)
        pending: list[int] = []
        for index, stream in enumerate(streams):
            try:
                self._check_scope(stream.aggregate_name)
            except (SchemaConflictError, RecoverableStoreError) as exc:
                results[index] = exc
            else:
                pending.append(index)
        if not pending:
            return results
        pending.sort(key=lambda i: (streams[i].aggregate_name, streams[i].aggregate_id.id, streams[i].version))
        connection = database(self.using)
        if self.one_statement and connection.features.can_return_columns_from_insert:
            size = max(1, (connection.features.max_query_params or 65_535) // len(_INSERT_FIELDS))
            for start in range(0, len(pending), size):
                self._insert_together(connection, streams, pending[start:start + size], results)
        else:
            self._insert_each(connection, streams, pending, results)
        return results

    def _insert_together(self, connection, streams: Sequence[EventStream], indexes: list[int],
                         results: list[Exception | None], values: Sequence[list] | None = None) -> None:
        params: list = []
        rows: list[int] = []
        for index in indexes:
            try:
                params.extend(self._values(streams[index]) if values is None else values[index])
            except (TypeError, ValueError) as exc:  # a body that is not JSON
                results[index] = exc
            else:
                rows.append(index)
        if not rows:
            return
        sql, params = self._locked([streams[i] for i in rows], params, " ON CONFLICT DO NOTHING RETURNING "
                                   f"{', '.join(self._names[name] for name in _IDENTITY)}")
        try:
            with store_errors(connection, f"appending {len(rows)} event streams"):
                atomic = transaction.atomic(using=self.using) if connection.in_atomic_block else contextlib.nullcontext()
                with sqlite_writer(connection), self._bounded(connection, atomic) as cursor:
                    cursor.execute(sql, params)
                    stored = cursor.fetchall()
            if stored:
                self._appended(connection)
        except RecoverableStoreError as exc:
            for index in rows:
                results[index] = exc
            return
        except (DataError, IntegrityError, TypeError, ValueError):
            # A stream the database cannot hold fails the whole statement: store the chunk stream by
            # stream to isolate it.
            if values is not None:  # a combined write: each as if alone
                self._insert_alone(connection, streams, rows, results, values)
            else:
                self._insert_each(connection, streams, rows, results)
            return
        inserted: dict[tuple, list[int]] = {}
        for index in rows:
            inserted.setdefault(_identity(streams[index]), []).append(index)
        for key in stored:
            inserted[tuple(key)].pop(0)
        refused = [index for waiting in inserted.values() for index in waiting]
        if refused:
            try:
                errors: list[Exception] = list(self._refused(connection, [streams[i] for i in refused]))
            except RecoverableStoreError as exc:
                errors = [exc] * len(refused)
            for index, error in zip(refused, errors, strict=True):
                results[index] = error

    def _insert_each(self, connection, streams: Sequence[EventStream], indexes: list[int],
                     results: list[Exception | None]) -> None:
        try:
            with store_errors(connection, f"appending {len(indexes)} event streams"):
                with sqlite_writer(connection), transaction.atomic(using=self.using):
                    if self._serialise:  # the contexts' locks first, for the whole transaction (see _locked)
                        contexts = sorted({streams[i].aggregate_id.context_name for i in indexes})
                        with connection.cursor() as cursor:
                            cursor.execute(self._lock_sql.format(", ".join(["(%s, 1)"] * len(contexts))), contexts)
                    for index in indexes:
                        stream = streams[index]
                        try:
                            with transaction.atomic(using=self.using), connection.cursor() as cursor:
                                cursor.execute(self._insert_sql + self._row_sql, self._values(stream))
                        except IntegrityError as exc:
                            results[index] = self._conflict(connection, stream, exc)
                        except DataError as exc:
                            results[index] = _unstorable(stream, exc)
                        except (TypeError, ValueError) as exc:  # a body that is not JSON
                            results[index] = exc
        except RecoverableStoreError as exc:  # rolled back: nothing of this call is stored
            for index in indexes:
                results[index] = exc
            return
        if any(results[index] is None for index in indexes):
            self._appended(connection)

    def _conflict(self, connection, stream: EventStream, exc: IntegrityError) -> EventStoreError:
        """The error for a unique violation, confirmed by a read when the constraint is not named."""
        constraint = violated_constraint(exc, EventStreamRow)
        kind = CONSTRAINT_KINDS.get(constraint) if constraint is not None else None
        if kind is None:
            return self._refused(connection, [stream], exc)[0]
        return _conflict_error(kind, stream)

    def _refused(self, connection, streams: Sequence[EventStream], exc: Exception | None = None
                 ) -> list[EventStoreError]:
        """The error of each stream a unique constraint refused, from one read of the streams' keys."""
        quote = connection.ops.quote_name
        name, aggregate_id, version, request_id, scope, stream_id = (
            quote(concrete_field(EventStreamRow, f).column)
            for f in ("aggregate_name", "aggregate_id", "version", "request_id", "request_scope", "stream_id"))
        conditions, params = [], []
        for stream in streams:
            agg = stream.aggregate_id
            conditions.append(f"({name} = %s AND {aggregate_id} = %s AND ({version} = %s OR {request_id} = %s))")
            params += [agg.aggregate_name, agg.id, stream.version, stream.request_id]
            if self._global:
                conditions.append(f"({name} = %s AND {scope} = '' AND {request_id} = %s)")
                params += [agg.aggregate_name, stream.request_id]
        conditions.append(f"{stream_id} IN ({', '.join(['%s'] * len(streams))})")
        params += [stream.id for stream in streams]
        sql = (f"SELECT {name}, {aggregate_id}, {version}, {request_id}, {scope}, {stream_id} "
               f"FROM {quote(EventStreamRow._meta.db_table)} WHERE {' OR '.join(conditions)}")
        with store_errors(connection, "reading the keys of refused event streams"):
            with connection.cursor() as cursor:  # raw: a batch's keys compile slowly through the ORM
                cursor.execute(sql, params)
                found = cursor.fetchall()
        errors: list[EventStoreError] = []
        for stream in streams:
            agg = stream.aggregate_id
            kinds = set()
            for row_name, row_aggregate_id, row_version, row_request_id, row_scope, row_stream_id in found:
                if (row_name, row_aggregate_id, row_version) == (agg.aggregate_name, agg.id, stream.version):
                    kinds.add("version")
                if (row_name, row_request_id) == (agg.aggregate_name, stream.request_id) and (
                        row_aggregate_id == agg.id or (self._global and row_scope == "")):
                    kinds.add("request")
                if row_stream_id == stream.id:
                    kinds.add("id")
            kind = next((k for k in ("version", "request", "id") if k in kinds), None)
            if kind is not None:
                errors.append(_conflict_error(kind, stream))
            else:
                reason = f": {exc}" if exc is not None else " (no conflicting stream is visible)"
                errors.append(EventStoreError(f"event stream {stream.id!r} was refused by the database{reason}"))
        return errors

    # --- reads -----------------------------------------------------------------------------------------

    def _streams(self, aggregate_id: AggregateId, condition: str = "", params: tuple = (),
                 order: str = "ORDER BY {version}") -> list[EventStream]:
        """The streams of one aggregate matching ``condition`` (raw SQL: the hot read path skips the ORM)."""
        connection = database(self.using)
        json_sql = self._json_read_sql if order == "ORDER BY {version}" else None
        as_json = json_sql is not None
        sql = self._read_sql.get((condition, order))
        if sql is None:  # a few constant shapes: built once each
            sql = self._read_sql[condition, order] = (
                json_sql.format(condition=condition.format_map(self._names)) if json_sql is not None
                else f"{self._select_sql} {condition} {order}".format_map(self._names))
        with store_errors(connection, f"loading {aggregate_id.aggregate_name} {aggregate_id.id!r}"):
            params = (aggregate_id.aggregate_name, aggregate_id.id, aggregate_id.tenant_id, *params)
            if not as_json:
                return streams_of(aggregate_id, fetch(connection, sql, params))
            (text,) = fetch(connection, sql, params, one=True)
        rows = loads(text)
        rows.sort(key=_by_version)  # the subquery's order, which an aggregate keeps in practice, made sure of
        return streams_of(aggregate_id, rows, decoded=True)

    def load(
        self, aggregate_id: AggregateId, head_version: int = 1, tail_version: int = MAX_VERSION
    ) -> list[EventStream]:
        check_version_range(head_version, tail_version)
        condition = ""
        params: tuple[int, ...] = ()
        if head_version > 1:
            condition, params = "AND {version} >= %s", (head_version,)
        if tail_version < MAX_VERSION:
            condition, params = condition + " AND {version} <= %s", (*params, tail_version)
        return self._streams(aggregate_id, condition, params)

    def load_by_time(self, aggregate_id: AggregateId, start_time: int, end_time: int) -> list[EventStream]:
        check_time_range(start_time, end_time)
        return self._streams(aggregate_id, "AND {create_time} >= %s AND {create_time} <= %s", (start_time, end_time))

    def last(self, aggregate_id: AggregateId) -> EventStream | None:
        found = self._streams(aggregate_id, order="ORDER BY {version} DESC LIMIT 1")
        return found[0] if found else None

    def scan_aggregate_ids(
        self,
        aggregate_name: str,
        after_id: str = "",
        limit: int = 100,
        *,
        context_name: str | None = None,
        tenant_id: str | None = None,
    ) -> list[AggregateId]:
        check_scan_args(after_id, limit)
        # Version 1 exists once per aggregate (wow_stream_agg_version_uniq), so the
        # first streams list each id once, in the order of that constraint's index.
        rows = self._rows().filter(aggregate_name=aggregate_name, version=1, aggregate_id__gt=after_id)
        if context_name is not None:
            rows = rows.filter(context_name=context_name)
        if tenant_id is not None:
            rows = rows.filter(tenant_id=tenant_id)
        rows = rows.order_by("aggregate_id").values_list("aggregate_id", "context_name", "tenant_id")[:limit]
        connection = database(self.using)
        with store_errors(connection, f"scanning {aggregate_name} ids"):
            found = list(rows)
        return [AggregateId(aggregate_name=aggregate_name, id=aggregate_id, context_name=context, tenant_id=tenant)
                for aggregate_id, context, tenant in found]

    def exists_request_id(self, aggregate_name: str, request_id: str, aggregate_id: str | None = None) -> bool:
        rows = self._rows().filter(aggregate_name=aggregate_name, request_id=request_id)
        if aggregate_id is not None:
            rows = rows.filter(aggregate_id=aggregate_id)
        elif self._global:
            self._check_scope(aggregate_name)
            rows = rows.filter(request_scope="")  # every row of the type is in the global scope: indexed
        connection = database(self.using)
        with store_errors(connection, f"reading request ids of {aggregate_name}"):
            return rows.exists()

    def get_by_request_id(self, aggregate_id: AggregateId, request_id: str) -> EventStream | None:
        found = self._streams(aggregate_id, "AND {request_id} = %s", (request_id,), order="LIMIT 1")
        return found[0] if found else None

    def locate(self, aggregate_name: str, aggregate_id: str) -> AggregateId | None:
        rows = self._rows().filter(aggregate_name=aggregate_name, aggregate_id=aggregate_id, version=1)
        connection = database(self.using)
        with store_errors(connection, f"locating {aggregate_name} {aggregate_id!r}"):
            found = rows.values_list("context_name", "tenant_id").first()
        if found is None:
            return None
        return AggregateId(aggregate_name=aggregate_name, id=aggregate_id, context_name=found[0], tenant_id=found[1])

"""Query services on the project's SQL database (the django storage backend): compiled ``Q`` and ``order_by``.

Conditions, sorts and the scope rules of :mod:`wow_django.persistence.query`
compile with :mod:`wow_django.backends.django.compiler` to one SQL query per call (plus one
count for ``paged``), with the evaluator's semantics on SQLite and PostgreSQL.
Projections read only the columns they keep; paths inside JSON columns are
projected in Python with the evaluator's :func:`apply_projection`. RAW is
refused before anything is read (no SQL engine runs MongoDB filters).

**What a service needs from its store** (the django snapshot and event
stores provide it)::

    store.using                      # the database alias, e.g. "default"
    store.queryset(aggregate_name)   # a QuerySet of that aggregate type's rows, on store.using
    store.max_time_ms                # optional: PostgreSQL statement timeout per query, in ms
                                     # (the backend passes WOW['DATABASE_QUERY_TIMEOUT_MS'] instead)

On PostgreSQL every query runs in a transaction (a savepoint inside an outer
one) with ``jit = off`` and the optional ``statement_timeout``, set with
``set_config(..., true)`` and put back afterwards (:func:`query_settings`).

The rows have the columns :attr:`DjangoSnapshotQueryService.COLUMNS` and
:attr:`DjangoEventStreamQueryService.COLUMNS` name (model field names): one
column per top-level field of Wow's document, JSON fields as ``JSONField``.

Errors: a lost connection, a timeout or another ``OperationalError`` /
``InterfaceError`` is a :class:`~wow_django.exceptions.RecoverableStoreError`
(retry); a bad query is a :class:`~wow_django.query.errors.QueryValidationError`:
RAW, a field path over 100 segments, a query over the compiler's size budget
(see :mod:`wow_django.backends.django.compiler`), or, should one get past those, a query the
engine calls too complex.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import ClassVar

from django.db import InterfaceError, OperationalError, connections, transaction

from wow_django.backends.django.compiler import (
    NOTHING,
    RAW_REFUSAL,
    Column,
    Columns,
    Kind,
    compile_order_by,
    compile_q,
    projection_fields,
    uses_raw,
)
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.query import EVENT_STREAM, SNAPSHOT, QueryService
from wow_django.query.condition import Condition, Projection, SortField
from wow_django.query.errors import QueryTooExpensive, QueryValidationError
from wow_django.query.evaluator import apply_projection

S, N, B, J = Kind.STRING, Kind.INTEGER, Kind.BOOLEAN, Kind.JSON

SNAPSHOT_COLUMNS: dict[str, Column] = {
    "_id": Column("aggregate_id", S),
    "contextName": Column("context_name", S),
    "aggregateName": Column("aggregate_name", S),
    "tenantId": Column("tenant_id", S),
    "ownerId": Column("owner_id", S),
    "version": Column("version", N),
    "eventId": Column("event_id", S),
    "firstOperator": Column("first_operator", S),
    "operator": Column("operator", S),
    "firstEventTime": Column("first_event_time", N),
    "eventTime": Column("event_time", N),
    "snapshotTime": Column("snapshot_time", N),
    "deleted": Column("deleted", B),
    "state": Column("state", J),
}

EVENT_STREAM_COLUMNS: dict[str, Column] = {
    "_id": Column("stream_id", S),
    "contextName": Column("context_name", S),
    "aggregateName": Column("aggregate_name", S),
    "aggregateId": Column("aggregate_id", S),
    "tenantId": Column("tenant_id", S),
    "ownerId": Column("owner_id", S),
    "requestId": Column("request_id", S),
    "commandId": Column("command_id", S),
    "version": Column("version", N),
    "header": Column("header", J),
    "body": Column("body", J),
    "size": Column("size", N),
    "createTime": Column("create_time", N),
}


# What SQLite and PostgreSQL say when a query, not the database, is the problem.
TOO_COMPLEX = ("parser stack overflow", "too many SQL variables", "Expression tree is too large",
               "stack depth limit exceeded", "too many range table entries")


@contextlib.contextmanager
def query_settings(using: str, *, max_time_ms: int | None = None) -> Iterator[None]:
    """Run the queries inside (on database ``using``) the way compiled conditions should run.

    On PostgreSQL: in a transaction (a savepoint inside an outer one) with
    ``jit = off`` and, when ``max_time_ms`` is given, that ``statement_timeout``;
    both are set for the transaction and put back afterwards. JIT is off
    because the compiled JSON walks multiply the planner's row estimates (100
    rows per ``jsonb_array_elements``), which makes PostgreSQL JIT-compile
    queries that run in milliseconds, at a cost of seconds. Elsewhere: nothing.
    """
    connection = connections[using]
    if connection.vendor == "sqlite":
        with sqlite_time_limit(connection, max_time_ms):
            yield
        return
    if connection.vendor != "postgresql":
        yield
        return
    wanted = {"jit": "off"}
    if max_time_ms:
        wanted["statement_timeout"] = f"{int(max_time_ms)}ms"
    with transaction.atomic(using=using):
        previous = _set_local(connection, wanted)
        yield
        if not transaction.get_rollback(using=using):  # a rollback puts them back anyway
            _set_local(connection, previous)


#: How many SQLite virtual-machine instructions run between two looks at the clock.
SQLITE_PROGRESS_STEPS = 1000
_now = time.monotonic  # the clock the SQLite limit reads (a test moves it)


@contextlib.contextmanager
def sqlite_time_limit(connection, max_time_ms: int | None) -> Iterator[None]:
    """On SQLite, stop the queries inside once they ran ``max_time_ms`` (SQLite has no statement timeout: a
    progress handler looks at the clock every :data:`SQLITE_PROGRESS_STEPS` instructions and interrupts the
    statement past the deadline; ``QueryTooExpensive`` follows). Nothing without a limit."""
    if not max_time_ms:
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    deadline = _now() + max_time_ms / 1000
    stopped = []

    def handler() -> int:
        if _now() > deadline:
            stopped.append(True)
            return 1  # a non-zero answer interrupts the statement
        return 0

    raw.set_progress_handler(handler, SQLITE_PROGRESS_STEPS)
    try:
        yield
    except OperationalError as exc:
        if stopped:
            raise OperationalError(f"statement timeout (SQLite, {max_time_ms} ms)") from exc
        raise
    finally:
        raw.set_progress_handler(None, 0)


def _set_local(connection, values: dict[str, str]) -> dict[str, str]:
    """Set ``values`` for the current transaction; return the values they had."""
    names = list(values)
    selects = ", ".join("current_setting(%s), set_config(%s, %s, true)" for _ in names)
    params = [item for name in names for item in (name, name, values[name])]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {selects}", params)
        row = cursor.fetchone()
    return {name: row[2 * i] for i, name in enumerate(names)}


class DjangoQueryService(QueryService):
    """Queries over ``store.queryset(aggregate_name)``, a table with the columns of :attr:`COLUMNS`."""

    #: Top-level document field -> model field, in document order.
    COLUMNS: ClassVar[Columns]

    def __init__(self, store, aggregate_name: str, kind: str, *, max_time_ms: int | None = None):
        super().__init__(aggregate_name, kind)
        self.store = store
        self.using = store.using
        self.max_time_ms = max_time_ms if max_time_ms is not None else getattr(store, "max_time_ms", None)

    @staticmethod
    def _refuse_raw(condition: Condition) -> None:
        # Refused up front, so the answer does not depend on whether any row exists.
        if uses_raw(condition):
            raise QueryValidationError("condition", RAW_REFUSAL)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        try:
            with self._postgres_settings():
                yield
        except OperationalError as exc:
            if "statement timeout" in str(exc):
                # PostgreSQL's statement_timeout (DATABASE_QUERY_TIMEOUT_MS): the query's cost, not a transient fault.
                raise QueryTooExpensive("DATABASE_QUERY_TIMEOUT_MS", self.max_time_ms) from exc
            if any(sign in str(exc) for sign in TOO_COMPLEX):
                # The compiler's limits keep queries below these; should one get there, it is the query.
                raise QueryValidationError("condition", f"the database cannot run a query this complex ({exc})") \
                    from exc
            raise RecoverableStoreError(
                f"querying {self.aggregate_name} {self.kind}s failed transiently ({type(exc).__name__}: {exc}); retry"
            ) from exc
        except InterfaceError as exc:
            raise RecoverableStoreError(
                f"querying {self.aggregate_name} {self.kind}s failed transiently ({type(exc).__name__}: {exc}); retry"
            ) from exc

    def _postgres_settings(self):
        return query_settings(self.using, max_time_ms=self.max_time_ms)

    def _filtered(self, condition: Condition):
        """The rows matching ``condition``, or None when no row can (nothing needs to be read)."""
        self._refuse_raw(condition)
        q = compile_q(condition, columns=self.COLUMNS, field_map=self.field_map)
        return None if q == NOTHING else self.store.queryset(self.aggregate_name).filter(q)

    def find_documents(
        self, condition: Condition, *, projection: Projection, sort: tuple[SortField, ...], skip: int, limit: int
    ) -> list[dict]:
        queryset = self._filtered(condition)
        if queryset is None:
            return []
        queryset = queryset.order_by(*compile_order_by(sort, columns=self.COLUMNS, field_map=self.field_map))
        fields = projection_fields(projection, columns=self.COLUMNS, field_map=self.field_map)
        rows = queryset.values_list(*(self.COLUMNS[name].name for name in fields))
        rows = rows[skip : skip + limit] if limit else rows[skip:]
        with self._reading():
            found = list(rows)
        documents = (dict(zip(fields, row, strict=True)) for row in found)
        if projection.is_empty:
            return list(documents)
        return [apply_projection(document, projection, field_map=self.field_map) for document in documents]

    def count_documents(self, condition: Condition) -> int:
        queryset = self._filtered(condition)
        if queryset is None:
            return 0
        with self._reading():
            return queryset.count()


class DjangoSnapshotQueryService(DjangoQueryService):
    """Snapshot (read model) queries over the snapshot table."""

    COLUMNS = SNAPSHOT_COLUMNS

    def __init__(self, store, aggregate_name: str, *, max_time_ms: int | None = None):
        super().__init__(store, aggregate_name, SNAPSHOT, max_time_ms=max_time_ms)


class DjangoEventStreamQueryService(DjangoQueryService):
    """Event-stream queries over the event-stream table."""

    COLUMNS = EVENT_STREAM_COLUMNS

    def __init__(self, store, aggregate_name: str, *, max_time_ms: int | None = None):
        super().__init__(store, aggregate_name, EVENT_STREAM, max_time_ms=max_time_ms)


__all__ = [
    "query_settings",
    "EVENT_STREAM_COLUMNS",
    "SNAPSHOT_COLUMNS",
    "DjangoEventStreamQueryService",
    "DjangoQueryService",
    "DjangoSnapshotQueryService",
]

"""Snapshot store on the Django ORM: the version-guarded save is one statement (DESIGN part B).

::

    INSERT INTO wow_snapshot (…) VALUES (…)
    ON CONFLICT (aggregate_name, aggregate_id) DO UPDATE SET … = excluded.…
    WHERE wow_snapshot.version <= excluded.version

The database decides atomically: a missing row is inserted, a stored row is
replaced when the candidate's version is ≥ its own, an older candidate
changes nothing. Concurrent saves of one aggregate queue on the row (or on
the unique index for the first insert), and each re-checks the guard against
what the previous one left, so the highest version stays. ``version`` is an
integer column: a stored version is never missing or of another type.
"""

from __future__ import annotations

from wow_django.backends.django.connection import database, fetch, prepare_database, sqlite_writer
from wow_django.backends.django.errors import store_errors
from wow_django.backends.django.event_store import STREAM_COLUMNS, DjangoEventStore, streams_of
from wow_django.backends.django.meta import concrete_field
from wow_django.backends.django.models import EventStreamRow, SnapshotRow
from wow_django.domain.values import loads
from wow_django.persistence.contracts import SnapshotStore
from wow_django.persistence.records import AggregateId, Snapshot

_KEY = ("aggregate_name", "aggregate_id")
_COLUMNS = ("aggregate_name", "aggregate_id", "context_name", "tenant_id", "owner_id", "version", "event_id",
            "first_operator", "operator", "first_event_time", "event_time", "snapshot_time", "deleted", "state")


def _snapshot(values: tuple) -> Snapshot:
    (aggregate_name, aggregate_id, context_name, tenant_id, owner_id, version, event_id, first_operator, operator,
     first_event_time, event_time, snapshot_time, deleted, state) = values
    if isinstance(state, str | bytes):  # Django's connections hand JSON columns over as text
        state = loads(state)
    return Snapshot(
        aggregate_id=AggregateId(aggregate_name=aggregate_name, id=aggregate_id, context_name=context_name,
                                 tenant_id=tenant_id),
        version=version, state=state if state is not None else {}, event_id=event_id or "",
        owner_id=owner_id or "", first_operator=first_operator or "", operator=operator or "",
        first_event_time=first_event_time or 0, event_time=event_time or 0, snapshot_time=snapshot_time or 0,
        deleted=bool(deleted),
    )


#: Snapshots per statement of :meth:`DjangoSnapshotStore.save_many` (well inside SQLite's and PostgreSQL's
#: limits on a statement's parameters).
SAVE_MANY_CHUNK = 500


def upsert_sql(quote, rows: int = 1) -> str:
    """The one-statement version-guarded save of ``rows`` snapshots (``%s`` placeholders in :data:`_COLUMNS`
    order, row after row; no two rows of one aggregate: a statement cannot update a row twice)."""
    table = quote(SnapshotRow._meta.db_table)
    columns = [quote(concrete_field(SnapshotRow, name).column) for name in _COLUMNS]
    key = [quote(concrete_field(SnapshotRow, name).column) for name in _KEY]
    updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column not in key)
    version = quote(SnapshotRow._meta.get_field("version").column)
    row = f"({', '.join(['%s'] * len(columns))})"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join([row] * rows)} "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates} "
        f"WHERE {table}.{version} <= excluded.{version}"
    )


class DjangoSnapshotStore(SnapshotStore):
    """Snapshots of every aggregate type in ``wow_snapshot`` of database ``using``."""

    def __init__(self, using: str = "default"):
        connection = prepare_database(using)
        self.using = using
        self._sql = upsert_sql(connection.ops.quote_name)
        quote = connection.ops.quote_name
        column = {name: quote(concrete_field(SnapshotRow, name).column) for name in _COLUMNS}
        # Raw, as the event store's reads: compiling this through the ORM costs more than the query.
        self._load_sql = (f"SELECT {', '.join(column[name] for name in _COLUMNS)} "
                          f"FROM {quote(SnapshotRow._meta.db_table)} "
                          f"WHERE {column['aggregate_name']} = %s AND {column['aggregate_id']} = %s "
                          # another tenant's aggregate id finds nothing (defence in depth behind the callers)
                          f"AND {column['tenant_id']} = %s")
        self._fields = [concrete_field(SnapshotRow, name) for name in _COLUMNS]
        # The snapshot and the event streams after it in one statement (load_with_tail): a row per stream of
        # the tail, each with the snapshot's columns (NULL without one); one row of NULL streams without a tail.
        stream_columns = ", ".join(f"wow_e.{quote(concrete_field(EventStreamRow, name).column)}"
                                   for name in STREAM_COLUMNS)
        snapshot_columns = ", ".join(f"wow_s.{column[name]}" for name in _COLUMNS)
        key = ("{alias}." + column["aggregate_name"] + " = %s AND {alias}." + column["aggregate_id"] + " = %s AND {alias}."
               + column["tenant_id"] + " = %s")
        event_version = quote(EventStreamRow._meta.get_field("version").column)
        self._with_tail_sql = (
            f"SELECT {snapshot_columns}, {stream_columns} FROM (SELECT 1 AS one) AS wow_one "
            f"LEFT JOIN {quote(SnapshotRow._meta.db_table)} AS wow_s ON {key.format(alias='wow_s')} "
            f"LEFT JOIN {quote(EventStreamRow._meta.db_table)} AS wow_e ON {key.format(alias='wow_e')} "
            f"AND wow_e.{event_version} > COALESCE(wow_s.{column['version']}, 0) "
            f"ORDER BY wow_e.{event_version}"
        )

    def queryset(self, aggregate_name: str):
        """The snapshot rows of one aggregate type (what the query services compile against)."""
        return SnapshotRow.objects.using(self.using).filter(aggregate_name=aggregate_name)

    def load(self, aggregate_id: AggregateId) -> Snapshot | None:
        connection = database(self.using)
        with store_errors(connection, f"loading the snapshot of {aggregate_id.aggregate_name} "
                                            f"{aggregate_id.id!r}"):
            # One row at most: (aggregate_name, aggregate_id) is unique.
            found = fetch(connection, self._load_sql,
                          (aggregate_id.aggregate_name, aggregate_id.id, aggregate_id.tenant_id), one=True)
        return _snapshot(found) if found is not None else None

    def load_with_tail(self, aggregate_id: AggregateId, event_store) -> tuple[Snapshot | None, list] | None:
        """One statement when ``event_store`` is the django event store of the same database; else None."""
        if not isinstance(event_store, DjangoEventStore) or event_store.using != self.using:
            return None
        connection = database(self.using)
        key = (aggregate_id.aggregate_name, aggregate_id.id, aggregate_id.tenant_id)
        with store_errors(connection, f"loading {aggregate_id.aggregate_name} {aggregate_id.id!r} (snapshot and "
                                      "later events)"):
            found = fetch(connection, self._with_tail_sql, key * 2)
        width = len(_COLUMNS)
        snapshot = _snapshot(found[0][:width]) if found and found[0][0] is not None else None
        rows = [row[width:] for row in found if row[width] is not None]
        return snapshot, streams_of(aggregate_id, rows)

    def _params(self, snapshot: Snapshot, connection) -> list:
        agg = snapshot.aggregate_id
        values = (agg.aggregate_name, agg.id, agg.context_name, agg.tenant_id, snapshot.owner_id, snapshot.version,
                  snapshot.event_id, snapshot.first_operator, snapshot.operator, snapshot.first_event_time,
                  snapshot.event_time, snapshot.snapshot_time, snapshot.deleted, snapshot.state)
        return [field.get_db_prep_save(value, connection) for field, value in zip(self._fields, values, strict=True)]

    def save(self, snapshot: Snapshot) -> None:
        agg = snapshot.aggregate_id
        connection = database(self.using)
        params = self._params(snapshot, connection)
        with store_errors(connection, f"saving the snapshot of {agg.aggregate_name} {agg.id!r}"):
            with sqlite_writer(connection), connection.cursor() as cursor:
                cursor.execute(self._sql, params)

    def save_many(self, snapshots) -> None:
        """One guarded upsert statement per :data:`SAVE_MANY_CHUNK` snapshots (each committed on its own
        outside a transaction). Of two snapshots of one aggregate only the higher version is sent."""
        latest: dict[tuple[str, str], Snapshot] = {}
        for snapshot in snapshots:
            key = (snapshot.aggregate_id.aggregate_name, snapshot.aggregate_id.id)
            if key not in latest or latest[key].version <= snapshot.version:
                latest[key] = snapshot
        chosen = list(latest.values())
        connection = database(self.using)
        quote = connection.ops.quote_name
        for start in range(0, len(chosen), SAVE_MANY_CHUNK):
            chunk = chosen[start:start + SAVE_MANY_CHUNK]
            params = [value for snapshot in chunk for value in self._params(snapshot, connection)]
            with store_errors(connection, f"saving {len(chunk)} snapshots"):
                with sqlite_writer(connection), connection.cursor() as cursor:
                    cursor.execute(upsert_sql(quote, len(chunk)), params)

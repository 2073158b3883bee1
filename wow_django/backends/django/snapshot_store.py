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

from wow_django.backends.django.connection import database, prepare_database, sqlite_writer
from wow_django.backends.django.errors import store_errors
from wow_django.backends.django.models import SnapshotRow
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


def upsert_sql(quote) -> str:
    """The one-statement version-guarded save (``%s`` placeholders in :data:`_COLUMNS` order)."""
    table = quote(SnapshotRow._meta.db_table)
    columns = [quote(SnapshotRow._meta.get_field(name).column) for name in _COLUMNS]
    key = [quote(SnapshotRow._meta.get_field(name).column) for name in _KEY]
    updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column not in key)
    version = quote(SnapshotRow._meta.get_field("version").column)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))}) "
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
        column = {name: quote(SnapshotRow._meta.get_field(name).column) for name in _COLUMNS}
        # Raw, as the event store's reads: compiling this through the ORM costs more than the query.
        self._load_sql = (f"SELECT {', '.join(column[name] for name in _COLUMNS)} "
                          f"FROM {quote(SnapshotRow._meta.db_table)} "
                          f"WHERE {column['aggregate_name']} = %s AND {column['aggregate_id']} = %s "
                          # another tenant's aggregate id finds nothing (defence in depth behind the callers)
                          f"AND {column['tenant_id']} = %s")
        self._fields = [SnapshotRow._meta.get_field(name) for name in _COLUMNS]

    def queryset(self, aggregate_name: str):
        """The snapshot rows of one aggregate type (what the query services compile against)."""
        return SnapshotRow.objects.using(self.using).filter(aggregate_name=aggregate_name)

    def load(self, aggregate_id: AggregateId) -> Snapshot | None:
        connection = database(self.using)
        with store_errors(connection, f"loading the snapshot of {aggregate_id.aggregate_name} "
                                            f"{aggregate_id.id!r}"):
            with connection.cursor() as cursor:  # one row at most: (aggregate_name, aggregate_id) is unique
                cursor.execute(self._load_sql, (aggregate_id.aggregate_name, aggregate_id.id, aggregate_id.tenant_id))
                found = cursor.fetchone()
        return _snapshot(found) if found is not None else None

    def save(self, snapshot: Snapshot) -> None:
        agg = snapshot.aggregate_id
        values = (agg.aggregate_name, agg.id, agg.context_name, agg.tenant_id, snapshot.owner_id, snapshot.version,
                  snapshot.event_id, snapshot.first_operator, snapshot.operator, snapshot.first_event_time,
                  snapshot.event_time, snapshot.snapshot_time, snapshot.deleted, snapshot.state)
        connection = database(self.using)
        params = [field.get_db_prep_save(value, connection) for field, value in zip(self._fields, values, strict=True)]
        with store_errors(connection, f"saving the snapshot of {agg.aggregate_name} {agg.id!r}"):
            with sqlite_writer(connection), connection.cursor() as cursor:
                cursor.execute(self._sql, params)

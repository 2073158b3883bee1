"""The MongoDB backend: every contract on pymongo (mongomock for the embedded engine).

:class:`MongoBackend` builds the stores and query services of one runtime
from the ``WOW`` settings; :func:`planned_specs` and :func:`initialize` are
what ``wow_init_schema`` runs.
"""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from wow_django.backends.mongo.bus_schema import BUS_SPECS
from wow_django.backends.mongo.bus_store import MongoBusStore
from wow_django.backends.mongo.client import MongoConnection, check_database_name, connect, parse_uri, redact
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.followers import MongoFollowerStore, MongoStreamFeed
from wow_django.backends.mongo.prepare_key import MongoPrepareKey
from wow_django.backends.mongo.queries import MongoEventStreamQueryService, MongoSnapshotQueryService
from wow_django.backends.mongo.schema import (
    CollectionSpec,
    SchemaGuard,
    SchemaReport,
    claim_database,
    event_stream_spec,
    follower_specs,
    positions_spec,
    prepare_spec,
    reconcile_collection,
    snapshot_spec,
    void_positions_spec,
)
from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore
from wow_django.conf import DEFAULT_MONGO_URI, wow_settings
from wow_django.domain import registry
from wow_django.persistence.backend import Backend

PURPOSES = ("EVENT_STREAM", "SNAPSHOT", "PREPARE", "BUS")


def configured_uri() -> str:
    return wow_settings.MONGO_URI or DEFAULT_MONGO_URI


def database_name(purpose: str) -> str:
    """The database for ``purpose`` (EVENT_STREAM, SNAPSHOT, PREPARE or BUS)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    setting = f"{purpose}_DATABASE"
    explicit = getattr(wow_settings, setting)
    if explicit:
        return check_database_name(explicit, f"WOW[{setting!r}]")
    uri = configured_uri()
    _, default = parse_uri(uri)
    if default is None:
        raise ImproperlyConfigured(
            f"No MongoDB database for {purpose.lower().replace('_', ' ')} data: WOW['MONGO_URI'] "
            f"({redact(uri)}) names no database and WOW[{setting!r}] is not set. Add the database to "
            "the URI (mongodb://host:27017/my_db) or set the database setting."
        )
    return default


def get_connection() -> MongoConnection:
    return connect(configured_uri())


class MongoBackend(Backend):
    """Stores and query services on MongoDB for one runtime; one schema guard shared by its stores."""

    name = "mongo"

    def __init__(self) -> None:
        self.connection = get_connection()
        self.max_time_ms = wow_settings.MONGO_MAX_TIME_MS
        self.schema_guard = SchemaGuard(wow_settings.CONTEXT_NAME, auto_init=wow_settings.AUTO_INIT_SCHEMA)

    def event_store(self, *, request_id_index: str):
        return MongoEventStore(self.connection, database_name("EVENT_STREAM"), schema=self.schema_guard,
                               request_id_index=request_id_index, max_time_ms=self.max_time_ms,
                               lock_timeout_s=wow_settings.APPEND_LOCK_TIMEOUT_S)

    def snapshot_store(self):
        return MongoSnapshotStore(self.connection, database_name("SNAPSHOT"), schema=self.schema_guard,
                                  max_time_ms=self.max_time_ms)

    def prepare_key(self, name: str):
        return MongoPrepareKey(name, self.connection, database_name("PREPARE"), schema=self.schema_guard,
                               max_time_ms=self.max_time_ms)

    def bus_store(self):
        return MongoBusStore(self.connection, database_name("BUS"), schema_guard=self.schema_guard,
                             max_time_ms=self.max_time_ms)

    def snapshot_queries(self, store, aggregate_name: str):
        return MongoSnapshotQueryService(store, aggregate_name)

    def event_queries(self, store, aggregate_name: str):
        return MongoEventStreamQueryService(store, aggregate_name)

    def stream_feed(self, store, context_name: str | None = None):
        return MongoStreamFeed(store, context_name or wow_settings.CONTEXT_NAME,
                               watch_changes=wow_settings.MONGO_CHANGE_STREAMS)

    def follower_store(self):
        return MongoFollowerStore(self.connection, database_name("EVENT_STREAM"), schema=self.schema_guard,
                                  max_time_ms=self.max_time_ms)


def planned_specs() -> list[tuple[str, CollectionSpec]]:
    """``(database purpose, spec)`` for every collection the settings and declarations ask for."""
    plan: list[tuple[str, CollectionSpec]] = []
    mongo = {p: wow_settings.storage_for(s) == "mongo" for p, s in
             (("EVENT_STREAM", "EVENT_STORE"), ("SNAPSHOT", "SNAPSHOT_STORE"), ("PREPARE", "PREPARE_STORE"),
              ("BUS", "BUS_STORE"))}
    declared = registry.current()
    for name in declared.aggregate_names():
        if mongo["EVENT_STREAM"]:
            plan.append(("EVENT_STREAM", event_stream_spec(name, wow_settings.REQUEST_ID_INDEX)))
        if mongo["SNAPSHOT"]:
            plan.append(("SNAPSHOT", snapshot_spec(name)))
    if mongo["EVENT_STREAM"]:
        # Global positions and followers' state live beside the context's event streams.
        plan.extend(("EVENT_STREAM", spec) for spec in (positions_spec(), void_positions_spec(), *follower_specs()))
    if mongo["PREPARE"]:
        for name in declared.prepare_key_names():
            plan.append(("PREPARE", prepare_spec(name)))
    if mongo["BUS"] and apps.is_installed("wow_django.bus"):
        plan.extend(("BUS", spec) for spec in BUS_SPECS)
    return plan


def initialize(*, check_only: bool = False) -> SchemaReport:
    """Claim each database and reconcile each collection; report, raise nothing."""
    connection = get_connection()
    report = SchemaReport()
    claimed: set[str] = set()
    refused: set[str] = set()  # owned by another context: touch nothing there
    for purpose, spec in planned_specs():
        db = connection.database(database_name(purpose))
        if purpose == "BUS":  # shared by the services on the bus: reconciled, never claimed
            report.merge(reconcile_collection(db, spec, check_only=check_only))
            continue
        if db.name not in claimed:
            claimed.add(db.name)
            ownership = claim_database(db, wow_settings.CONTEXT_NAME, check_only=check_only)
            report.merge(ownership)
            if ownership.ownership:
                refused.add(db.name)
        if db.name in refused:
            continue
        report.merge(reconcile_collection(db, spec, check_only=check_only))
    return report


__all__ = ["MongoBackend", "MongoConnection", "PURPOSES", "configured_uri", "connect", "database_name",
           "get_connection", "initialize", "planned_specs"]

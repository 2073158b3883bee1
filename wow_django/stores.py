"""The process's stores, built from the ``WOW`` settings on first use.

``event_store()``, ``snapshot_store()`` and ``prepare_key(name)`` return one
instance per process; changing ``WOW`` (``override_settings``) discards them.
"""

from __future__ import annotations

import os
import threading

from wow_django.conf import on_reload, wow_settings
from wow_django.store.base import EventStore, PrepareKey, SnapshotStore

_lock = threading.RLock()
_instances: dict[object, object] = {}
_schema_guard = None


def schema_guard():
    """The process's guard that claims databases and reconciles collections once."""
    global _schema_guard
    with _lock:
        if _schema_guard is None:
            from wow_django.mongo.schema import SchemaGuard

            _schema_guard = SchemaGuard(wow_settings.CONTEXT_NAME, auto_init=wow_settings.AUTO_INIT_SCHEMA)
        return _schema_guard


def _build_event_store() -> EventStore:
    backend = wow_settings.storage_for("EVENT_STORE")
    if backend == "in_memory":
        from wow_django.store.memory import InMemoryEventStore

        store: EventStore = InMemoryEventStore(request_id_index=wow_settings.REQUEST_ID_INDEX)
    else:
        from wow_django.mongo import database_name, get_connection
        from wow_django.mongo.event_store import MongoEventStore

        store = MongoEventStore(
            get_connection(),
            database_name("EVENT_STREAM"),
            schema=schema_guard(),
            request_id_index=wow_settings.REQUEST_ID_INDEX,
            max_time_ms=wow_settings.MONGO_MAX_TIME_MS,
        )
    batch = wow_settings.EVENT_STORE_BATCH
    if batch["ENABLED"]:
        from wow_django.store.batching import BatchingEventStore

        store = BatchingEventStore(
            store,
            max_size=batch["MAX_SIZE"],
            max_delay_ms=batch["MAX_DELAY_MS"],
            max_pending=batch["MAX_PENDING"],
            lane_count=batch["LANE_COUNT"],
        )
    return store


def _build_snapshot_store() -> SnapshotStore:
    if wow_settings.storage_for("SNAPSHOT_STORE") == "in_memory":
        from wow_django.store.memory import InMemorySnapshotStore

        return InMemorySnapshotStore()
    from wow_django.mongo import database_name, get_connection
    from wow_django.mongo.snapshot_store import MongoSnapshotStore

    return MongoSnapshotStore(
        get_connection(), database_name("SNAPSHOT"), schema=schema_guard(), max_time_ms=wow_settings.MONGO_MAX_TIME_MS
    )


def _build_prepare_key(name: str) -> PrepareKey:
    if wow_settings.storage_for("PREPARE_STORE") == "in_memory":
        from wow_django.store.memory import InMemoryPrepareKey

        return InMemoryPrepareKey(name)
    from wow_django.mongo import database_name, get_connection
    from wow_django.mongo.prepare_key import MongoPrepareKey

    return MongoPrepareKey(
        name, get_connection(), database_name("PREPARE"), schema=schema_guard(),
        max_time_ms=wow_settings.MONGO_MAX_TIME_MS,
    )


def _get(key, build):
    instance = _instances.get(key)
    if instance is None:
        with _lock:
            instance = _instances.get(key)
            if instance is None:
                instance = _instances[key] = build()
    return instance


def event_store() -> EventStore:
    return _get("event_store", _build_event_store)


def snapshot_store() -> SnapshotStore:
    return _get("snapshot_store", _build_snapshot_store)


def prepare_key(name: str) -> PrepareKey:
    return _get(("prepare_key", name), lambda: _build_prepare_key(name))


def _forget_after_fork() -> None:
    """In a forked child (Celery prefork), drop the parent's stores without closing them.

    They hold the parent's clients and threads; the child builds its own on
    first use (``connect`` hands out fresh server clients after fork).
    """
    global _lock, _schema_guard
    _lock = threading.RLock()
    _instances.clear()
    _schema_guard = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@on_reload
def reset() -> None:
    """Forget every store (closing batchers); the next call builds anew."""
    global _schema_guard
    with _lock:
        for instance in _instances.values():
            close = getattr(instance, "close", None)
            if close is not None:
                close()
        _instances.clear()
        _schema_guard = None

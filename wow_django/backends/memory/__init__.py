"""The in-memory backend: every contract in this process's memory (tests; nothing persisted or shared)."""

from __future__ import annotations

from wow_django.backends.memory.bus_store import InMemoryBusStore
from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
from wow_django.backends.memory.queries import InMemoryEventStreamQueryService, InMemorySnapshotQueryService
from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.conf import wow_settings
from wow_django.persistence.backend import Backend


class MemoryBackend(Backend):
    """Stores and query services in memory for one runtime."""

    name = "in_memory"

    def event_store(self, *, request_id_index: str):
        return InMemoryEventStore(request_id_index=request_id_index)

    def snapshot_store(self):
        return InMemorySnapshotStore()

    def prepare_key(self, name: str):
        return InMemoryPrepareKey(name)

    def bus_store(self):
        return InMemoryBusStore()

    def snapshot_queries(self, store, aggregate_name: str):
        return InMemorySnapshotQueryService(store, aggregate_name)

    def event_queries(self, store, aggregate_name: str):
        return InMemoryEventStreamQueryService(store, aggregate_name)

    def stream_feed(self, store, context_name: str | None = None):
        return InMemoryStreamFeed(store, context_name or wow_settings.CONTEXT_NAME)

    def follower_store(self):
        return InMemoryFollowerStore()

"""The in-memory backend: every contract in this process's memory (tests; nothing persisted or shared)."""

from __future__ import annotations


class MemoryBackend:
    """Stores and query services in memory for one runtime."""

    name = "in_memory"

    def event_store(self, *, request_id_index: str):
        from wow_django.backends.memory.stores import InMemoryEventStore

        return InMemoryEventStore(request_id_index=request_id_index)

    def snapshot_store(self):
        from wow_django.backends.memory.stores import InMemorySnapshotStore

        return InMemorySnapshotStore()

    def prepare_key(self, name: str):
        from wow_django.backends.memory.stores import InMemoryPrepareKey

        return InMemoryPrepareKey(name)

    def bus_store(self):
        from wow_django.backends.memory.bus_store import InMemoryBusStore

        return InMemoryBusStore()

    def snapshot_queries(self, store, aggregate_name: str):
        from wow_django.backends.memory.queries import InMemorySnapshotQueryService

        return InMemorySnapshotQueryService(store, aggregate_name)

    def event_queries(self, store, aggregate_name: str):
        from wow_django.backends.memory.queries import InMemoryEventStreamQueryService

        return InMemoryEventStreamQueryService(store, aggregate_name)

    def close(self) -> None:
        """Nothing to close."""

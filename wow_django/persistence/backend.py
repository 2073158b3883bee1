"""What a storage backend provides to the runtime: one factory per contract.

A backend is a class built without arguments (it reads the ``WOW`` settings it
needs); the runtime keeps one instance per backend kind and asks it for each
store once. ``wow_django.backends.memory.MemoryBackend`` and
``wow_django.backends.mongo.MongoBackend`` implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from wow_django.persistence.bus import BusStore
from wow_django.persistence.contracts import EventStore, PrepareKey, SnapshotStore
from wow_django.persistence.followers import FollowerStore, StreamFeed
from wow_django.persistence.query import QueryService


class Backend(ABC):
    """Builds the stores and query services of one storage technology."""

    #: The ``WOW['STORAGE']`` value that selects this backend.
    name: str = ""

    @abstractmethod
    def event_store(self, *, request_id_index: str) -> EventStore:
        """A new event store (``request_id_index``: ``"aggregate"`` or ``"global"`` uniqueness)."""

    @abstractmethod
    def snapshot_store(self) -> SnapshotStore:
        """A new snapshot store."""

    @abstractmethod
    def prepare_key(self, name: str) -> PrepareKey:
        """The PrepareKey store named ``name``."""

    @abstractmethod
    def bus_store(self) -> BusStore:
        """A new store of the bus records."""

    @abstractmethod
    def snapshot_queries(self, store: SnapshotStore, aggregate_name: str) -> QueryService:
        """Snapshot queries of one aggregate type over ``store`` (built by this backend)."""

    @abstractmethod
    def event_queries(self, store: EventStore, aggregate_name: str) -> QueryService:
        """Event stream queries of one aggregate type over ``store`` (built by this backend)."""

    @abstractmethod
    def stream_feed(self, store: EventStore, context_name: str | None = None) -> StreamFeed:
        """The streams of context ``context_name`` (None: ``WOW['CONTEXT_NAME']``) in ``store`` (built by this
        backend) by position."""

    @abstractmethod
    def follower_store(self) -> FollowerStore:
        """A new store of followers' state (checkpoint, lease, pause, poison, skipped gaps)."""

    def close(self) -> None:
        """Release what the backend holds itself (its stores are closed by the runtime)."""

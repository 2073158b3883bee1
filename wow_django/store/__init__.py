"""Storage contracts and their backends (``memory``; ``wow_django.mongo``)."""

from wow_django.store.base import EventStore, PrepareKey, SnapshotStore, check_version_range

__all__ = ["EventStore", "SnapshotStore", "PrepareKey", "check_version_range"]

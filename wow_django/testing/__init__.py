"""Conformance suite: abstract test cases a backend must pass.

Mix a contract into ``unittest.TestCase`` and say how to build the backend::

    class TestMyEventStore(EventStoreContract, unittest.TestCase):
        def make_store(self):
            return MyEventStore(...)

pytest and ``manage.py test`` both run them.
"""

from wow_django.testing.bus_store import BusStoreContract, make_event
from wow_django.testing.event_store import EventStoreContract, make_stream
from wow_django.testing.mongo import REAL_MONGO_REASON, real_mongo_uri, requires_real_mongo, temporary_database
from wow_django.testing.prepare_key import PrepareKeyContract
from wow_django.testing.snapshot_store import SnapshotStoreContract, make_snapshot

__all__ = [
    "BusStoreContract",
    "EventStoreContract",
    "SnapshotStoreContract",
    "PrepareKeyContract",
    "make_stream",
    "make_snapshot",
    "make_event",
    "real_mongo_uri",
    "requires_real_mongo",
    "temporary_database",
    "REAL_MONGO_REASON",
]

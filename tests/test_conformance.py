"""The conformance suite on every backend: in-memory, embedded Mongo, real Mongo."""

from __future__ import annotations

import unittest
from datetime import UTC, datetime, timedelta

from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.prepare_key import MongoPrepareKey
from wow_django.backends.mongo.schema import SchemaGuard
from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore
from wow_django.persistence.batching import BatchingEventStore
from wow_django.testing import (
    EventStoreContract,
    FakeClock,
    PrepareKeyContract,
    SnapshotStoreContract,
    requires_real_mongo,
    temporary_database,
)
from wow_django.testing.mongo import embedded_connection, server_connection


class MongoBackend:
    """Each test gets its own database on a fresh connection."""

    def connection(self):
        return embedded_connection()

    def mongo(self):
        """``(connection, database name, schema guard)`` for this test."""
        if not hasattr(self, "_mongo"):
            connection = self.connection()
            self.addCleanup(connection.close)
            context = temporary_database(connection)
            self._mongo = (connection, context.__enter__(), SchemaGuard("test-context"))
            self.addCleanup(context.__exit__, None, None, None)
        return self._mongo


class RealMongoBackend(MongoBackend):
    def connection(self):
        return server_connection()


# --- event store -----------------------------------------------------------------


class TestInMemoryEventStore(EventStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemoryEventStore()


class TestInMemoryBatchingEventStore(EventStoreContract, unittest.TestCase):
    def make_store(self):
        return BatchingEventStore(InMemoryEventStore(), max_size=16, max_delay_ms=0.5, lane_count=3)


class TestEmbeddedMongoEventStore(MongoBackend, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)


class TestEmbeddedMongoBatchingEventStore(MongoBackend, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        inner = MongoEventStore(connection, name, schema=guard)
        return BatchingEventStore(inner, max_size=32, max_delay_ms=1, lane_count=2)


@requires_real_mongo
class TestRealMongoEventStore(RealMongoBackend, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)


@requires_real_mongo
class TestRealMongoBatchingEventStore(RealMongoBackend, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return BatchingEventStore(MongoEventStore(connection, name, schema=guard), lane_count=2)


# --- snapshot store ---------------------------------------------------------------


class TestInMemorySnapshotStore(SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemorySnapshotStore()


class TestEmbeddedMongoSnapshotStore(MongoBackend, SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoSnapshotStore(connection, name, schema=guard)


@requires_real_mongo
class TestRealMongoSnapshotStore(RealMongoBackend, SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoSnapshotStore(connection, name, schema=guard)


# --- prepare key --------------------------------------------------------------------


class TestInMemoryPrepareKey(PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        return InMemoryPrepareKey(name, clock=clock)


class TestEmbeddedMongoPrepareKey(MongoBackend, PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        connection, db, guard = self.mongo()
        return MongoPrepareKey(name, connection, db, schema=guard, clock=clock)


class TestPrepareKeyClock(unittest.TestCase):
    def test_a_fake_clock_starts_on_a_millisecond_and_only_moves_on(self):
        clock = FakeClock()
        start = clock()
        self.assertEqual((start.tzinfo, start.microsecond % 1000), (UTC, 0))
        self.assertEqual(clock.advance(1.5, milliseconds=1), start + timedelta(seconds=1.501))
        self.assertEqual(clock(), start + timedelta(seconds=1.501))
        with self.assertRaises(ValueError):
            clock.advance(-1)
        with self.assertRaises(ValueError):
            FakeClock(datetime(2030, 1, 1))
        self.assertEqual(FakeClock(datetime(2030, 1, 1, tzinfo=UTC))(), datetime(2030, 1, 1, tzinfo=UTC))

    def test_a_prepare_key_refuses_a_clock_without_a_time_zone(self):
        keys = InMemoryPrepareKey("username", clock=lambda: datetime(2030, 1, 1))
        with self.assertRaisesRegex(ValueError, "aware datetime"):
            keys.prepare("alice", "c-1")


@requires_real_mongo
class TestRealMongoPrepareKey(RealMongoBackend, PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        connection, db, guard = self.mongo()
        return MongoPrepareKey(name, connection, db, schema=guard, clock=clock)

"""The conformance suite on every backend: in-memory, embedded Mongo, real Mongo, the django backend on
SQLite and on PostgreSQL."""

from __future__ import annotations

import unittest
from datetime import UTC, datetime, timedelta

from django.test import TransactionTestCase

from tests.mongo_replica import SimulatedReplicaSetDatabase
from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.prepare_key import DjangoPrepareKey
from wow_django.backends.django.snapshot_store import DjangoSnapshotStore
from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.prepare_key import MongoPrepareKey
from wow_django.backends.mongo.schema import SchemaGuard
from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore
from wow_django.exceptions import DatabaseOwnershipError, SchemaConflictError
from wow_django.persistence.batching import BatchingEventStore
from wow_django.persistence.documents import stream_to_document
from wow_django.persistence.records import AggregateId
from wow_django.testing import (
    EmbeddedMongoDatabase,
    EventStoreContract,
    FakeClock,
    PrepareKeyContract,
    RealMongoDatabase,
    SnapshotStoreContract,
    make_snapshot,
    make_stream,
    requires_real_mongo,
)

# --- event store -----------------------------------------------------------------


class TestInMemoryEventStore(EventStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemoryEventStore()


class TestInMemoryBatchingEventStore(EventStoreContract, unittest.TestCase):
    def make_store(self):
        return BatchingEventStore(InMemoryEventStore(), max_size=16, max_delay_ms=0.5, lane_count=3)


class TestEmbeddedMongoEventStore(EmbeddedMongoDatabase, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)


class TestEmbeddedMongoBatchingEventStore(EmbeddedMongoDatabase, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        inner = MongoEventStore(connection, name, schema=guard)
        return BatchingEventStore(inner, max_size=32, max_delay_ms=1, lane_count=2)


class TestSimulatedReplicaSetEventStore(SimulatedReplicaSetDatabase, EventStoreContract, unittest.TestCase):
    """The transactional append path (a replica set's, played by ``tests.mongo_replica``)."""

    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)


class TestSimulatedReplicaSetBatchingEventStore(SimulatedReplicaSetDatabase, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return BatchingEventStore(MongoEventStore(connection, name, schema=guard), max_size=32, max_delay_ms=1,
                                  lane_count=2)


@requires_real_mongo
class TestRealMongoEventStore(RealMongoDatabase, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)


@requires_real_mongo
class TestRealMongoBatchingEventStore(RealMongoDatabase, EventStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return BatchingEventStore(MongoEventStore(connection, name, schema=guard), lane_count=2)


class OnSQLite:
    """The django backend on a file SQLite (``wow_sqlite``). A ``TransactionTestCase``: the contract's
    threads each use their own connection and must see committed rows; tables are emptied after each test."""

    databases = {"default", "wow_sqlite"}  # Django sets a non-default test database up after "default"
    available_apps = ["wow_django"]
    alias = "wow_sqlite"


class OnPostgreSQL:
    """The django backend on PostgreSQL (``wow_pg``): the real-server run of every concurrency case."""

    databases = {"default", "wow_pg"}
    available_apps = ["wow_django"]
    alias = "wow_pg"


class TestSQLiteEventStore(OnSQLite, EventStoreContract, TransactionTestCase):
    def make_store(self):
        return DjangoEventStore(using=self.alias)


class TestSQLiteBatchingEventStore(OnSQLite, EventStoreContract, TransactionTestCase):
    def make_store(self):
        return BatchingEventStore(DjangoEventStore(using=self.alias), max_size=16, max_delay_ms=0.5, lane_count=3)


class TestPostgreSQLEventStore(OnPostgreSQL, EventStoreContract, TransactionTestCase):
    def make_store(self):
        return DjangoEventStore(using=self.alias)


class TestPostgreSQLBatchingEventStore(OnPostgreSQL, EventStoreContract, TransactionTestCase):
    def make_store(self):
        return BatchingEventStore(DjangoEventStore(using=self.alias), max_size=16, max_delay_ms=0.5, lane_count=3)


class MongoEventStoreReadOrder:
    """Reads sort by version, not by what the engine returns first (its natural order is insertion order).

    The documents are written straight into the collection, out of version
    order, bypassing ``append``: only the read's own sort can put them in order.
    """

    def test_documents_stored_out_of_order_load_and_last_in_version_order(self):
        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard)
        collection = store.collection("order")
        # Newest first; then an order whose first and last documents are both not the highest version.
        for insertion_order in ((5, 4, 3, 2, 1), (2, 5, 1, 4, 3)):
            with self.subTest(insertion_order=insertion_order):
                agg = AggregateId("order", f"raw-{''.join(map(str, insertion_order))}", "test-context", "tenant-a")
                streams = {v: make_stream(agg, v, create_time=1_000 * v) for v in range(1, 6)}
                for version in insertion_order:
                    collection.insert_one(stream_to_document(streams[version]))
                natural = collection.find({"aggregateId": agg.id}).sort("$natural", 1)
                self.assertEqual(tuple(d["version"] for d in natural), insertion_order)  # the engine's own order
                in_order = [streams[v] for v in range(1, 6)]
                self.assertEqual(store.load(agg), in_order)
                self.assertEqual(store.load(agg, 2, 4), in_order[1:4])
                self.assertEqual(store.load_by_time(agg, 0, 10_000), in_order)
                self.assertEqual(store.load_by_time(agg, 2_000, 3_000), in_order[1:3])
                self.assertEqual(store.last(agg), streams[5])


class MongoEventStoreBatchAttribution:
    """Issue 22, item 9: a batch's documents that cannot be stored fail alone, before any is sent.

    Before, pymongo sent the batch in chunks: a document it could not encode in a later chunk fell back to
    one-by-one inserts that hit the earlier chunks' stored documents (reported DuplicateEventStreamId), and
    an integer beyond 64 bits (OverflowError) failed the whole group while part of it was stored.
    """

    def test_unstorable_documents_fail_alone_and_the_others_are_stored_once(self):
        from bson import errors as bson_errors
        from pymongo import errors as pymongo_errors

        connection, name, guard = self.mongo()
        store = self.make_batch_store(MongoEventStore(connection, name, schema=guard))
        aggregates = [AggregateId("order", f"batch-{i}", "test-context") for i in range(6)]
        streams = [make_stream(agg, 1) for agg in aggregates]
        streams[1] = make_stream(aggregates[1], 1, header={"huge": 2**70})  # no 64-bit integer
        streams[3] = make_stream(aggregates[3], 1, header={"thing": object()})  # not BSON at all
        streams[4] = make_stream(aggregates[4], 1, header={"blob": "x" * (16 * 1024 * 1024)})  # over 16 MiB
        results = store.append_many(streams)
        self.assertIsInstance(results[1], OverflowError)
        self.assertIsInstance(results[3], bson_errors.InvalidDocument)
        self.assertIsInstance(results[4], pymongo_errors.DocumentTooLarge)
        for index in (0, 2, 5):
            self.assertIsNone(results[index], index)
            self.assertEqual(store.load(aggregates[index]), [streams[index]])
        for index in (1, 3, 4):
            self.assertEqual(store.load(aggregates[index]), [])
        # A single append refuses the same, before a position is taken (followers wait for none).
        collection = connection.database(name)["wow_position"]
        before = collection.find_one({"_id": "test-context"})["position"]
        with self.assertRaises(OverflowError):
            store.append(make_stream(AggregateId("order", "single", "test-context"), 1, header={"n": -(2**64)}))
        self.assertEqual(collection.find_one({"_id": "test-context"})["position"], before)

    def make_batch_store(self, store):
        return store


class TestEmbeddedMongoEventStoreBatchAttribution(EmbeddedMongoDatabase, MongoEventStoreBatchAttribution,
                                                  unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoEventStoreBatchAttribution(RealMongoDatabase, MongoEventStoreBatchAttribution,
                                              unittest.TestCase):
    pass


class TestEmbeddedMongoEventStoreReadOrder(EmbeddedMongoDatabase, MongoEventStoreReadOrder, unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoEventStoreReadOrder(RealMongoDatabase, MongoEventStoreReadOrder, unittest.TestCase):
    pass


# --- snapshot store ---------------------------------------------------------------


class TestInMemorySnapshotStore(SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemorySnapshotStore()


class TestEmbeddedMongoSnapshotStore(EmbeddedMongoDatabase, SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoSnapshotStore(connection, name, schema=guard)


@requires_real_mongo
class TestRealMongoSnapshotStore(RealMongoDatabase, SnapshotStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoSnapshotStore(connection, name, schema=guard)


class TestSQLiteSnapshotStore(OnSQLite, SnapshotStoreContract, TransactionTestCase):
    def make_store(self):
        return DjangoSnapshotStore(using=self.alias)


class TestPostgreSQLSnapshotStore(OnPostgreSQL, SnapshotStoreContract, TransactionTestCase):
    def make_store(self):
        return DjangoSnapshotStore(using=self.alias)


class MongoSnapshotStoreStoredVersions:
    """The save rule against documents the store did not write itself (an older release, a hand edit).

    A candidate replaces the stored document when its version is ≥ the stored
    one, or when the stored version is missing or not a number; otherwise the
    stored document stays as it is. Run on the embedded engine this checks
    the embedded save path (read, compare, replace under the write guard);
    on a real server, the update pipeline.
    """

    CASES = [
        # (stored version, or MISSING; candidate version; replaced?)
        (5, 4, False),
        (5, 5, True),
        (5, 6, True),
        (5.0, 4, False),
        (2**40, 7, False),  # a long
        ("MISSING", 1, True),
        ("7", 1, True),  # a string, even one that reads as a higher number
        ("7", 9, True),
        (None, 1, True),
        ({"n": 9}, 1, True),
        ([9], 1, True),
        (True, 1, True),  # a boolean is not a version
    ]

    def test_save_over_a_raw_stored_document(self):
        connection, name, guard = self.mongo()
        store = MongoSnapshotStore(connection, name, schema=guard)
        collection = store.collection("order")
        for n, (stored_version, candidate_version, replaced) in enumerate(self.CASES):
            with self.subTest(stored=stored_version, candidate=candidate_version):
                agg = AggregateId("order", f"raw-{n}", "test-context", "tenant-a")
                raw = {"_id": agg.id, "state": {"written": "by hand"}}
                if stored_version != "MISSING":
                    raw["version"] = stored_version
                collection.insert_one(dict(raw))
                candidate = make_snapshot(agg, candidate_version, status="candidate")
                store.save(candidate)
                if replaced:
                    self.assertEqual(store.load(agg), candidate)
                else:
                    self.assertEqual(collection.find_one({"_id": agg.id}), raw)


class TestEmbeddedMongoSnapshotStoreStoredVersions(EmbeddedMongoDatabase, MongoSnapshotStoreStoredVersions,
                                                   unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoSnapshotStoreStoredVersions(RealMongoDatabase, MongoSnapshotStoreStoredVersions,
                                               unittest.TestCase):
    pass


# --- prepare key --------------------------------------------------------------------


class TestInMemoryPrepareKey(PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        return InMemoryPrepareKey(name, clock=clock)


class TestEmbeddedMongoPrepareKey(EmbeddedMongoDatabase, PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        connection, db, guard = self.mongo()
        return MongoPrepareKey(name, connection, db, schema=guard, clock=clock)


class TestSQLitePrepareKey(OnSQLite, PrepareKeyContract, TransactionTestCase):
    def make_prepare_key(self, name, clock):
        return DjangoPrepareKey(name, using=self.alias, clock=clock)


class TestPostgreSQLPrepareKey(OnPostgreSQL, PrepareKeyContract, TransactionTestCase):
    def make_prepare_key(self, name, clock):
        return DjangoPrepareKey(name, using=self.alias, clock=clock)


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
class TestRealMongoPrepareKey(RealMongoDatabase, PrepareKeyContract, unittest.TestCase):
    def make_prepare_key(self, name, clock):
        connection, db, guard = self.mongo()
        return MongoPrepareKey(name, connection, db, schema=guard, clock=clock)


# --- Mongo schema and ownership (issue 22) ------------------------------------------------------------------


class MongoSchemaRules:
    """What the schema guard refuses or writes, on the embedded engine and on a real server."""

    def test_a_unique_request_id_index_is_refused_by_its_keys_whatever_its_name_and_direction(self):
        """Item 14: a legacy unique ``{requestId: -1}`` would let the per-aggregate mode start and later
        refuse a request id reused by another aggregate with an unclassified error."""
        connection, name, guard = self.mongo()
        database = connection.database(name)
        database["order_event_stream"].create_index([("requestId", -1)], name="legacy_request", unique=True)
        store = MongoEventStore(connection, name, schema=guard, request_id_index="aggregate")
        with self.assertRaisesRegex(SchemaConflictError, "'legacy_request' is not allowed"):
            store.append(make_stream(AggregateId("order", "o-1", "test-context"), 1))
        # The global mode refuses the per-aggregate uniqueness by its fields too, whatever their order.
        database["customer_event_stream"].create_index([("requestId", 1), ("aggregateId", -1)],
                                                       name="per_aggregate", unique=True)
        store = MongoEventStore(connection, name, schema=SchemaGuard("test-context"), request_id_index="global")
        with self.assertRaisesRegex(SchemaConflictError, "'per_aggregate' is not allowed"):
            store.append(make_stream(AggregateId("customer", "c-1", "test-context"), 1))


    def test_the_ownership_marker_is_wows_document(self):
        """Item 13: ``{_id: "boundedContext", contextName, layoutVersion: 1}``, as Wow writes and reads it."""
        connection, name, guard = self.mongo()
        MongoEventStore(connection, name, schema=guard).append(make_stream(AggregateId("order", "o-1",
                                                                                       "test-context"), 1))
        marker = connection.database(name)["wow_database_metadata"].find_one({"_id": "boundedContext"})
        self.assertEqual((marker["contextName"], marker["layoutVersion"]), ("test-context", 1))

    def test_a_database_claimed_by_a_wow_service_is_refused(self):
        """Item 13: Wow's own marker (no wow_django writer) of this context, of another context, or of a
        layout this version does not know: refused before anything is written."""
        cases = [({"contextName": "test-context", "layoutVersion": 1}, "claimed by a Wow \\(Kotlin\\) service"),
                 ({"contextName": "billing", "layoutVersion": 1}, "belongs to bounded context 'billing'"),
                 ({"contextName": "test-context", "layoutVersion": 2, "writer": "wow_django"}, "layout version 2")]
        connection, name, _ = self.mongo()
        database = connection.database(name)
        for marker, message in cases:
            with self.subTest(marker=marker):
                database["wow_database_metadata"].delete_many({})
                database["wow_database_metadata"].insert_one({"_id": "boundedContext", **marker})
                store = MongoEventStore(connection, name, schema=SchemaGuard("test-context"))
                with self.assertRaisesRegex(DatabaseOwnershipError, message):
                    store.append(make_stream(AggregateId("order", "o-1", "test-context"), 1))
                self.assertNotIn("order_event_stream", database.list_collection_names())

    def test_snapshots_of_another_context_are_seen_before_claiming(self):
        """Item 13: an unclaimed database with another context's snapshots (and no event streams) is
        another service's."""
        connection, name, guard = self.mongo()
        database = connection.database(name)
        database["order_snapshot"].insert_one({"_id": "o-1", "contextName": "billing", "version": 1})
        store = MongoEventStore(connection, name, schema=guard)
        with self.assertRaisesRegex(DatabaseOwnershipError, "snapshots of bounded context 'billing'"):
            store.append(make_stream(AggregateId("order", "o-2", "test-context"), 1))
        self.assertIsNone(database["wow_database_metadata"].find_one({}))

    def test_an_earlier_wow_django_claim_is_still_this_services(self):
        connection, name, _ = self.mongo()
        database = connection.database(name)
        database["wow_database_metadata"].insert_one({"_id": "bounded_context", "contextName": "test-context"})
        MongoEventStore(connection, name, schema=SchemaGuard("test-context")).append(
            make_stream(AggregateId("order", "o-1", "test-context"), 1))
        self.assertEqual(database["wow_database_metadata"].find_one({"_id": "boundedContext"})["contextName"],
                         "test-context")
        with self.assertRaisesRegex(DatabaseOwnershipError, "belongs to bounded context 'test-context'"):
            MongoEventStore(connection, name, schema=SchemaGuard("billing")).load(
                AggregateId("order", "o-1", "billing"))


class TestEmbeddedMongoSchemaRules(EmbeddedMongoDatabase, MongoSchemaRules, unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoSchemaRules(RealMongoDatabase, MongoSchemaRules, unittest.TestCase):
    pass

"""The bus-store conformance suite on every backend: in-memory, embedded Mongo, real Mongo, Django ORM.

The django store runs on a file SQLite and on PostgreSQL (``wow_sqlite``,
``wow_pg``) in TransactionTestCases: the threads of the concurrency cases see
committed rows, each on a connection of its own, which the store closes when
the thread ends (a connection left open would keep the test database from
being dropped).
"""

from __future__ import annotations

import unittest

from django.test import TransactionTestCase

from wow_django.backends.django.bus_store import DjangoBusStore
from wow_django.backends.memory.bus_store import InMemoryBusStore
from wow_django.backends.mongo.bus_store import MongoBusStore
from wow_django.testing import BusStoreContract, EmbeddedMongoDatabase, RealMongoDatabase, requires_real_mongo
from wow_django.testing.bus_store import MongoPurgePlanContract


class TestInMemoryBusStore(BusStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemoryBusStore()


class TestEmbeddedMongoBusStore(EmbeddedMongoDatabase, BusStoreContract, MongoPurgePlanContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoBusStore(connection, name, schema_guard=guard)


@requires_real_mongo
class TestRealMongoBusStore(RealMongoDatabase, BusStoreContract, MongoPurgePlanContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoBusStore(connection, name, schema_guard=guard)


class TestDjangoBusStoreOnSQLite(BusStoreContract, TransactionTestCase):
    databases = {"wow_sqlite"}

    def make_store(self):
        return DjangoBusStore(using="wow_sqlite")


class TestDjangoBusStoreOnPostgreSQL(BusStoreContract, TransactionTestCase):
    databases = {"wow_pg"}

    def make_store(self):
        return DjangoBusStore(using="wow_pg")


class TestMongoSequenceRace(EmbeddedMongoDatabase, unittest.TestCase):
    """Two first messages of one partition race (issue 12, item 1): the loser's upsert meets the winner's
    insert on the unique key, which MongoDB does not retry for a non-equality filter. A fault-injecting
    wrapper replays that interleaving: the other writer inserts ``their`` sequence right before ours."""

    def race(self, theirs: int, ours: int) -> tuple[bool, int]:
        from datetime import UTC, datetime

        from pymongo import errors as pymongo_errors

        connection, name, guard = self.mongo()
        store = MongoBusStore(connection, name, schema_guard=guard)
        real = store.sequences
        now = datetime(2026, 1, 1, tzinfo=UTC)

        class Racing:
            def __getattr__(self, attribute):
                return getattr(real, attribute)

            def update_one(self, filter_, update, upsert=False):
                if upsert:  # the other first message wins the insert between our filter and ours
                    real.insert_one({"consumerId": filter_["consumerId"], "partitionKey": filter_["partitionKey"],
                                     "sequence": theirs, "updatedAt": now})
                    raise pymongo_errors.DuplicateKeyError("E11000 duplicate key", 11000)
                return real.update_one(filter_, update)

        from wow_django.backends.mongo import bus_schema

        collection = store.collection
        store.collection = lambda spec: Racing() if spec is bus_schema.CONSUMER_SEQUENCES_SPEC else collection(spec)
        accepted = store.accept_sequence("member-service", "o-1", ours, now)
        stored = real.find_one({"consumerId": "member-service", "partitionKey": "o-1"})["sequence"]
        return accepted, stored

    def test_the_higher_sequence_is_accepted_when_it_loses_the_insert(self):
        self.assertEqual(self.race(theirs=5, ours=7), (True, 7))

    def test_a_lower_sequence_is_stale_when_it_loses_the_insert(self):
        self.assertEqual(self.race(theirs=7, ours=5), (False, 7))


class TestMongoEventListCosts(EmbeddedMongoDatabase, unittest.TestCase):
    """The event list on MongoDB (issue 12, item 8): an unfiltered total is the collection's estimate, not
    a count of every event; a filtered one is counted; each listing order has an index that serves it."""

    def test_counts_and_indexes(self):
        from wow_django.backends.mongo import bus_schema
        from wow_django.persistence.bus import EventQuery

        connection, name, guard = self.mongo()
        store = MongoBusStore(connection, name, schema_guard=guard)
        real = store.events
        calls: list[str] = []

        class Counting:
            def __getattr__(self, attribute):
                if attribute in ("count_documents", "estimated_document_count"):
                    calls.append(attribute)
                return getattr(real, attribute)

        collection = store.collection
        store.collection = lambda spec: Counting() if spec is bus_schema.EVENTS_SPEC else collection(spec)
        store.find_events(EventQuery(), skip=0, limit=10)
        store.find_events(EventQuery(status="FAILED"), skip=0, limit=10)
        self.assertEqual(calls, ["estimated_document_count", "count_documents"])
        keys = {tuple(dict(ix["key"]).items()) for ix in real.list_indexes()}
        for prefix in ((), (("status", 1),), (("topic", 1),), (("initiator.service", 1),)):
            self.assertIn((*prefix, ("occurredAt", -1), ("eventId", 1)), keys)

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


class TestInMemoryBusStore(BusStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemoryBusStore()


class TestEmbeddedMongoBusStore(EmbeddedMongoDatabase, BusStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoBusStore(connection, name, schema_guard=guard)


@requires_real_mongo
class TestRealMongoBusStore(RealMongoDatabase, BusStoreContract, unittest.TestCase):
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

"""The bus-store conformance suite on every backend: in-memory, embedded Mongo, real Mongo."""

from __future__ import annotations

import unittest

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

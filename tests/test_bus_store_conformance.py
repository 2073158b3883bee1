"""The bus-store conformance suite on every backend: in-memory, embedded Mongo, real Mongo."""

from __future__ import annotations

import unittest

from wow_django.backends.memory.bus_store import InMemoryBusStore
from wow_django.backends.mongo.bus_store import MongoBusStore
from wow_django.testing import BusStoreContract, requires_real_mongo

from .test_conformance import MongoBackend, RealMongoBackend


class TestInMemoryBusStore(BusStoreContract, unittest.TestCase):
    def make_store(self):
        return InMemoryBusStore()


class TestEmbeddedMongoBusStore(MongoBackend, BusStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoBusStore(connection, name, schema_guard=guard)


@requires_real_mongo
class TestRealMongoBusStore(RealMongoBackend, BusStoreContract, unittest.TestCase):
    def make_store(self):
        connection, name, guard = self.mongo()
        return MongoBusStore(connection, name, schema_guard=guard)

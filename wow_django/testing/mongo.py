"""Helpers to run the suite on the embedded engine or a real MongoDB server.

A Mongo backend's conformance test mixes in :class:`EmbeddedMongoDatabase` (or
:class:`RealMongoDatabase`) and builds its store on ``self.mongo()``::

    class TestMyStore(EmbeddedMongoDatabase, EventStoreContract, unittest.TestCase):
        def make_store(self):
            connection, database, guard = self.mongo()
            return MongoEventStore(connection, database, schema=guard)
"""

from __future__ import annotations

import contextlib
import os
import unittest
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.schema import SchemaGuard
from wow_django.testing._case import TestCaseMixin

#: A test class or function, returned as it is (or skipped) by :func:`requires_real_mongo`.
_Test = TypeVar("_Test", bound=Callable[..., Any])

REAL_MONGO_ENV = "WOW_TEST_MONGO_URI"
REAL_MONGO_REASON = (
    f"real MongoDB not configured: set {REAL_MONGO_ENV}=mongodb://host:27017 (a replica set or "
    "standalone ≥ 5.0; each test uses and drops its own database)"
)


def real_mongo_uri() -> str | None:
    return os.environ.get(REAL_MONGO_ENV) or None


def requires_real_mongo(obj: _Test) -> _Test:
    """Skip unless ``WOW_TEST_MONGO_URI`` is set, showing how to set it."""
    return unittest.skipUnless(real_mongo_uri(), REAL_MONGO_REASON)(obj)


def embedded_connection() -> MongoConnection:
    """A fresh embedded engine of its own (not the process-wide one)."""
    return MongoConnection("mongomock://localhost/wow_test")


@contextlib.contextmanager
def temporary_database(connection: MongoConnection) -> Iterator[str]:
    """A uniquely named database, dropped afterwards."""
    name = f"wow_test_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        connection.client.drop_database(name)


def server_connection() -> MongoConnection:
    """A connection to the real server of ``WOW_TEST_MONGO_URI``."""
    uri = real_mongo_uri()
    if not uri:
        raise unittest.SkipTest(REAL_MONGO_REASON)
    return MongoConnection(uri)


class EmbeddedMongoDatabase(TestCaseMixin):
    """A ``unittest.TestCase`` mixin: each test gets its own database on a fresh embedded connection."""

    schema_context = "test-context"

    def connection(self) -> MongoConnection:
        return embedded_connection()

    def mongo(self) -> tuple[MongoConnection, str, SchemaGuard]:
        """``(connection, database name, schema guard)`` of this test; dropped and closed after it."""
        if not hasattr(self, "_wow_mongo"):
            connection = self.connection()
            self.addCleanup(connection.close)
            database = temporary_database(connection)
            self._wow_mongo = (connection, database.__enter__(), SchemaGuard(self.schema_context))
            self.addCleanup(database.__exit__, None, None, None)
        return self._wow_mongo


class RealMongoDatabase(EmbeddedMongoDatabase):
    """The same on the server of ``WOW_TEST_MONGO_URI`` (combine with :func:`requires_real_mongo`)."""

    def connection(self) -> MongoConnection:
        return server_connection()

"""PrepareKey on MongoDB: ``prepare_{name}`` with a TTL index (DESIGN part D).

Every operation is one conditional write: the filter decides whether the
reservation is live, MongoDB's ``_id`` uniqueness decides who wins. Expiry is
judged by ``ttlAt`` in the filters, compared with the store's clock (the real
one unless a ``clock`` is given), so correctness never waits for the TTL
monitor (which only cleans up, on the server's time, and which the embedded
engine lacks).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.backends.mongo.schema import SchemaGuard, prepare_spec
from wow_django.exceptions import UnacknowledgedWriteError
from wow_django.persistence.contracts import NOT_GIVEN, Clock, PrepareKey, check_key, resolve_ttl
from wow_django.persistence.records import PreparedValue


def _naive_utc(moment: datetime) -> datetime:
    """BSON dates are UTC; naive values compare the same on every engine."""
    return moment.astimezone(UTC).replace(tzinfo=None)


class MongoPrepareKey(PrepareKey):
    def __init__(self, name: str, connection: MongoConnection, database_name: str, *, schema: SchemaGuard,
                 max_time_ms: int = 10_000, clock: Clock | None = None):
        super().__init__(name, clock=clock)
        connection.require_acknowledged('PrepareKey')
        self.connection = connection
        database = connection.database(database_name)
        spec = prepare_spec(name)
        schema.ensure(database, spec)
        self.collection = database[spec.name]
        self.max_time_ms = max_time_ms

    def _now(self) -> datetime:
        """The store clock's now as BSON keeps it: what ``ttlAt`` is compared with (not the server's time)."""
        return _naive_utc(self.now())

    def _acknowledged(self, result) -> None:
        if not result.acknowledged:
            raise UnacknowledgedWriteError(f"write to {self.collection.name} was not acknowledged")

    def prepare(self, key: str, value: Any, ttl: timedelta | datetime | None = None) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = _naive_utc(resolve_ttl(ttl, now))
        try:
            with recoverable_errors(f"preparing {self.name} {key!r}"):
                with self.connection.guard(self.collection, write=True):
                    # Matches only an expired reservation; otherwise the upsert
                    # inserts, and a live reservation makes that a duplicate _id.
                    result = self.collection.replace_one(
                        {"_id": key, "ttlAt": {"$lte": _naive_utc(now)}}, {"value": value, "ttlAt": ttl_at}, upsert=True
                    )
        except pymongo_errors.DuplicateKeyError:
            return False
        self._acknowledged(result)
        return True

    def get(self, key: str) -> PreparedValue | None:
        check_key(key)
        with recoverable_errors(f"reading {self.name} {key!r}"), self.connection.guard(self.collection):
            doc = self.collection.find_one({"_id": key, "ttlAt": {"$gt": self._now()}}, max_time_ms=self.max_time_ms)
        if doc is None:
            return None
        return PreparedValue(doc.get("value"), doc["ttlAt"].replace(tzinfo=UTC))

    def rollback(self, key: str, value: Any = NOT_GIVEN) -> bool:
        check_key(key)
        query: dict = {"_id": key, "ttlAt": {"$gt": self._now()}}
        if value is not NOT_GIVEN:
            query["value"] = {"$eq": value}  # literally: a raw dict with "$" keys would act as an operator
        with recoverable_errors(f"rolling back {self.name} {key!r}"):
            with self.connection.guard(self.collection, write=True):
                result = self.collection.delete_one(query)
        self._acknowledged(result)
        return result.deleted_count == 1

    def reprepare(
        self, key: str, new_value: Any, *, old_value: Any = NOT_GIVEN, ttl: timedelta | datetime | None = None
    ) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = _naive_utc(resolve_ttl(ttl, now))
        query: dict = {"_id": key, "ttlAt": {"$gt": _naive_utc(now)}}
        if old_value is not NOT_GIVEN:
            query["value"] = {"$eq": old_value}  # literally (document values compare field order too)
        with recoverable_errors(f"repreparing {self.name} {key!r}"):
            with self.connection.guard(self.collection, write=True):
                result = self.collection.update_one(query, {"$set": {"value": new_value, "ttlAt": ttl_at}})
        self._acknowledged(result)
        return result.matched_count == 1

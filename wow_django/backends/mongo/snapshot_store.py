"""Snapshot store on MongoDB: version-guarded atomic save (DESIGN part B)."""

from __future__ import annotations

from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.codec import from_bson, holds_decimal, to_bson
from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.backends.mongo.schema import SchemaGuard, snapshot_spec
from wow_django.exceptions import UnacknowledgedWriteError
from wow_django.persistence.contracts import SnapshotStore
from wow_django.persistence.documents import document_to_snapshot, snapshot_to_document
from wow_django.persistence.records import AggregateId, Snapshot


def version_guarded_pipeline(document: dict) -> list[dict]:
    """An update pipeline that replaces the document unless it holds a higher version.

    In MongoDB's cross-type comparison order every number lies between -inf
    and +inf, null and missing values below, strings, objects and the rest
    above. So "the stored version is below -inf or above +inf" means it is
    missing or not a number, and such a document is replaced, as is one whose
    version is ≤ the candidate's. ``$literal`` keeps user state (keys starting
    with ``$`` included) from being read as expressions. Needs MongoDB ≥ 4.2.
    """
    stored = {"$ifNull": ["$version", None]}  # missing → null, explicitly
    replace = {
        "$or": [
            {"$lt": [stored, {"$literal": float("-inf")}]},
            {"$gt": [stored, {"$literal": float("inf")}]},
            {"$gte": [{"$literal": document["version"]}, stored]},
        ]
    }
    return [{"$replaceRoot": {"newRoot": {"$cond": {"if": replace, "then": {"$literal": document}, "else": "$$ROOT"}}}}]


class MongoSnapshotStore(SnapshotStore):
    """``{aggregateName}_snapshot`` collections, ``_id`` = aggregate id."""

    def __init__(self, connection: MongoConnection, database_name: str, *, schema: SchemaGuard,
                 max_time_ms: int = 10_000):
        connection.require_acknowledged('the snapshot store')
        self.connection = connection
        self.database = connection.database(database_name)
        self.schema = schema
        self.max_time_ms = max_time_ms
        self._collections: dict[str, object] = {}

    def collection(self, aggregate_name: str):
        collection = self._collections.get(aggregate_name)
        if collection is None:
            spec = snapshot_spec(aggregate_name)
            self.schema.ensure(self.database, spec)
            collection = self._collections[aggregate_name] = self.database[spec.name]
        return collection

    def load(self, aggregate_id: AggregateId) -> Snapshot | None:
        collection = self.collection(aggregate_id.aggregate_name)
        with recoverable_errors(f"reading {collection.name}"), self.connection.guard(collection):
            # The tenant too: another tenant's aggregate id finds nothing (defence in depth behind the callers).
            doc = collection.find_one({"_id": aggregate_id.id, "tenantId": aggregate_id.tenant_id},
                                      max_time_ms=self.max_time_ms)
        return document_to_snapshot(from_bson(doc)) if doc else None

    def save(self, snapshot: Snapshot) -> None:
        collection = self.collection(snapshot.aggregate_id.aggregate_name)
        document = snapshot_to_document(snapshot)
        if holds_decimal(document["state"]):
            document["state"] = to_bson(document["state"])
            self.connection.note_decimals(collection)
        with recoverable_errors(f"saving snapshot {collection.name} {snapshot.aggregate_id.id!r}"), \
                self.connection.write_limit():
            if self.connection.embedded:
                result = self._save_embedded(collection, document)
            else:
                # One round trip; the server retries an upsert whose filter is an equality on _id when two
                # first saves collide (MongoDB ≥ 4.2). One retry here too, for servers and topologies that
                # do not: the document exists by then, and the guarded update decides.
                update = version_guarded_pipeline(document)
                try:
                    result = collection.update_one({"_id": document["_id"]}, update, upsert=True)
                except pymongo_errors.DuplicateKeyError:
                    result = collection.update_one({"_id": document["_id"]}, update, upsert=True)
        if result is not None and not result.acknowledged:
            raise UnacknowledgedWriteError(f"snapshot save on {collection.name} was not acknowledged")

    def _save_embedded(self, collection, document: dict):
        """The embedded engine lacks update pipelines: same rule, under its write guard."""
        with self.connection.guard(collection, write=True):
            stored = collection.find_one({"_id": document["_id"]}, {"version": 1})
            version = stored.get("version") if stored else None
            number = isinstance(version, (int, float)) and not isinstance(version, bool) and version == version
            if number and document["version"] < version:
                return None
            return collection.replace_one({"_id": document["_id"]}, document, upsert=True)

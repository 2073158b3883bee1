"""Mongo error mapping: index names, recoverable errors, unacknowledged writes.

Real MongoDB names the violated index (``keyPattern`` and the message); these
tests feed the store errors shaped exactly like a server's, and check that no
confirming read is needed then. The embedded engine names nothing: the
conformance suite covers that path.
"""

from __future__ import annotations

import contextlib

import mongomock
import pytest
from bson import errors as bson_errors
from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.errors import duplicate_key_kind, is_recoverable
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.schema import SchemaGuard
from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore, version_guarded_pipeline
from wow_django.exceptions import (
    DuplicateAggregateId,
    DuplicateEventStreamId,
    DuplicateRequestId,
    EventVersionConflict,
    RecoverableStoreError,
    UnacknowledgedWriteError,
)
from wow_django.persistence.records import AggregateId
from wow_django.testing import make_snapshot, make_stream
from wow_django.testing.mongo import embedded_connection


def server_error(index: str, key_pattern: dict) -> dict:
    return {
        "index": 0,
        "code": 11000,
        "keyPattern": key_pattern,
        "keyValue": {k: "x" for k in key_pattern},
        "errmsg": f"E11000 duplicate key error collection: shop.order_event_stream index: {index} dup key: {{...}}",
    }


@pytest.mark.parametrize(
    "error, kind",
    [
        (server_error("aggregateId_1_version_1", {"aggregateId": 1, "version": 1}), "version"),
        (server_error("aggregateId_1_requestId_1", {"aggregateId": 1, "requestId": 1}), "request"),
        (server_error("requestId_1", {"requestId": 1}), "request"),
        (server_error("_id_", {"_id": 1}), "id"),
        ({"code": 11000, "errmsg": "E11000 duplicate key error index: aggregateId_1_version_1 dup key"}, "version"),
        ({"code": 11000, "errmsg": "E11000 duplicate key error index: requestId_1 dup key"}, "request"),
        ({"code": 11000, "errmsg": "E11000 Duplicate Key Error"}, None),  # the embedded engine
        (None, None),
    ],
)
def test_duplicate_key_kind(error, kind):
    assert duplicate_key_kind(error) == kind


class Result:
    def __init__(self, acknowledged=True):
        self.acknowledged = acknowledged


class FakeCollection:
    """Raises what a server would; any read fails the test (none is needed)."""

    name = "order_event_stream"

    def __init__(self, raise_on_insert=None, acknowledged=True):
        self.raise_on_insert = raise_on_insert
        self.acknowledged = acknowledged
        self.database = mongomock.MongoClient().db

    def insert_one(self, document):
        if self.raise_on_insert:
            raise self.raise_on_insert
        return Result(self.acknowledged)

    def insert_many(self, documents, ordered=True):
        if self.raise_on_insert:
            raise self.raise_on_insert
        return Result(self.acknowledged)

    def find_one(self, *args, **kwargs):
        raise AssertionError("the server named the index; no confirming read is needed")


def store_with(collection):
    store = MongoEventStore(embedded_connection(), "mapping", schema=SchemaGuard("t"))
    store._collections["order"] = collection
    return store


def duplicate(index, pattern):
    details = server_error(index, pattern)
    return pymongo_errors.DuplicateKeyError(details["errmsg"], 11000, details)


AGG = AggregateId("order", "o-1")


def test_version_index_maps_to_version_conflict():
    store = store_with(FakeCollection(duplicate("aggregateId_1_version_1", {"aggregateId": 1, "version": 1})))
    with pytest.raises(EventVersionConflict) as caught:
        store.append(make_stream(AGG, 4))
    assert not isinstance(caught.value, DuplicateAggregateId)
    with pytest.raises(DuplicateAggregateId):
        store.append(make_stream(AGG, 1))


def test_request_id_indexes_map_to_duplicate_request_id():
    for index, pattern in (("aggregateId_1_requestId_1", {"aggregateId": 1, "requestId": 1}),
                           ("requestId_1", {"requestId": 1})):
        store = store_with(FakeCollection(duplicate(index, pattern)))
        with pytest.raises(DuplicateRequestId):
            store.append(make_stream(AGG, 2, request_id="r-9"))


def test_id_index_maps_to_duplicate_stream_id():
    store = store_with(FakeCollection(duplicate("_id_", {"_id": 1})))
    with pytest.raises(DuplicateEventStreamId):
        store.append(make_stream(AGG, 2))


def test_bulk_errors_are_mapped_per_stream():
    details = {
        "writeErrors": [
            {**server_error("aggregateId_1_version_1", {"aggregateId": 1, "version": 1}), "index": 1},
            {**server_error("aggregateId_1_requestId_1", {"aggregateId": 1, "requestId": 1}), "index": 2},
        ],
        "nInserted": 1,
    }
    store = store_with(FakeCollection(pymongo_errors.BulkWriteError(details)))
    results = store.append_many([make_stream(AGG, 3), make_stream(AGG, 1), make_stream(AGG, 5)])
    assert results[0] is None
    assert isinstance(results[1], DuplicateAggregateId)
    assert isinstance(results[2], DuplicateRequestId)


@pytest.mark.parametrize(
    "exc",
    [
        pymongo_errors.AutoReconnect("connection reset"),
        pymongo_errors.NetworkTimeout("timed out"),
        pymongo_errors.ServerSelectionTimeoutError("no primary"),
        pymongo_errors.NotPrimaryError("not primary"),
        pymongo_errors.OperationFailure("stepped down", code=189),
        pymongo_errors.OperationFailure("interrupted", code=11602),
        pymongo_errors.WTimeoutError("waiting for replication timed out", code=64),
        pymongo_errors.ExecutionTimeout("operation exceeded time limit", code=50),
    ],
)
def test_transient_failures_are_recoverable(exc):
    assert is_recoverable(exc)
    store = store_with(FakeCollection(exc))
    with pytest.raises(RecoverableStoreError, match="retry") as caught:
        store.append(make_stream(AGG, 2))
    assert caught.value.__cause__ is exc
    results = store.append_many([make_stream(AGG, 2), make_stream(AGG, 3)])
    assert all(isinstance(r, RecoverableStoreError) for r in results)


def test_other_server_errors_pass_through():
    exc = pymongo_errors.OperationFailure("not authorized", code=13)
    assert not is_recoverable(exc)
    with pytest.raises(pymongo_errors.OperationFailure, match="not authorized"):
        store_with(FakeCollection(exc)).append(make_stream(AGG, 2))


def test_unacknowledged_append_is_an_error():
    store = store_with(FakeCollection(acknowledged=False))
    with pytest.raises(UnacknowledgedWriteError, match="w ≥ 1"):
        store.append(make_stream(AGG, 2))
    [result] = store.append_many([make_stream(AGG, 2)])
    assert isinstance(result, UnacknowledgedWriteError)


def test_unacknowledged_snapshot_save_is_an_error():
    store = MongoSnapshotStore(embedded_connection(), "mapping", schema=SchemaGuard("t"))

    class Unacknowledged:
        name = "order_snapshot"
        database = mongomock.MongoClient().db

        def find_one(self, *args, **kwargs):
            return None

        def replace_one(self, *args, **kwargs):
            return Result(False)

    store._collections["order"] = Unacknowledged()
    with pytest.raises(UnacknowledgedWriteError):
        store.save(make_snapshot(AGG, 1))


# --- the server-side snapshot guard --------------------------------------------


def guarded(stored: dict, candidate_version: int) -> dict:
    """Run the update pipeline's expression through the aggregation engine.

    The embedded engine cannot run update pipelines, but it evaluates the same
    ``$replaceRoot`` expression in ``aggregate``: the guard MongoDB applies.
    """
    collection = mongomock.MongoClient().db.snapshots
    collection.insert_one(stored)
    candidate = {"_id": stored["_id"], "version": candidate_version, "state": {"$set": "kept verbatim"}}
    [stage] = version_guarded_pipeline(candidate)
    [result] = collection.aggregate([{"$match": {"_id": stored["_id"]}}, stage])
    return result


@pytest.mark.parametrize(
    "stored, candidate, wins",
    [
        ({"_id": "a", "version": 5}, 4, False),
        ({"_id": "a", "version": 5}, 5, True),
        ({"_id": "a", "version": 5}, 6, True),
        ({"_id": "a"}, 1, True),  # missing version (also the fresh-upsert case)
        ({"_id": "a", "version": "7"}, 1, True),  # not an integer
        ({"_id": "a", "version": None}, 1, True),
        ({"_id": "a", "version": {"n": 9}}, 1, True),
        ({"_id": "a", "version": 5.0}, 4, False),
        ({"_id": "a", "version": 2**40}, 7, False),  # a long
    ],
)
def test_version_guarded_pipeline(stored, candidate, wins):
    result = guarded(stored, candidate)
    if wins:
        assert result == {"_id": "a", "version": candidate, "state": {"$set": "kept verbatim"}}
    else:
        assert result == stored


class GroupCollection(FakeCollection):
    """insert_many raises ``many``; insert_one refuses documents whose stream id is in ``bad``."""

    def __init__(self, many=None, bad=()):
        super().__init__()
        self.many = many
        self.bad = set(bad)
        self.inserted: list[str] = []

    def insert_many(self, documents, ordered=True):
        raise self.many

    def insert_one(self, document):
        if document["_id"] in self.bad:
            raise bson_errors.InvalidDocument(f"cannot encode {document['_id']}")
        self.inserted.append(document["_id"])
        return Result(True)


def test_a_transient_write_error_in_a_batch_is_recoverable_for_its_stream_only():
    details = {"writeErrors": [{"index": 1, "code": 91, "errmsg": "ShutdownInProgress"}], "nInserted": 2}
    store = store_with(FakeCollection(pymongo_errors.BulkWriteError(details)))
    results = store.append_many([make_stream(AGG, 3), make_stream(AGG, 4), make_stream(AGG, 5)])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], RecoverableStoreError) and "ShutdownInProgress" in str(results[1])


def test_one_groups_failure_is_not_given_to_the_other_groups():
    store = store_with(FakeCollection())
    store._collections["customer"] = GroupCollection(pymongo_errors.OperationFailure("bad value", code=2))
    customer = AggregateId("customer", "c-1")
    results = store.append_many([make_stream(AGG, 3), make_stream(customer, 1), make_stream(AGG, 4)])
    assert results[0] is None and results[2] is None  # the orders were stored
    assert isinstance(results[1], pymongo_errors.OperationFailure)


def test_a_document_the_driver_cannot_encode_fails_alone():
    streams = [make_stream(AGG, 3), make_stream(AGG, 4), make_stream(AGG, 5)]
    collection = GroupCollection(bson_errors.InvalidDocument("cannot encode"), bad={streams[1].id})
    store = store_with(collection)
    results = store.append_many(streams)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], bson_errors.InvalidDocument)
    assert collection.inserted == [streams[0].id, streams[2].id]


@pytest.mark.parametrize("exc", [
    pymongo_errors.WriteConcernError("cannot satisfy write concern", code=100),
    pymongo_errors.WriteConcernError("unknown replica set tag", code=79),
    pymongo_errors.BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 100, "errmsg": "w"}]}),
])
def test_a_write_concern_error_is_outcome_unknown_not_a_failure(exc):
    """The write may have landed: recoverable (the gateway reads back before compensating)."""
    assert is_recoverable(exc)
    store = store_with(FakeCollection(exc))
    with pytest.raises(RecoverableStoreError):
        store.append(make_stream(AGG, 2))


def test_a_bulk_error_with_write_errors_is_not_recoverable_as_a_whole():
    details = {"writeErrors": [{"index": 0, "code": 2, "errmsg": "bad"}], "writeConcernErrors": [{"code": 64}]}
    assert not is_recoverable(pymongo_errors.BulkWriteError(details))


def test_a_first_snapshot_save_that_loses_the_insert_is_retried_once():
    store = MongoSnapshotStore(embedded_connection(), "mapping", schema=SchemaGuard("t"))
    store.connection = type("Server", (), {"embedded": False,  # the server path (an update pipeline)
                                           "write_limit": lambda self: contextlib.nullcontext()})()
    calls = []

    class Racing:
        name = "order_snapshot"

        def update_one(self, filter_, update, upsert=False):
            calls.append(filter_)
            if len(calls) == 1:
                raise pymongo_errors.DuplicateKeyError("E11000 duplicate key error index: _id_", 11000)
            return Result(True)

    store._collections["order"] = Racing()
    store.save(make_snapshot(AGG, 3))
    assert calls == [{"_id": AGG.id}, {"_id": AGG.id}]


def test_an_ownership_claim_that_loses_the_insert_is_retried_once():
    from wow_django.backends.mongo.schema import claim_database

    real = mongomock.MongoClient().db

    class Racing:
        name = "claims"
        calls = 0

        def list_collection_names(self):
            return real.list_collection_names()

        def __getitem__(self, name):
            collection = real[name]
            outer = self

            class Claims:
                def find_one(self, *args, **kwargs):
                    return collection.find_one(*args, **kwargs)

                def find_one_and_update(self, *args, **kwargs):
                    outer.calls += 1
                    if outer.calls == 1:  # another process inserted the claim between our filter and insert
                        collection.insert_one({"_id": "boundedContext", "contextName": "orders",
                                               "layoutVersion": 1, "writer": "wow_django"})
                        raise pymongo_errors.DuplicateKeyError("E11000", 11000)
                    return collection.find_one_and_update(*args, **kwargs)

            return Claims()

    database = Racing()
    report = claim_database(database, "orders")
    assert database.calls == 2 and not report.ownership


# --- the driver's exception stays the cause of a mapped error (issue 22, item 16) ---------------------


@pytest.mark.parametrize("index, pattern, expected", [
    ("aggregateId_1_version_1", {"aggregateId": 1, "version": 1}, EventVersionConflict),
    ("aggregateId_1_requestId_1", {"aggregateId": 1, "requestId": 1}, DuplicateRequestId),
    ("_id_", {"_id": 1}, DuplicateEventStreamId),
])
def test_a_mapped_duplicate_key_keeps_the_drivers_error_as_its_cause(index, pattern, expected):
    """Operators see the server's message (index, key) behind the mapped error. The error is the one a
    server raises (the embedded engine's carries no index name): injected by a fake collection."""
    error = duplicate(index, pattern)
    store = store_with(FakeCollection(error))
    with pytest.raises(expected) as caught:
        store.append(make_stream(AGG, 2))
    assert caught.value.__cause__ is error


def test_a_mapped_error_of_a_batch_keeps_the_servers_write_error_as_its_cause():
    """Each stream's error has a cause naming its own write error (code, message), chained to the batch's
    ``BulkWriteError``. Injected: only a server reports per-document errors with index names."""
    details = {
        "writeErrors": [
            {**server_error("aggregateId_1_version_1", {"aggregateId": 1, "version": 1}), "index": 1},
            {"index": 2, "code": 2, "errmsg": "BadValue: something the server refused"},
        ],
        "nInserted": 1,
    }
    bulk = pymongo_errors.BulkWriteError(details)
    store = store_with(FakeCollection(bulk))
    results = store.append_many([make_stream(AGG, 3), make_stream(AGG, 4), make_stream(AGG, 5)])
    assert results[0] is None
    conflict, other = results[1], results[2]
    assert isinstance(conflict, EventVersionConflict)
    assert isinstance(conflict.__cause__, pymongo_errors.DuplicateKeyError)
    assert conflict.__cause__.code == 11000 and "aggregateId_1_version_1" in str(conflict.__cause__)
    assert conflict.__cause__.__cause__ is bulk
    assert isinstance(other.__cause__, pymongo_errors.WriteError) and other.__cause__.code == 2
    assert "something the server refused" in str(other)


# --- recoverable write errors, as in Wow (issue 22, item 15) ---------------------------------------------


@pytest.mark.parametrize("code", [133, 264])  # FailedToSatisfyReadPreference; StaleEpoch (sharding)
def test_write_errors_133_and_264_are_recoverable_as_in_wow(code):
    """A server answers these in a failover or a chunk migration; injected by a fake collection."""
    single = pymongo_errors.WriteError(f"write error {code}", code, {"code": code, "errmsg": f"error {code}"})
    assert is_recoverable(single)
    store = store_with(FakeCollection(single))
    with pytest.raises(RecoverableStoreError) as caught:
        store.append(make_stream(AGG, 2))
    assert caught.value.__cause__ is single
    details = {"writeErrors": [{"index": 0, "code": code, "errmsg": f"error {code}"}], "nInserted": 1}
    store = store_with(FakeCollection(pymongo_errors.BulkWriteError(details)))
    results = store.append_many([make_stream(AGG, 3), make_stream(AGG, 4)])
    assert isinstance(results[0], RecoverableStoreError) and results[1] is None


class ChunkedCollection:
    """A real (embedded) collection whose ``insert_many`` stores the first ``stored`` documents, then raises
    ``InvalidDocument`` — what pymongo does when it cannot encode a document of a later chunk of a large batch
    (only a batch past the server's message size has chunks)."""

    def __init__(self, collection, stored: int):
        self.collection, self.stored = collection, stored

    def __getattr__(self, name):
        return getattr(self.collection, name)

    def insert_many(self, documents, ordered=True):
        self.collection.insert_many(documents[:self.stored], ordered=ordered)
        raise bson_errors.InvalidDocument("cannot encode an object of a later chunk")


def test_a_batch_that_fails_after_an_earlier_chunk_was_stored_reports_no_duplicates():
    """Issue 22, item 9: the one-by-one fallback found the earlier chunk's documents stored and reported
    DuplicateEventStreamId (the gateway would then release the keys of a stored command)."""
    store = MongoEventStore(embedded_connection(), "chunked", schema=SchemaGuard("t"))
    store._collections["order"] = ChunkedCollection(store.collection("order"), stored=2)
    aggregates = [AggregateId("order", f"o-{i}", "t") for i in range(4)]
    streams = [make_stream(agg, 1) for agg in aggregates]
    assert store.append_many(streams) == [None, None, None, None]
    for agg, stream in zip(aggregates, streams, strict=True):
        assert store.load(agg) == [stream]
    # A true duplicate in the fallback is still one.
    again = make_stream(aggregates[0], 1)
    [result] = store.append_many([again])
    assert isinstance(result, DuplicateAggregateId)

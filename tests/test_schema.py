"""Collections, pinned index names, reconciliation, ownership, wow_init_schema."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from wow_django.application.runtime import get_runtime
from wow_django.backends.mongo import get_connection
from wow_django.backends.mongo.client import disconnect
from wow_django.backends.mongo.schema import (
    SchemaGuard,
    claim_database,
    event_stream_spec,
    reconcile_collection,
    snapshot_spec,
)
from wow_django.domain import registry
from wow_django.exceptions import DatabaseOwnershipError, SchemaConflictError
from wow_django.persistence.records import AggregateId
from wow_django.testing import make_snapshot, make_stream

EVENT_INDEXES = {
    "_id_": {"_id": 1},
    "aggregateId_hashed": {"aggregateId": "hashed"},
    "aggregateId_1_version_1": {"aggregateId": 1, "version": 1},
    "aggregateId_1_requestId_1": {"aggregateId": 1, "requestId": 1},
    "tenantId_hashed": {"tenantId": "hashed"},
    "ownerId_hashed": {"ownerId": "hashed"},
    "contextName_1_position_1": {"contextName": 1, "position": 1},
}
SNAPSHOT_INDEXES = {
    "_id_": {"_id": 1},
    "tenantId_hashed": {"tenantId": "hashed"},
    "ownerId_hashed": {"ownerId": "hashed"},
    "_id_hashed": {"_id": "hashed"},
    "deleted_hashed": {"deleted": "hashed"},
}


@pytest.fixture
def wow():
    """Fresh embedded engine and settings for one test; yields the settings dict."""
    uri = f"mongomock://localhost/schema_{uuid.uuid4().hex[:8]}"
    settings = {"MONGO_URI": uri, "CONTEXT_NAME": "order-service"}
    with override_settings(WOW=settings):
        yield settings
    disconnect(uri)


@pytest.fixture
def order_registered():
    """The sample project declares the order and customer aggregates and the username key."""
    assert {"order", "customer"} <= set(registry.current().aggregate_names())
    assert "username" in registry.current().prepare_key_names()


def indexes(collection):
    return {ix["name"]: dict(ix["key"]) for ix in collection.list_indexes()}


def unique_names(collection):
    return {ix["name"] for ix in collection.list_indexes() if ix.get("unique")}


def test_event_store_creates_the_pinned_indexes_on_first_use(wow):
    store = get_runtime().event_store
    store.append(make_stream(AggregateId("order", "o-1"), 1))
    collection = get_connection().database("schema_" + wow["MONGO_URI"].rsplit("_", 1)[1])["order_event_stream"]
    assert indexes(collection) == EVENT_INDEXES
    assert unique_names(collection) == {"aggregateId_1_version_1", "aggregateId_1_requestId_1"}


def test_snapshot_store_creates_the_pinned_indexes(wow):
    get_runtime().snapshot_store.save(make_snapshot(AggregateId("order", "o-1"), 1))
    db = get_connection().database(wow["MONGO_URI"].rsplit("/", 1)[1])
    assert indexes(db["order_snapshot"]) == SNAPSHOT_INDEXES


def test_prepare_key_has_a_ttl_index(wow):
    get_runtime().prepare_key("username").prepare("alice", "c-1")
    db = get_connection().database(wow["MONGO_URI"].rsplit("/", 1)[1])
    [ttl] = [ix for ix in db["prepare_username"].list_indexes() if ix["name"] == "ttlAt_1"]
    assert dict(ttl["key"]) == {"ttlAt": 1} and ttl["expireAfterSeconds"] == 0


def test_global_request_id_mode(wow):
    with override_settings(WOW={**wow, "REQUEST_ID_INDEX": "global"}):
        store = get_runtime().event_store
        store.append(make_stream(AggregateId("order", "o-1"), 1, request_id="r-1"))
        collection = store.collection("order")
        assert "requestId_1" in indexes(collection)
        assert "aggregateId_1_requestId_1" not in indexes(collection)
        from wow_django.exceptions import DuplicateRequestId

        with pytest.raises(DuplicateRequestId):
            store.append(make_stream(AggregateId("order", "o-2"), 1, request_id="r-1"))


def test_the_other_request_id_mode_is_a_startup_error(wow):
    get_runtime().event_store.append(make_stream(AggregateId("order", "o-1"), 1))
    with override_settings(WOW={**wow, "REQUEST_ID_INDEX": "global"}):
        with pytest.raises(SchemaConflictError, match="'aggregateId_1_requestId_1' is not allowed"):
            get_runtime().event_store.load(AggregateId("order", "o-1"))


def fresh_db():
    from wow_django.testing.mongo import embedded_connection

    return embedded_connection().database("reconcile")


def test_reconcile_creates_then_verifies_and_keeps_user_indexes():
    db = fresh_db()
    spec = event_stream_spec("order")
    first = reconcile_collection(db, spec)
    assert {s for *_, s in first.lines} == {"created"}
    db["order_event_stream"].create_index([("createTime", 1)], name="idx_create_time")
    second = reconcile_collection(db, spec)
    assert {s for *_, s in second.lines} == {"verified"} and second.matches
    assert "idx_create_time" in indexes(db["order_event_stream"])


def test_right_name_with_other_keys_is_refused_and_nothing_is_created():
    db = fresh_db()
    db["order_event_stream"].create_index([("version", 1), ("aggregateId", 1)], name="aggregateId_1_version_1",
                                           unique=True)
    report = reconcile_collection(db, event_stream_spec("order"))
    assert not report.matches
    [problem] = report.problems
    assert "index 'aggregateId_1_version_1' has keys" in problem and "drop or rename" in problem
    assert set(indexes(db["order_event_stream"])) == {"_id_", "aggregateId_1_version_1"}


def test_right_name_without_unique_is_refused():
    db = fresh_db()
    db["order_event_stream"].create_index([("aggregateId", 1), ("version", 1)], name="aggregateId_1_version_1")
    [problem] = reconcile_collection(db, event_stream_spec("order")).problems
    assert "unique=False, expected unique=True" in problem


def test_right_keys_under_another_name_are_refused():
    db = fresh_db()
    db["order_snapshot"].create_index([("deleted", "hashed")], name="my_deleted")
    [problem] = reconcile_collection(db, snapshot_spec("order")).problems
    assert "'my_deleted' has the keys wow_django needs for 'deleted_hashed'" in problem


def test_conflict_through_the_store_raises_a_clear_error(wow):
    db = get_connection().database(wow["MONGO_URI"].rsplit("/", 1)[1])
    db["order_snapshot"].create_index([("tenantId", 1)], name="tenantId_hashed")
    with pytest.raises(SchemaConflictError, match="tenantId_hashed"):
        get_runtime().snapshot_store.load(AggregateId("order", "x"))


def test_a_database_belongs_to_one_context():
    db = fresh_db()
    assert claim_database(db, "order-service").matches
    assert claim_database(db, "order-service").matches
    report = claim_database(db, "billing")
    assert "belongs to bounded context 'order-service', not 'billing'" in report.problems[0]
    guard = SchemaGuard("billing")
    with pytest.raises(DatabaseOwnershipError, match="WOW\\['CONTEXT_NAME'\\]"):
        guard.ensure(db, snapshot_spec("order"))
    assert "order_snapshot" not in db.list_collection_names()


def test_store_of_another_context_fails_before_writing(wow):
    get_runtime().event_store.append(make_stream(AggregateId("order", "o-1"), 1))
    with override_settings(WOW={**wow, "CONTEXT_NAME": "billing"}):
        with pytest.raises(DatabaseOwnershipError):
            get_runtime().snapshot_store.save(make_snapshot(AggregateId("order", "o-1"), 1))
    db = get_connection().database(wow["MONGO_URI"].rsplit("/", 1)[1])
    assert "order_snapshot" not in db.list_collection_names()


def test_auto_init_off_creates_no_indexes(wow):
    with override_settings(WOW={**wow, "AUTO_INIT_SCHEMA": False}):
        store = get_runtime().event_store
        store.append(make_stream(AggregateId("order", "o-1"), 1))
        assert set(indexes(store.collection("order"))) == {"_id_"}


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("wow_init_schema", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_wow_init_schema_creates_then_verifies(wow, order_registered):
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("wow_init_schema", "--check", stdout=out, stderr=StringIO())
    assert caught.value.returncode == 1
    assert "missing   " in out.getvalue() and "order_event_stream aggregateId_1_version_1" in out.getvalue()
    out, _ = run()
    assert "created   " in out and "order_event_stream aggregateId_1_version_1" in out
    assert "prepare_username ttlAt_1" in out
    out, _ = run("--check")
    assert "Schema OK" in out and "created" not in out


def test_wow_init_schema_check_reports_a_conflict(wow, order_registered):
    run()
    db = get_connection().database(wow["MONGO_URI"].rsplit("/", 1)[1])
    db["order_snapshot"].drop_index("deleted_hashed")
    db["order_snapshot"].create_index([("deleted", 1)], name="deleted_hashed")
    with pytest.raises(CommandError) as caught:
        run("--check")
    assert caught.value.returncode == 1
    assert "Schema does not match" in str(caught.value)


def test_wow_init_schema_refuses_another_contexts_database(wow, order_registered):
    run()
    with override_settings(WOW={**wow, "CONTEXT_NAME": "billing"}):
        err = StringIO()
        with pytest.raises(CommandError):
            call_command("wow_init_schema", stdout=StringIO(), stderr=err)
        assert "belongs to bounded context 'order-service'" in err.getvalue()


def test_a_collection_created_concurrently_on_the_server_is_fine():
    """Two processes creating one collection: the loser's NamespaceExists (48) is not an error."""
    from pymongo.errors import OperationFailure

    db = fresh_db()

    class Racing:
        name = db.name

        def list_collection_names(self):
            return []  # not there yet when this process looked

        def create_collection(self, name):
            db.create_collection(name)  # the other process wins...
            raise OperationFailure("Collection already exists. NS: reconcile.order_snapshot", code=48)

        def __getitem__(self, name):
            return db[name]

    report = reconcile_collection(Racing(), snapshot_spec("order"))
    assert not report.problems
    assert set(indexes(db["order_snapshot"])) == set(SNAPSHOT_INDEXES)


def test_other_create_collection_failures_are_not_swallowed():
    from pymongo.errors import OperationFailure

    class Refusing:
        name = "x"

        def list_collection_names(self):
            return []

        def create_collection(self, name):
            raise OperationFailure("not authorized on x to execute command", code=13)

    with pytest.raises(OperationFailure, match="not authorized"):
        reconcile_collection(Refusing(), snapshot_spec("order"))


class ListedDatabase:
    """A database whose collection lists the given indexes (as a server would, collation included) and
    whose index builds fail with ``refuse``."""

    name = "listed"

    def __init__(self, collection: str, listed: list[dict], refuse=None):
        self.collection_name, self.listed, self.refuse = collection, listed, refuse

    def list_collection_names(self):
        return [self.collection_name]

    def __getitem__(self, name):
        database = self

        class Collection:
            def list_indexes(self):
                return [{"name": "_id_", "key": {"_id": 1}}, *database.listed]

            def create_index(self, keys, **options):
                if database.refuse is not None:
                    raise database.refuse
                return options["name"]

        return Collection()


def test_a_unique_index_with_a_case_insensitive_collation_is_not_verified():
    listed = [{"name": "aggregateId_1_version_1", "key": {"aggregateId": 1, "version": 1}, "unique": True,
               "collation": {"locale": "en", "strength": 2}}]
    report = reconcile_collection(ListedDatabase("order_event_stream", listed), event_stream_spec("order"),
                                  check_only=True)
    [problem] = report.problems
    assert "collation 'en'" in problem and "aggregateId_1_version_1" in problem
    simple = [{**listed[0], "collation": {"locale": "simple"}}]
    assert not reconcile_collection(ListedDatabase("order_event_stream", simple), event_stream_spec("order"),
                                    check_only=True).problems


def test_the_other_modes_uniqueness_is_refused_by_its_keys_whatever_its_name():
    spec = event_stream_spec("order", "aggregate")
    renamed = [{"name": "uniq_request", "key": {"requestId": 1}, "unique": True}]
    [problem] = reconcile_collection(ListedDatabase("order_event_stream", renamed), spec, check_only=True).problems
    assert "'uniq_request' is not allowed" in problem
    lookup = [{"name": "requestId_1", "key": {"requestId": 1}}]  # a plain lookup index: not uniqueness
    assert not reconcile_collection(ListedDatabase("order_event_stream", lookup), spec, check_only=True).problems


def test_only_conflict_codes_are_schema_conflicts_when_building_an_index():
    from pymongo import errors as pymongo_errors

    from wow_django.exceptions import RecoverableStoreError

    spec = event_stream_spec("order")
    conflicting = ListedDatabase("order_event_stream", [], refuse=pymongo_errors.OperationFailure(
        "E11000 duplicate key error", code=11000))
    report = reconcile_collection(conflicting, spec)
    assert report.problems and "cannot create" in report.problems[0]
    other = ListedDatabase("order_event_stream", [], refuse=pymongo_errors.OperationFailure(
        "not authorized to create indexes", code=13))
    with pytest.raises(RecoverableStoreError, match="creating index"):
        reconcile_collection(other, spec)


class ShardedDatabase(ListedDatabase):
    def command(self, command):
        return {"ns": f"{self.name}.{command['collStats']}", "sharded": True}


def test_the_global_request_id_mode_is_refused_on_a_sharded_collection():
    listed = [{"name": "requestId_1", "key": {"requestId": 1}, "unique": True}]
    [problem] = reconcile_collection(ShardedDatabase("order_event_stream", listed),
                                     event_stream_spec("order", "global"), check_only=True).problems
    assert "is sharded" in problem and "REQUEST_ID_INDEX 'aggregate'" in problem
    # The default mode shards fine; an unsharded collection in global mode too.
    aggregate = [{"name": "aggregateId_1_requestId_1", "key": {"aggregateId": 1, "requestId": 1}, "unique": True}]
    assert not [p for p in reconcile_collection(ShardedDatabase("order_event_stream", aggregate),
                                                event_stream_spec("order"), check_only=True).problems
                if "sharded" in p]
    assert not [p for p in reconcile_collection(ListedDatabase("order_event_stream", listed),
                                                event_stream_spec("order", "global"), check_only=True).problems
                if "sharded" in p]


def test_an_unclaimed_database_with_another_contexts_streams_is_not_claimed():
    from wow_django.backends.mongo.schema import METADATA_COLLECTION, claim_database

    db = fresh_db()
    db.client.drop_database(db.name)
    db["order_event_stream"].insert_one({"_id": "s-1", "contextName": "billing", "aggregateId": "o-1"})
    for check_only in (True, False):
        report = claim_database(db, "order-service", check_only=check_only)
        [problem] = report.ownership
        assert "streams of bounded context 'billing'" in problem and "order_event_stream" in problem
    assert db[METADATA_COLLECTION].find_one({}) is None  # nothing claimed
    # This context's streams, as a Wow (Kotlin) service writes them: no position (Wow leaves no marker).
    db["order_event_stream"].delete_many({})
    db["order_event_stream"].insert_one({"_id": "s-2", "contextName": "order-service", "aggregateId": "o-2"})
    for check_only in (True, False):
        [problem] = claim_database(db, "order-service", check_only=check_only).ownership
        assert "wow_django did not write" in problem and "'s-2' has no position" in problem
        assert "Wow (Kotlin)" in problem
    assert db[METADATA_COLLECTION].find_one({}) is None
    db["order_event_stream"].update_one({"_id": "s-2"}, {"$set": {"position": 1}})
    assert not claim_database(db, "order-service").ownership  # our own streams: claimed
    assert db[METADATA_COLLECTION].find_one({})["contextName"] == "order-service"


def test_every_index_is_built_with_an_explicit_simple_collation():
    """Issue 22, item 12: a collection's default collation (e.g. case-insensitive) must not slip into an index
    (a unique one would count ids that differ in case as one). Only a server applies collations: the
    index builds are recorded by a fake database."""
    from wow_django.backends.mongo.bus_schema import BUS_SPECS

    built: list[dict] = []

    class Recording(ListedDatabase):
        def __getitem__(self, name):
            class Collection:
                def list_indexes(self):
                    return [{"name": "_id_", "key": {"_id": 1}}]

                def create_index(self, keys, **options):
                    built.append(options)
                    return options["name"]

            return Collection()

    for spec in (event_stream_spec("order"), snapshot_spec("order"), *BUS_SPECS):
        reconcile_collection(Recording(spec.name, []), spec)
    assert built and all(options.get("collation") == {"locale": "simple"} for options in built), built

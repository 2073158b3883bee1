"""Query services for snapshots and event streams, on every backend with the same expectations.

The ``snapshots`` and ``streams`` fixtures run each test on the in-memory
stores, on mongomock://, and on the django backend's query services over
tables on SQLite (``wow_sqlite``) and PostgreSQL (``wow_pg``). Data is written
straight into the stores (or rows) so that tenants, owners, versions and the
deleted flag are exactly what each test needs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import override_settings
from pymongo import errors as pymongo_errors

from wow_django.application.queries import (
    parse_count_query,
    parse_list_query,
    parse_paged_query,
)
from wow_django.application.runtime import get_runtime
from wow_django.backends.django.queries import DjangoEventStreamQueryService, DjangoSnapshotQueryService
from wow_django.backends.memory.queries import InMemoryEventStreamQueryService, InMemorySnapshotQueryService
from wow_django.backends.mongo.client import disconnect
from wow_django.backends.mongo.queries import MongoEventStreamQueryService, MongoSnapshotQueryService, jsonable
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.query import (
    EVENT_STREAM,
    SNAPSHOT,
    mentions_deletion,
    present,
    scoped_condition,
    split_text_search,
)
from wow_django.persistence.records import AggregateId, Snapshot
from wow_django.query.condition import (
    Condition,
    ListQuery,
    Operator,
    PagedQuery,
    Pagination,
    Projection,
    SingleQuery,
    SortField,
    parse_condition,
)
from wow_django.query.errors import QueryTooExpensive, QueryValidationError
from wow_django.testing.event_store import make_stream

from .query_app.stores import append_stream, event_store, save_snapshot, snapshot_store
from .support import fresh_wow

EQ = Operator.EQ


def cond(**data) -> Condition:
    return parse_condition(data)


def order_snapshot(aggregate_id: str, tenant: str, state: dict, *, version: int = 1, deleted: bool = False,
                   owner: str = "u1") -> Snapshot:
    return Snapshot(
        aggregate_id=AggregateId("order", aggregate_id, "order-service", tenant), version=version, state=state,
        owner_id=owner, deleted=deleted, event_id=f"e-{aggregate_id}", first_event_time=1000, event_time=2000,
    )


def put_snapshot(aggregate_id: str, tenant: str, state: dict, **options) -> None:
    get_runtime().snapshot_store.save(order_snapshot(aggregate_id, tenant, state, **options))


class Backend:
    """Where a test's data is written and its queries are answered."""

    def __init__(self, name: str, database: str | None = None):
        self.name = name
        self.tables = (snapshot_store(database), event_store(database)) if database else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        if self.tables:
            save_snapshot(self.tables[0], snapshot)
        else:
            get_runtime().snapshot_store.save(snapshot)

    def append(self, stream) -> None:
        if self.tables:
            append_stream(self.tables[1], stream)
        else:
            get_runtime().event_store.append(stream)

    def snapshot_queries(self, aggregate_name: str):
        if self.tables:
            return DjangoSnapshotQueryService(self.tables[0], aggregate_name)
        return get_runtime().snapshot_queries(aggregate_name)

    def event_queries(self, aggregate_name: str):
        if self.tables:
            return DjangoEventStreamQueryService(self.tables[1], aggregate_name)
        return get_runtime().event_queries(aggregate_name)


SQL_DATABASES = ["default", "wow_sqlite", "wow_pg"]


@pytest.fixture(params=[
    "in_memory", "mongo",
    pytest.param("django:wow_sqlite", marks=pytest.mark.django_db(databases=SQL_DATABASES)),
    pytest.param("django:wow_pg", marks=pytest.mark.django_db(databases=SQL_DATABASES)),
])
def backend(request):
    """The in-memory stores, mongomock://, or the django query services on SQLite or PostgreSQL tables."""
    name = request.param
    settings = fresh_wow("mongo" if name == "mongo" else "in_memory")
    with override_settings(WOW=settings):
        yield Backend(name, name.partition(":")[2] or None)
    disconnect(settings["MONGO_URI"])


@pytest.fixture
def snapshots(backend):
    """Nine orders: a01-a05 and a09 of tenant t1 (a04 deleted), a06-a08 of t2."""
    rows = [
        ("a01", "t1", {"status": "PAID", "amount": 30, "note": "gift wrap please"}, False),
        ("a02", "t1", {"status": "PLACED", "amount": 10, "note": "leave at door"}, False),
        ("a03", "t1", {"status": "PAID", "amount": 20, "note": "Gift card"}, False),
        ("a04", "t1", {"status": "PAID", "amount": 99}, True),
        ("a05", "t1", {"status": "SHIPPED", "amount": 20, "tags": ["x", "y"]}, False),
        ("a06", "t2", {"status": "PAID", "amount": 5, "note": "gift"}, False),
        ("a07", "t2", {"status": "PAID", "amount": 7}, False),
        ("a08", "t2", {"status": "PAID", "amount": 8}, True),
        ("a09", "t1", {"status": "PLACED", "amount": 20}, False),
    ]
    for aggregate_id, tenant, state, deleted in rows:
        backend.save_snapshot(order_snapshot(aggregate_id, tenant, state, deleted=deleted, version=2 if deleted else 1))
    return backend.snapshot_queries("order")


@pytest.fixture
def streams(backend):
    """Three aggregates: b1 (t1, 3 versions), b2 (t1, 1 version), c1 (t2, 2 versions)."""
    for aggregate_id, tenant, versions in (("b1", "t1", 3), ("b2", "t1", 1), ("c1", "t2", 2)):
        key = AggregateId("order", aggregate_id, "order-service", tenant)
        for version in range(1, versions + 1):
            backend.append(make_stream(key, version, create_time=1_000 * version, owner_id=f"o-{aggregate_id}"))
    return backend.event_queries("order")


def ids(found: list[dict], key: str = "aggregateId") -> list[str]:
    return [item[key] for item in found]


# --- which backend ---------------------------------------------------------------------------------


def test_the_factory_follows_the_store(wow):
    in_memory = wow["STORAGE"] == "in_memory"
    assert isinstance(get_runtime().snapshot_queries("order"),
                      InMemorySnapshotQueryService if in_memory else MongoSnapshotQueryService)
    assert isinstance(get_runtime().event_queries("order"),
                      InMemoryEventStreamQueryService if in_memory else MongoEventStreamQueryService)


def test_reads_go_through_a_batching_event_store(wow):
    from django.test import override_settings

    with override_settings(WOW={**wow, "EVENT_STORE_BATCH": {"ENABLED": True}}):
        key = AggregateId("order", "z1", "order-service", "t1")
        get_runtime().event_store.append(make_stream(key, 1))
        assert get_runtime().event_queries("order").count(parse_count_query({}), tenant_id="t1") == 1


# --- snapshots ---------------------------------------------------------------------------------------


def test_list_is_scoped_to_the_tenant_and_live_aggregates(snapshots):
    found = snapshots.list(ListQuery(limit=100), tenant_id="t1")
    assert ids(found) == ["a01", "a02", "a03", "a05", "a09"]
    assert ids(snapshots.list(ListQuery(limit=100), tenant_id="t2")) == ["a06", "a07"]
    assert snapshots.list(ListQuery(limit=100), tenant_id="nobody") == []


def test_without_a_tenant_the_service_reads_across_tenants(snapshots):
    assert snapshots.count(parse_count_query({})) == 7


def test_client_conditions_cannot_escape_the_tenant(snapshots):
    escapes = [
        {"operator": "TENANT_ID", "value": "t2"},
        {"operator": "OR", "children": [{"operator": "ALL"}, {"operator": "TENANT_ID", "value": "t2"}]},
        {"field": "tenantId", "operator": "IN", "value": ["t1", "t2"]},
        {"operator": "NOR", "children": [{"operator": "TENANT_ID", "value": "t1"}]},
        {"operator": "IDS", "value": ["a06", "a07", "a08"]},
    ]
    for condition in escapes:
        found = snapshots.list(ListQuery(condition=parse_condition(condition), limit=100), tenant_id="t1")
        assert all(item["tenantId"] == "t1" for item in found), condition
        assert snapshots.count(parse_condition(condition), tenant_id="t1") == len(found)


@pytest.mark.parametrize(("condition", "expected"), [
    ({"operator": "DELETED", "value": "DELETED"}, ["a04"]),
    ({"operator": "DELETED", "value": "ALL"}, ["a01", "a02", "a03", "a04", "a05", "a09"]),
    ({"field": "deleted", "operator": "TRUE"}, ["a04"]),
    ({"operator": "OR", "children": [{"field": "deleted", "operator": "EQ", "value": True},
                                     {"field": "state.amount", "operator": "EQ", "value": 10}]}, ["a02", "a04"]),
    ({"field": "state.status", "operator": "EQ", "value": "PAID"}, ["a01", "a03"]),
])
def test_the_deletion_guard_steps_aside_only_when_the_condition_mentions_deletion(snapshots, condition, expected):
    query = ListQuery(condition=parse_condition(condition), limit=100)
    assert ids(snapshots.list(query, tenant_id="t1")) == expected


def test_mentions_deletion():
    assert mentions_deletion(cond(operator="DELETED", value="ALL"))
    assert mentions_deletion(cond(field="deleted", operator="FALSE"))
    assert mentions_deletion(cond(operator="AND", children=[{"operator": "ALL"}, {"field": "deleted.at",
                                                                                  "operator": "NULL"}]))
    assert mentions_deletion(parse_condition({"operator": "RAW", "value": {"$or": [{"deleted": True}]}},
                                             allow_raw=True))
    assert not mentions_deletion(cond(field="state.deleted", operator="TRUE"))
    # Inside ELEM_MATCH, "deleted" is a field of the array element, not the document's flag.
    assert not mentions_deletion(cond(field="state.lines", operator="ELEM_MATCH",
                                      children=[{"field": "deleted", "operator": "TRUE"}]))


def test_id_and_aggregate_id_name_the_snapshot_id(snapshots):
    for field in ("id", "aggregateId"):
        found = snapshots.list(ListQuery(condition=cond(field=field, operator="IN", value=["a02", "a06"])),
                               tenant_id="t1")
        assert ids(found) == ["a02"]
    assert ids(snapshots.list(ListQuery(condition=cond(operator="AGGREGATE_IDS", value=["a03", "a06"])),
                              tenant_id="t1")) == ["a03"]
    assert ids(snapshots.list(ListQuery(condition=cond(operator="IDS", value=["a03", "a05"])),
                              tenant_id="t1")) == ["a03", "a05"]


def test_results_are_in_wows_shape(snapshots):
    found = snapshots.single(SingleQuery(condition=cond(operator="ID", value="a01")), tenant_id="t1")
    assert list(found)[0] == "aggregateId"
    assert found == {
        "aggregateId": "a01", "contextName": "order-service", "aggregateName": "order", "tenantId": "t1",
        "ownerId": "u1", "spaceId": "", "tags": {}, "version": 1, "eventId": "e-a01", "firstOperator": "",
        "operator": "",
        "firstEventTime": 1000, "eventTime": 2000, "snapshotTime": found["snapshotTime"], "deleted": False,
        "state": {"status": "PAID", "amount": 30, "note": "gift wrap please"},
    }
    assert "_id" not in found
    assert list(found)[4:7] == ["ownerId", "spaceId", "tags"]  # Wow's order


def test_results_are_copies(snapshots):
    found = snapshots.single(SingleQuery(condition=cond(operator="ID", value="a05")), tenant_id="t1")
    found["state"]["tags"].append("z")
    again = snapshots.single(SingleQuery(condition=cond(operator="ID", value="a05")), tenant_id="t1")
    assert again["state"]["tags"] == ["x", "y"]


def test_single_returns_none_when_nothing_matches(snapshots):
    assert snapshots.single(SingleQuery(condition=cond(operator="ID", value="a06")), tenant_id="t1") is None


def test_sort_breaks_ties_by_id_in_both_directions(snapshots):
    query = ListQuery(sort=(SortField(field="state.amount", direction="DESC"),), limit=100)
    assert ids(snapshots.list(query, tenant_id="t1")) == ["a01", "a03", "a05", "a09", "a02"]
    query = ListQuery(sort=(SortField(field="state.amount"), SortField(field="id", direction="DESC")), limit=100)
    assert ids(snapshots.list(query, tenant_id="t1")) == ["a02", "a09", "a05", "a03", "a01"]


def test_paged_returns_total_and_the_page(snapshots):
    sort = (SortField(field="state.amount"),)
    pages = [snapshots.paged(PagedQuery(sort=sort, pagination=Pagination(index=i, size=2)), tenant_id="t1")
             for i in (1, 2, 3, 4)]
    assert [page.total for page in pages] == [5, 5, 5, 5]
    assert [ids(page.list) for page in pages] == [["a02", "a03"], ["a05", "a09"], ["a01"], []]
    assert pages[0].to_json() == {"total": 5, "list": pages[0].list}


def test_limit_and_projection(snapshots):
    query = ListQuery(projection=Projection(include=("state.status", "version")), limit=2)
    assert snapshots.list(query, tenant_id="t1") == [
        {"aggregateId": "a01", "version": 1, "state": {"status": "PAID"}},
        {"aggregateId": "a02", "version": 1, "state": {"status": "PLACED"}},
    ]
    query = ListQuery(projection=Projection(exclude=("state", "aggregateId", "snapshotTime")), limit=1)
    (found,) = snapshots.list(query, tenant_id="t1")
    assert "state" not in found and "aggregateId" not in found and found["tenantId"] == "t1"
    assert found["spaceId"] == "" and found["tags"] == {}
    # Wow's constant fields follow the projection as the stored ones do.
    query = ListQuery(projection=Projection(include=("spaceId", "tags", "version")), limit=1)
    assert snapshots.list(query, tenant_id="t1") == [{"aggregateId": "a01", "spaceId": "", "tags": {}, "version": 1}]
    query = ListQuery(projection=Projection(exclude=("state", "spaceId")), limit=1)
    (found,) = snapshots.list(query, tenant_id="t1")
    assert "spaceId" not in found and found["tags"] == {}


def test_space_and_owner_conditions_as_wows(snapshots, backend):
    """Every aggregate is in its tenant's default space "": SPACE_ID naming a space finds none (built in Python,
    SPACE_ID "" finds every one); ownerId EQ "" (Wow's DEFAULT_OWNER_ID) finds the aggregates without an owner."""
    assert snapshots.count(cond(operator="SPACE_ID", value="s-1"), tenant_id="t1") == 0
    assert snapshots.list(ListQuery(condition=cond(operator="SPACE_ID", value="s-1"), limit=10), tenant_id="t1") == []
    either = cond(operator="OR", children=[{"operator": "SPACE_ID", "value": "s-1"}, {"operator": "ID", "value": "a02"}])
    assert ids(snapshots.list(ListQuery(condition=either, limit=10), tenant_id="t1")) == ["a02"]
    # A condition built in Python is read the same way.
    assert snapshots.count(Condition(operator=Operator.SPACE_ID, value=""), tenant_id="t1") == 5
    assert snapshots.count(Condition(operator=Operator.SPACE_ID, value="s-1"), tenant_id="t1") == 0
    backend.save_snapshot(order_snapshot("a10", "t1", {"status": "PAID", "amount": 1}, owner=""))
    ownerless = ListQuery(condition=cond(field="ownerId", operator="EQ", value=""), limit=10)
    assert ids(snapshots.list(ownerless, tenant_id="t1")) == ["a10"]
    assert snapshots.count(cond(operator="OWNER_ID", value="u1"), tenant_id="t1") == 5


def test_count(snapshots):
    assert snapshots.count(cond(field="state.amount", operator="GTE", value=20), tenant_id="t1") == 4
    assert snapshots.count(parse_count_query({}), tenant_id="t2") == 2


def test_scope_is_anded(snapshots):
    scope = cond(field="state.status", operator="EQ", value="PAID")
    assert ids(snapshots.list(ListQuery(limit=100), tenant_id="t1", scope=scope)) == ["a01", "a03"]
    assert snapshots.count(parse_count_query({}), tenant_id="t1", scope=scope) == 2


def test_match_searches_words_on_every_backend(snapshots):
    # Real MongoDB runs $text; the embedded engine and the in-memory store use the Python evaluator.
    query = ListQuery(condition=cond(operator="MATCH", value="GIFT"), limit=100)
    assert ids(snapshots.list(query, tenant_id="t1")) == ["a01", "a03"]
    both = cond(operator="AND", children=[{"operator": "MATCH", "value": "gift"},
                                          {"field": "state.amount", "operator": "LT", "value": 25}])
    assert ids(snapshots.list(ListQuery(condition=both, limit=100), tenant_id="t1")) == ["a03"]
    assert snapshots.count(both, tenant_id="t1") == 1
    paged = snapshots.paged(PagedQuery(condition=cond(operator="MATCH", value="gift door"),
                                       projection=Projection(include=("state.note",)),
                                       sort=(SortField(field="state.amount", direction="DESC"),),
                                       pagination=Pagination(index=1, size=2)), tenant_id="t1")
    assert paged.total == 3
    assert paged.list == [{"aggregateId": "a01", "state": {"note": "gift wrap please"}},
                          {"aggregateId": "a03", "state": {"note": "Gift card"}}]


def test_split_text_search():
    match = cond(operator="MATCH", value="gift")
    rest, found = split_text_search(match)
    assert found == match and rest.operator is Operator.ALL
    nested = cond(operator="AND", children=[{"field": "a", "operator": "EQ", "value": 1},
                                            {"operator": "AND", "children": [{"operator": "MATCH", "value": "x"}]}])
    rest, found = split_text_search(nested)
    assert found.value == "x" and rest == Condition(operator=EQ, field="a", value=1)
    assert split_text_search(cond(field="a", operator="EQ", value=1))[1] is None


def test_scoped_condition_flattens_the_clients_top_level_and():
    client = cond(operator="AND", children=[{"operator": "MATCH", "value": "x"}, {"field": "a", "operator": "NULL"}])
    scoped = scoped_condition(SNAPSHOT, client, tenant_id="t1")
    assert [c.operator for c in scoped.children] == [Operator.MATCH, Operator.NULL, Operator.TENANT_ID,
                                                     Operator.DELETED]
    assert [c.operator for c in scoped_condition(EVENT_STREAM, client, tenant_id="t1").children] == [
        Operator.MATCH, Operator.NULL, Operator.TENANT_ID]
    with pytest.raises(ValueError, match="tenant_id"):
        scoped_condition(SNAPSHOT, client, tenant_id="")


def test_raw_runs_on_mongo_only(snapshots, backend):
    raw = parse_condition({"operator": "RAW", "value": {"state.amount": {"$gt": 15}}}, allow_raw=True)
    if backend.name == "mongo":
        assert ids(snapshots.list(ListQuery(condition=raw, limit=100), tenant_id="t1")) == ["a01", "a03", "a05",
                                                                                            "a09"]
    else:
        with pytest.raises(QueryValidationError, match="RAW"):
            snapshots.list(ListQuery(condition=raw), tenant_id="t1")


# --- event streams ---------------------------------------------------------------------------------------


def test_event_streams_scoped_and_shaped(streams):
    found = streams.list(parse_list_query({"sort": [{"field": "createTime"}, {"field": "aggregateId"}],
                                           "limit": 100}), tenant_id="t1")
    assert [(s["aggregateId"], s["version"]) for s in found] == [("b1", 1), ("b2", 1), ("b1", 2), ("b1", 3)]
    first = found[0]
    assert list(first)[0] == "id" and "_id" not in first
    assert set(first) == {"id", "contextName", "aggregateName", "aggregateId", "tenantId", "ownerId", "spaceId",
                          "requestId", "commandId", "version", "header", "body", "size", "createTime"}
    assert first["spaceId"] == ""
    assert first["body"][0]["name"] == "thing_happened" and first["size"] == 1


def test_event_id_names_the_stream_id(streams):
    one = streams.list(parse_list_query({"limit": 1}), tenant_id="t2")[0]
    again = streams.single(SingleQuery(condition=cond(field="id", operator="EQ", value=one["id"])), tenant_id="t2")
    assert again == one
    assert streams.single(SingleQuery(condition=cond(operator="ID", value=one["id"])), tenant_id="t1") is None


def test_event_streams_paged_count_and_projection(streams):
    page = streams.paged(parse_paged_query({"condition": {"operator": "AGGREGATE_ID", "value": "b1"},
                                            "projection": {"include": ["version", "body.name"]},
                                            "sort": [{"field": "version", "direction": "DESC"}],
                                            "pagination": {"index": 1, "size": 2}}), tenant_id="t1")
    assert page.total == 3
    assert [{k: v for k, v in s.items() if k != "id"} for s in page.list] == [
        {"version": 3, "body": [{"name": "thing_happened"}]}, {"version": 2, "body": [{"name": "thing_happened"}]}]
    assert streams.count(parse_count_query({"operator": "AGGREGATE_ID", "value": "c1"}), tenant_id="t1") == 0
    assert streams.count(parse_count_query({"operator": "OWNER_ID", "value": "o-c1"}), tenant_id="t2") == 2


# --- the Mongo backend's promises -------------------------------------------------------------------------


class RecordingCollection:
    """Wraps a pymongo/mongomock collection and records every read's options."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[str, dict]] = []
        self.options: list[dict] = []

    def with_options(self, **options):
        self.options.append(options)  # the queries' read preference
        return self

    @property
    def name(self):
        return self.inner.name

    @property
    def database(self):
        return self.inner.database

    def find(self, filter_=None, projection=None, **kwargs):
        self.calls.append(("find", {"filter": filter_, **kwargs}))
        return self.inner.find(filter_, projection, **kwargs)

    def count_documents(self, filter_, **kwargs):
        self.calls.append(("count_documents", {"filter": filter_, **kwargs}))
        return self.inner.count_documents(filter_, **kwargs)


@pytest.fixture
def recorded(wow_mongo, monkeypatch):
    """A Mongo snapshot query service whose collection records its calls."""
    put_snapshot("a01", "t1", {"status": "PAID", "note": "gift"})
    put_snapshot("a02", "t2", {"status": "PAID"})
    store = get_runtime().snapshot_store
    recording = RecordingCollection(store.collection("order"))
    monkeypatch.setattr(store, "collection", lambda name: recording)
    return MongoSnapshotQueryService(store, "order"), recording


def test_every_mongo_query_sets_max_time_ms(recorded):
    service, recording = recorded
    service.single(SingleQuery(), tenant_id="t1")
    service.list(ListQuery(), tenant_id="t1")
    service.paged(PagedQuery(), tenant_id="t1")
    service.count(parse_count_query({}), tenant_id="t1")
    service.list(ListQuery(condition=cond(operator="MATCH", value="gift")), tenant_id="t1")
    service.count(cond(operator="MATCH", value="gift"), tenant_id="t1")
    assert len(recording.calls) == 7
    for method, options in recording.calls:
        limit = options.get("max_time_ms") if method == "find" else options.get("maxTimeMS")
        assert limit == 10_000, (method, options)


def test_max_time_ms_follows_the_setting(wow_mongo, monkeypatch):
    from django.test import override_settings

    with override_settings(WOW={**wow_mongo, "MONGO_MAX_TIME_MS": 250}):
        store = get_runtime().snapshot_store
        recording = RecordingCollection(store.collection("order"))
        monkeypatch.setattr(store, "collection", lambda name: recording)
        get_runtime().snapshot_queries("order").count(parse_count_query({}), tenant_id="t1")
        assert recording.calls[0][1]["maxTimeMS"] == 250


def test_filters_carry_the_tenant_and_wrapped_values(recorded):
    service, recording = recorded
    injected = cond(field="state.status", operator="EQ", value={"gt": ""})
    service.list(ListQuery(condition=injected), tenant_id="t1")
    assert recording.calls[0][1]["filter"] == {"$and": [
        {"state.status": {"$eq": {"gt": ""}}}, {"tenantId": {"$eq": "t1"}}, {"deleted": {"$eq": False}}]}


def test_the_embedded_engine_filters_the_rest_of_a_text_search_on_the_server(recorded):
    service, recording = recorded
    found = service.list(ListQuery(condition=cond(operator="MATCH", value="gift")), tenant_id="t1")
    assert ids(found) == ["a01"]
    (method, options), = recording.calls
    assert options["filter"] == {"$and": [{"tenantId": {"$eq": "t1"}}, {"deleted": {"$eq": False}}]}


def test_real_mongodb_gets_text(recorded, monkeypatch):
    service, recording = recorded
    monkeypatch.setattr(service.connection, "embedded", False)
    monkeypatch.setattr(service.connection, "guard", _no_guard)
    with pytest.raises(NotImplementedError, match=r"\$text"):  # mongomock cannot run what a server would
        service.list(ListQuery(condition=cond(operator="MATCH", value="gift")), tenant_id="t1")
    assert recording.calls[0][1]["filter"]["$and"][0] == {"$text": {"$search": "gift"}}


def _no_guard(collection):
    import contextlib

    return contextlib.nullcontext()


class FailingCollection(RecordingCollection):
    def __init__(self, inner, error):
        super().__init__(inner)
        self.error = error

    def find(self, filter_=None, projection=None, **kwargs):
        raise self.error

    def count_documents(self, filter_, **kwargs):
        raise self.error


@pytest.mark.parametrize(("error", "expected", "message"), [
    (pymongo_errors.OperationFailure("text index required for $text query", code=27), QueryValidationError,
     "MATCH needs a text index on order_snapshot"),
    (pymongo_errors.OperationFailure("Sort exceeded memory limit", code=292), QueryValidationError,
     "MongoDB refused the query: Sort exceeded memory limit"),
    (pymongo_errors.ExecutionTimeout("operation exceeded time limit", code=50), QueryTooExpensive,
     r"ran longer than 10000 ms \(WOW\['MONGO_MAX_TIME_MS'\]\) and was stopped"),
    (pymongo_errors.OperationFailure("cursor killed", code=237), RecoverableStoreError, "retry"),
    (pymongo_errors.OperationFailure("interrupted", code=11601), RecoverableStoreError, "retry"),
    (pymongo_errors.OperationFailure("majority read concern not yet available", code=134), RecoverableStoreError,
     "retry"),
    (pymongo_errors.AutoReconnect("primary stepped down"), RecoverableStoreError, "retry"),
])
def test_server_errors_are_mapped(wow_mongo, monkeypatch, error, expected, message):
    store = get_runtime().snapshot_store
    failing = FailingCollection(store.collection("order"), error)
    monkeypatch.setattr(store, "collection", lambda name: failing)
    service = MongoSnapshotQueryService(store, "order")
    with pytest.raises(expected, match=message):
        service.list(ListQuery(), tenant_id="t1")
    with pytest.raises(expected, match=message):
        service.count(parse_count_query({}), tenant_id="t1")


def test_a_too_expensive_query_over_http_is_a_400_without_retry_after(wow_mongo, monkeypatch):
    from rest_framework.test import APIClient

    store = get_runtime().snapshot_store
    failing = FailingCollection(store.collection("order"),
                                pymongo_errors.ExecutionTimeout("operation exceeded time limit", code=50))
    monkeypatch.setattr(store, "collection", lambda name: failing)
    response = APIClient().post("/api/order/snapshot/list", {"condition": {"operator": "ALL"}}, format="json",
                                HTTP_COMMAND_TENANT_ID="t1")
    assert response.status_code == 400, response.content
    assert response.json()["errorCode"] == "QueryTooExpensive" and "Retry-After" not in response
    assert "MONGO_MAX_TIME_MS" in response.json()["errorMsg"]


def test_authorization_failures_are_not_reported_as_bad_queries(wow_mongo, monkeypatch):
    store = get_runtime().snapshot_store
    failing = FailingCollection(store.collection("order"), pymongo_errors.OperationFailure("not authorized",
                                                                                           code=13))
    monkeypatch.setattr(store, "collection", lambda name: failing)
    with pytest.raises(pymongo_errors.OperationFailure):
        MongoSnapshotQueryService(store, "order").list(ListQuery(), tenant_id="t1")


def test_bson_values_written_by_other_tools_become_python_values():
    import datetime as dt
    from decimal import Decimal

    from bson import Binary, Decimal128, ObjectId

    oid = ObjectId("65f000000000000000000000")
    value = {"a": [oid, Decimal128("1.5")], "b": dt.datetime(2024, 1, 2, 3, 4, 5), "c": Binary(b"\x00\x01"),
             "d": {"e": 1}}
    # Decimal128 as the Decimal it holds; a BSON date (naive, UTC) as canonical time text, as states hold times.
    assert jsonable(value) == {"a": [str(oid), Decimal("1.5")], "b": "2024-01-02T03:04:05.000000Z", "c": "AAE=",
                               "d": {"e": 1}}


def test_present_renames_the_id_first():
    assert list(present(SNAPSHOT, {"version": 1, "_id": "x"})) == ["aggregateId", "version", "spaceId", "tags"]
    assert present(EVENT_STREAM, {"_id": "s", "version": 2}) == {"id": "s", "version": 2, "spaceId": ""}
    # Wow's constant fields after ownerId; a stored value (a document Wow wrote) is kept.
    assert list(present(SNAPSHOT, {"_id": "x", "ownerId": "", "state": {}})) == [
        "aggregateId", "ownerId", "spaceId", "tags", "state"]
    assert present(EVENT_STREAM, {"_id": "s", "spaceId": "wow-space"})["spaceId"] == "wow-space"
    assert present(SNAPSHOT, {"_id": "x"})["tags"] is not present(SNAPSHOT, {"_id": "y"})["tags"]  # not shared


def test_the_contract_modules_do_not_import_django():
    code = (
        "import sys; import wow_django.persistence.query; "
        "assert 'django' not in sys.modules, sorted(m for m in sys.modules if 'django' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "DJANGO_SETTINGS_MODULE": ""})

"""The query condition DSL: one table of cases, run on both backends.

Every case is a condition (client JSON) and the set of fixture ``_id``s it
must match. Each case runs with the same expectation on: (a) the compiled
MongoDB filter against the fixtures in a mongomock collection, (b) the
Python evaluator, and (c) the ORM compiler (``wow_django.backends.django.compiler``) over a
snapshot table holding the fixtures, on SQLite (``wow_sqlite``) and
PostgreSQL (``wow_pg``). "Now" is frozen at Monday 2024-04-01 04:00 in
Asia/Shanghai, which is still Sunday 2024-03-31 20:00 in UTC, so the date
cases cross a day, a week and a month boundary depending on the zone.

The table avoids the few places where mongomock is not MongoDB (booleans
equal to numbers, order-insensitive sub-document equality, sorting arrays by
their smallest element in both directions, ``$text``); those behaviours are
tested on the evaluator alone, with the MongoDB rule stated next to them,
and on the ORM compiler, which follows the evaluator (MATCH too), except for
the key order of sub-documents (see ``wow_django.backends.django.compiler``).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import mongomock
import pytest

from wow_django.backends.mongo.compiler import compile_filter, compile_projection, compile_sort, needs_text_search
from wow_django.exceptions import WowError
from wow_django.query import dates
from wow_django.query.condition import (
    ALL_CONDITION,
    Condition,
    Direction,
    Operator,
    Pagination,
    Projection,
    SortField,
    and_conditions,
    parse_condition,
    parse_count_query,
    parse_list_query,
    parse_paged_query,
    parse_single_query,
)
from wow_django.query.errors import QueryValidationError
from wow_django.query.evaluator import apply_projection, matches, sort_documents

SHANGHAI = ZoneInfo("Asia/Shanghai")
NOW = datetime(2024, 4, 1, 4, 0, tzinfo=SHANGHAI)  # Monday in Shanghai, Sunday 20:00 in UTC
SNAPSHOT_MAP = {"id": "_id", "aggregateId": "_id"}


def at(*parts: int) -> int:
    """Epoch milliseconds of a wall-clock time in Shanghai: at(2024, 4, 1, 0, 30)."""
    year, month, day, hour, minute, second, milli = (*parts, 0, 0, 0, 0)[:7]
    moment = datetime(year, month, day, hour, minute, second, milli * 1000, tzinfo=SHANGHAI)
    return dates.to_epoch_ms(moment)


def snapshot(_id: str, tenant: str, owner: str, state: dict, *, deleted: bool = False) -> dict:
    """A document shaped like the snapshot store's."""
    return {
        "_id": _id,
        "contextName": "shop",
        "aggregateName": "order",
        "tenantId": tenant,
        "ownerId": owner,
        "version": 3,
        "deleted": deleted,
        "state": state,
    }


# Shanghai wall-clock times of state.createdAt are noted per document; NOW is 2024-04-01 04:00 (Monday).
# fmt: off
DOCUMENTS = [
    snapshot("d01", "t1", "u1", {  # today, 00:30 (but 2024-03-31 in UTC)
        "name": "Alice", "code": "X-1", "score": 90, "active": True, "tags": ["red", "blue"],
        "items": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 5}],
        "createdAt": at(2024, 4, 1, 0, 30), "day": "2024-04-01", "stamp": "2024-04-01 00:30:00",
        "address": {"city": "Shanghai", "zip": "200000"}, "note": "Rush order, gift wrap",
    }),
    snapshot("d02", "t1", "u2", {  # tomorrow, first instant
        "name": "alice", "code": "x-1\n", "score": 75.5, "active": False, "tags": ["red"],
        "items": [{"sku": "A1", "qty": 1}],
        "createdAt": at(2024, 4, 2), "day": "2024-04-02", "stamp": "2024-04-02 00:00:00",
        "address": {"city": "Beijing", "zip": "100000"}, "note": None,
    }),
    snapshot("d03", "t1", "u1", {  # yesterday (Sunday, last week, last month), last millisecond
        "name": "ALICE", "score": 60, "active": True, "tags": [], "items": [],
        "createdAt": at(2024, 3, 31, 23, 59, 59, 999), "day": "2024-03-31", "stamp": "2024-03-31 23:59:59",
        "address": {"city": "shanghai"},
    }),
    snapshot("d04", "t2", "u1", {  # Monday of last week, first instant
        "name": "Bob", "score": 100, "active": None, "tags": ["green", "red", "blue"],
        "items": [{"sku": "C3", "qty": 10}],
        "createdAt": at(2024, 3, 25), "day": "2024-03-25", "stamp": "2024-03-25 00:00:00", "note": "bob's order",
    }),
    snapshot("d05", "t2", "u2", {  # Sunday two weeks ago; no "active"; the score is a string
        "name": "a.b*c (x)", "score": "90", "tags": ["blue"], "items": [{"sku": "A1", "qty": 7}, {"sku": "D4"}],
        "createdAt": at(2024, 3, 24, 23, 59), "day": "2024-03-24", "stamp": "2024-03-24 23:59:00",
    }),
    snapshot("d06", "t1", "u1", {  # Sunday of this week; soft-deleted
        "name": "axbc x", "score": 0, "active": False, "tags": ["red", "red"], "items": [{"sku": "B2", "qty": 5}],
        "createdAt": at(2024, 4, 7, 23, 59), "day": "2024-04-07",
    }, deleted=True),
    snapshot("d07", "t1", "u2", {  # next Monday
        "name": "Carol", "score": -5, "active": True, "tags": ["yellow"],
        "items": [{"sku": "A1", "qty": 5}, {"sku": "B2", "qty": 1}],
        "createdAt": at(2024, 4, 8), "day": "2024-04-08",
    }),
    snapshot("d08", "t2", "u1", {  # leap day, two months ago
        "name": "dave", "score": 42, "active": False, "tags": ["blue", "green"], "items": None,
        "createdAt": at(2024, 2, 29, 12), "day": "2024-02-29",
    }),
    snapshot("d09", "t1", "u1", {  # first instant of last month; tags is a scalar
        "name": "Eve", "score": 1000.0, "tags": "red", "createdAt": at(2024, 3, 1), "day": "2024-03-01",
    }),
    snapshot("d10", "t2", "u2", {  # end of this month
        "name": "Frank", "score": 90, "active": True, "createdAt": at(2024, 4, 30, 23), "day": "2024-04-30",
    }),
    snapshot("d11", "t1", "u1", {  # first instant of next month
        "name": "grace", "score": 89.99, "active": False, "createdAt": at(2024, 5, 1), "day": "2024-05-01",
    }),
    snapshot("d12", "t2", "u1", {  # almost empty; createdAt is text, not epoch ms
        "name": None, "createdAt": "2024-04-01",
    }),
]
# fmt: on
ALL_IDS = " ".join(doc["_id"] for doc in DOCUMENTS)


def C(operator: str, field: str | None = None, value=None, children=None, **options) -> dict:  # noqa: N802
    """A condition as a client sends it."""
    data: dict = {"operator": operator}
    if field is not None:
        data["field"] = field
    if value is not None:
        data["value"] = value
    if children is not None:
        data["children"] = children
    if options:
        data["options"] = options
    return data


def but(*excluded: str) -> str:
    return " ".join(i for i in ALL_IDS.split() if i not in excluded)


@dataclass(frozen=True)
class Case:
    name: str
    condition: dict
    expected: str  # space-separated _ids
    field_map: dict | None = None
    allow_raw: bool = False


SH = {"zoneId": "Asia/Shanghai"}
DAY = {"zoneId": "Asia/Shanghai", "datePattern": "yyyy-MM-dd"}
STAMP = {"zoneId": "Asia/Shanghai", "datePattern": "yyyy-MM-dd HH:mm:ss"}

CASES = [
    # --- logic and identity ----------------------------------------------------------------
    Case("ALL", C("ALL"), ALL_IDS),
    Case("AND without children matches all", C("AND", children=[]), ALL_IDS),
    Case("AND", C("AND", children=[C("TRUE", "state.active"), C("GT", "state.score", 80)]), "d01 d10"),
    Case("OR", C("OR", children=[C("EQ", "state.name", "Bob"), C("LT", "state.score", 0)]), "d04 d07"),
    Case("NOR", C("NOR", children=[C("TRUE", "state.active"), C("NULL", "state.active")]), "d02 d06 d08 d11"),
    Case(
        "nested OR of AND",
        C(
            "OR",
            children=[
                C("AND", children=[C("TENANT_ID", value="t2"), C("FALSE", "state.active")]),
                C("ID", value="d01"),
            ],
        ),
        "d01 d08",
    ),
    Case("OR with an ALL branch", C("OR", children=[C("ALL"), C("ID", value="d01")]), ALL_IDS),
    Case("ID", C("ID", value="d03"), "d03"),
    Case("ID ignores field", C("ID", "state.name", "d03"), "d03"),
    Case("ID unknown", C("ID", value="nope"), ""),
    Case("IDS", C("IDS", value=["d01", "d05", "zz"]), "d01 d05"),
    Case("AGGREGATE_ID maps to _id", C("AGGREGATE_ID", value="d02"), "d02", SNAPSHOT_MAP),
    Case("AGGREGATE_IDS maps to _id", C("AGGREGATE_IDS", value=["d02", "d04"]), "d02 d04", SNAPSHOT_MAP),
    Case("EQ on id maps to _id", C("EQ", "id", "d07"), "d07", SNAPSHOT_MAP),
    Case("TENANT_ID", C("TENANT_ID", value="t1"), "d01 d02 d03 d06 d07 d09 d11"),
    Case("OWNER_ID", C("OWNER_ID", value="u2"), "d02 d05 d07 d10"),
    Case("DELETED ACTIVE", C("DELETED", value="ACTIVE"), but("d06")),
    Case("DELETED DELETED", C("DELETED", value="DELETED"), "d06"),
    Case("DELETED ALL", C("DELETED", value="ALL"), ALL_IDS),
    # --- equality and comparison -----------------------------------------------------------
    Case("EQ string is case-sensitive", C("EQ", "state.name", "Alice"), "d01"),
    Case("EQ ignoreCase", C("EQ", "state.name", "alice", ignoreCase=True), "d01 d02 d03"),
    Case("EQ ignoreCase is the whole string", C("EQ", "state.code", "x-1", ignoreCase=True), "d01"),
    Case("EQ number is not the string", C("EQ", "state.score", 90), "d01 d10"),
    Case("EQ string is not the number", C("EQ", "state.score", "90"), "d05"),
    Case("EQ int equals float", C("EQ", "state.score", 1000), "d09"),
    Case("EQ on an array field matches an element", C("EQ", "state.tags", "red"), "d01 d02 d04 d06 d09"),
    Case("EQ with an array matches the whole array", C("EQ", "state.tags", ["red"]), "d02"),
    Case("EQ sub-document", C("EQ", "state.address", {"city": "Beijing", "zip": "100000"}), "d02"),
    Case("EQ through an array of documents", C("EQ", "state.items.sku", "C3"), "d04"),
    Case("EQ numeric path segment indexes the array", C("EQ", "state.tags.0", "green"), "d04"),
    Case("EQ null matches null and missing", C("EQ", "state.note", None), but("d01", "d04")),
    Case("EQ a literal '$' string", C("EQ", "state.name", "$gt"), ""),
    Case("NE matches missing", C("NE", "state.name", "Alice"), but("d01")),
    Case("NE ignoreCase", C("NE", "state.name", "ALICE", ignoreCase=True), but("d01", "d02", "d03")),
    Case("NE on an array field", C("NE", "state.tags", "red"), "d03 d05 d07 d08 d10 d11 d12"),
    Case("GT", C("GT", "state.score", 89.99), "d01 d04 d09 d10"),
    Case("GTE", C("GTE", "state.score", 89.99), "d01 d04 d09 d10 d11"),
    Case("LT", C("LT", "state.score", 60), "d06 d07 d08"),
    Case("LTE", C("LTE", "state.score", 60), "d03 d06 d07 d08"),
    Case("GT string compares strings only", C("GT", "state.name", "a"), "d02 d05 d06 d08 d11"),
    Case("GT string against numbers", C("GT", "state.score", "1"), "d05"),
    Case("LT on array elements", C("LT", "state.tags", "c"), "d01 d04 d05 d08"),
    Case("GT through an array of documents", C("GT", "state.items.qty", 5), "d04 d05"),
    Case("GT on a missing field is false", C("GT", "state.missing", -1e9), ""),
    # --- text --------------------------------------------------------------------------------
    Case("CONTAINS", C("CONTAINS", "state.name", "li"), "d01 d02"),
    Case("CONTAINS ignoreCase", C("CONTAINS", "state.name", "LI", ignoreCase=True), "d01 d02 d03"),
    Case("CONTAINS regex metacharacters are literal", C("CONTAINS", "state.name", "a.b*c (x)"), "d05"),
    Case("CONTAINS dot is literal", C("CONTAINS", "state.name", "."), "d05"),
    Case("CONTAINS only strings", C("CONTAINS", "state.score", "9"), "d05"),
    Case("STARTS_WITH", C("STARTS_WITH", "state.name", "a"), "d02 d05 d06"),
    Case("STARTS_WITH ignoreCase", C("STARTS_WITH", "state.name", "a", ignoreCase=True), "d01 d02 d03 d05 d06"),
    Case("STARTS_WITH on array elements", C("STARTS_WITH", "state.tags", "gr"), "d04 d08"),
    Case("STARTS_WITH caret is literal", C("STARTS_WITH", "state.name", "^A"), ""),
    Case("ENDS_WITH", C("ENDS_WITH", "state.name", "ce"), "d01 d02 d11"),
    Case("ENDS_WITH ignoreCase", C("ENDS_WITH", "state.name", "CE", ignoreCase=True), "d01 d02 d03 d11"),
    Case("ENDS_WITH is the very end", C("ENDS_WITH", "state.code", "1"), "d01"),
    Case("ENDS_WITH parenthesis is literal", C("ENDS_WITH", "state.name", "(x)"), "d05"),
    # --- lists -------------------------------------------------------------------------------
    Case("IN", C("IN", "state.name", ["Bob", "Carol", "Zed"]), "d04 d07"),
    Case("IN on an array field", C("IN", "state.tags", ["yellow", "green"]), "d04 d07 d08"),
    Case("IN with null matches missing", C("IN", "state.active", [None]), "d04 d05 d09 d12"),
    Case("IN mixed", C("IN", "state.active", [True, None]), "d01 d03 d04 d05 d07 d09 d10 d12"),
    Case("IN empty list", C("IN", "state.name", []), ""),
    Case("NOT_IN", C("NOT_IN", "state.score", [90, 60]), "d02 d04 d05 d06 d07 d08 d09 d11 d12"),
    Case("NOT_IN on an array field", C("NOT_IN", "state.tags", ["red"]), "d03 d05 d07 d08 d10 d11 d12"),
    Case("BETWEEN is inclusive", C("BETWEEN", "state.score", [60, 90]), "d01 d02 d03 d10 d11"),
    Case("BETWEEN strings", C("BETWEEN", "state.name", ["B", "D"]), "d04 d07"),
    # As in MongoDB, each bound may be met by a different array element (ELEM_MATCH requires one element).
    # (d01 has no tag in [c, h]: "red" >= "c" and "blue" <= "h").
    Case("BETWEEN on an array, bounds per element", C("BETWEEN", "state.tags", ["c", "h"]), "d01 d04 d08"),
    Case("ALL_IN", C("ALL_IN", "state.tags", ["red", "blue"]), "d01 d04"),
    Case("ALL_IN one value, scalar field too", C("ALL_IN", "state.tags", ["red"]), "d01 d02 d04 d06 d09"),
    Case(
        "ELEM_MATCH requires one element",
        C("ELEM_MATCH", "state.items", children=[C("EQ", "sku", "A1"), C("GTE", "qty", 5)]),
        "d05 d07",
    ),
    Case(
        "the same without ELEM_MATCH",
        C("AND", children=[C("EQ", "state.items.sku", "A1"), C("GTE", "state.items.qty", 5)]),
        "d01 d05 d07",
    ),
    Case("ELEM_MATCH NULL child", C("ELEM_MATCH", "state.items", children=[C("NULL", "qty")]), "d05"),
    Case("ELEM_MATCH NE child", C("ELEM_MATCH", "state.items", children=[C("NE", "sku", "A1")]), "d01 d04 d05 d06 d07"),
    Case(
        "ELEM_MATCH OR child",
        C("ELEM_MATCH", "state.items", children=[C("OR", children=[C("EQ", "sku", "C3"), C("LT", "qty", 2)])]),
        "d02 d04 d07",
    ),
    Case(
        "ELEM_MATCH ignores the field map",
        C("ELEM_MATCH", "state.items", children=[C("EQ", "id", "A1")]),
        "",
        SNAPSHOT_MAP,
    ),
    # --- null, booleans, existence ------------------------------------------------------------
    Case("NULL", C("NULL", "state.active"), "d04 d05 d09 d12"),
    # --- Wow's space: every aggregate is in the default space "" --------------------------------
    Case("SPACE_ID a space", C("SPACE_ID", value="s-1"), ""),
    Case("SPACE_ID another space in OR", C("OR", children=[C("SPACE_ID", value="s-1"), C("ID", value="d02")]), "d02"),
    Case("SPACE_ID another space in NOR", C("NOR", children=[C("SPACE_ID", value="s-1")]), but()),
    Case("ownerId EQ empty: no owner", C("EQ", "ownerId", ""), ""),
    Case("NULL nested path with missing parent", C("NULL", "state.address.zip"), but("d01", "d02")),
    Case("NULL is not an empty array", C("NULL", "state.items"), "d08 d09 d10 d11 d12"),
    Case("NOT_NULL", C("NOT_NULL", "state.active"), "d01 d02 d03 d06 d07 d08 d10 d11"),
    Case("NOT_NULL name", C("NOT_NULL", "state.name"), but("d12")),
    Case("TRUE", C("TRUE", "state.active"), "d01 d03 d07 d10"),
    Case("FALSE", C("FALSE", "state.active"), "d02 d06 d08 d11"),
    Case("EXISTS true (null exists)", C("EXISTS", "state.note", True), "d01 d02 d04"),
    Case("EXISTS false", C("EXISTS", "state.note", False), but("d01", "d02", "d04")),
    Case("EXISTS defaults to true", C("EXISTS", "state.note"), "d01 d02 d04"),
    Case("EXISTS through arrays", C("EXISTS", "state.items.qty", True), "d01 d02 d04 d05 d06 d07"),
    Case("EXISTS false through arrays", C("EXISTS", "state.items.sku", False), "d03 d08 d09 d10 d11 d12"),
    # --- dates: epoch ms in Asia/Shanghai (Monday 2024-04-01) -----------------------------------
    Case("TODAY", C("TODAY", "state.createdAt", **SH), "d01"),
    Case("TOMORROW", C("TOMORROW", "state.createdAt", **SH), "d02"),
    Case("BEFORE_TODAY", C("BEFORE_TODAY", "state.createdAt", **SH), "d03 d04 d05 d08 d09"),
    # Wow's value: today at that time of day (d01 is today at 00:30:00.000), as seconds of the day or text.
    Case("BEFORE_TODAY at 00:30 excludes 00:30", C("BEFORE_TODAY", "state.createdAt", 1800, **SH),
         "d03 d04 d05 d08 d09"),
    Case("BEFORE_TODAY at 00:30:01", C("BEFORE_TODAY", "state.createdAt", 1801, **SH), "d01 d03 d04 d05 d08 d09"),
    Case("BEFORE_TODAY at HH:mm:ss.SSS", C("BEFORE_TODAY", "state.createdAt", "00:30:00.001", **SH),
         "d01 d03 d04 d05 d08 d09"),
    Case("BEFORE_TODAY at HH:mm in a pattern", C("BEFORE_TODAY", "state.stamp", "00:31", **STAMP),
         "d01 d03 d04 d05"),
    Case("THIS_WEEK", C("THIS_WEEK", "state.createdAt", **SH), "d01 d02 d06"),
    Case("NEXT_WEEK", C("NEXT_WEEK", "state.createdAt", **SH), "d07"),
    Case("LAST_WEEK crosses the month", C("LAST_WEEK", "state.createdAt", **SH), "d03 d04"),
    Case("THIS_MONTH", C("THIS_MONTH", "state.createdAt", **SH), "d01 d02 d06 d07 d10"),
    Case("LAST_MONTH", C("LAST_MONTH", "state.createdAt", **SH), "d03 d04 d05 d09"),
    Case("RECENT_DAYS 1 is today", C("RECENT_DAYS", "state.createdAt", 1, **SH), "d01"),
    Case("RECENT_DAYS 2", C("RECENT_DAYS", "state.createdAt", 2, **SH), "d01 d03"),
    Case("RECENT_DAYS 8", C("RECENT_DAYS", "state.createdAt", 8, **SH), "d01 d03 d04"),
    Case("RECENT_DAYS 9", C("RECENT_DAYS", "state.createdAt", 9, **SH), "d01 d03 d04 d05"),
    Case("EARLIER_DAYS 1 is before today", C("EARLIER_DAYS", "state.createdAt", 1, **SH), "d03 d04 d05 d08 d09"),
    Case("EARLIER_DAYS 2", C("EARLIER_DAYS", "state.createdAt", 2, **SH), "d04 d05 d08 d09"),
    Case("EARLIER_DAYS 8", C("EARLIER_DAYS", "state.createdAt", 8, **SH), "d05 d08 d09"),
    Case("EARLIER_DAYS 9", C("EARLIER_DAYS", "state.createdAt", 9, **SH), "d08 d09"),
    # --- dates: the same instants in UTC (default zone), where NOW is Sunday 2024-03-31 ----------
    Case("TODAY in UTC", C("TODAY", "state.createdAt"), "d01 d03"),
    Case("THIS_WEEK in UTC", C("THIS_WEEK", "state.createdAt"), "d01 d03"),
    Case("THIS_MONTH in UTC", C("THIS_MONTH", "state.createdAt", zoneId="UTC"), "d01 d03 d04 d05"),
    Case("LAST_MONTH in UTC", C("LAST_MONTH", "state.createdAt"), "d08 d09"),
    # --- dates: text fields in a datePattern ---------------------------------------------------
    Case("TODAY yyyy-MM-dd", C("TODAY", "state.day", **DAY), "d01"),
    Case("THIS_WEEK yyyy-MM-dd", C("THIS_WEEK", "state.day", **DAY), "d01 d02 d06"),
    Case("NEXT_WEEK yyyy-MM-dd", C("NEXT_WEEK", "state.day", **DAY), "d07"),
    Case("LAST_MONTH yyyy-MM-dd", C("LAST_MONTH", "state.day", **DAY), "d03 d04 d05 d09"),
    Case("THIS_MONTH yyyy-MM-dd", C("THIS_MONTH", "state.day", **DAY), "d01 d02 d06 d07 d10"),
    Case("RECENT_DAYS yyyy-MM-dd", C("RECENT_DAYS", "state.day", 2, **DAY), "d01 d03"),
    Case("EARLIER_DAYS yyyy-MM-dd", C("EARLIER_DAYS", "state.day", 8, **DAY), "d05 d08 d09"),
    Case("TOMORROW with time", C("TOMORROW", "state.stamp", **STAMP), "d02"),
    Case("BEFORE_TODAY with time", C("BEFORE_TODAY", "state.stamp", **STAMP), "d03 d04 d05"),
    Case("LAST_WEEK with time", C("LAST_WEEK", "state.stamp", **STAMP), "d03 d04"),
    Case("date text is not epoch ms", C("TODAY", "state.createdAt", **DAY), "d12"),
]


@pytest.fixture(scope="module")
def collection():
    client = mongomock.MongoClient()
    snapshots = client.shop.order_snapshot
    snapshots.insert_many(copy.deepcopy(DOCUMENTS))
    yield snapshots
    client.close()


def ids(documents) -> set[str]:
    return {doc["_id"] for doc in documents}


def expected(case: Case) -> set[str]:
    return set(case.expected.split())


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_mongo_filter(case: Case, collection):
    condition = parse_condition(case.condition, allow_raw=case.allow_raw)
    mongo_filter = compile_filter(condition, field_map=case.field_map, now=NOW)
    assert ids(collection.find(mongo_filter)) == expected(case), mongo_filter


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_evaluator(case: Case):
    condition = parse_condition(case.condition, allow_raw=case.allow_raw)
    found = {doc["_id"] for doc in DOCUMENTS if matches(condition, doc, field_map=case.field_map, now=NOW)}
    assert found == expected(case)


# --- the same table on the django backend's ORM compiler: SQLite and PostgreSQL -------------------------


@pytest.fixture(scope="module")
def orm_tables(django_db_setup, django_db_blocker):
    """The fixture documents as rows of a snapshot table on each SQL database (columns the table has but a
    fixture document lacks hold their defaults; no case reads them)."""
    from .query_app.stores import ALIASES, snapshot_store

    with django_db_blocker.unblock():
        stores = {alias: snapshot_store(alias) for alias in ALIASES}
        for store in stores.values():
            store.clear()
            for doc in DOCUMENTS:
                store.put({**ORM_DEFAULTS, **doc})
        yield stores
        for store in stores.values():
            store.clear()


ORM_DEFAULTS = {"eventId": "", "firstOperator": "", "operator": "", "firstEventTime": 0, "eventTime": 0,
                "snapshotTime": 0}
SQL_DATABASES = ["wow_sqlite", "wow_pg"]


def orm_ids(store, condition: Condition, field_map=None) -> set[str]:
    from wow_django.backends.django.compiler import compile_q
    from wow_django.backends.django.queries import SNAPSHOT_COLUMNS

    q = compile_q(condition, columns=SNAPSHOT_COLUMNS, field_map=field_map, now=NOW)
    return set(store.queryset("order").filter(q).values_list("aggregate_id", flat=True))


@pytest.mark.django_db(databases=["default", *SQL_DATABASES])
@pytest.mark.parametrize("database", SQL_DATABASES)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_orm_filter(case: Case, database, orm_tables):
    condition = parse_condition(case.condition, allow_raw=case.allow_raw)
    assert orm_ids(orm_tables[database], condition, case.field_map) == expected(case)


def test_every_operator_has_a_case():
    used = {node.operator for case in CASES for node in parse_condition(case.condition).walk()}
    # MATCH and RAW cannot run on both backends; they have their own tests below. The parser resolves SPACE_ID
    # (to ALL, or to IDS of no id: every aggregate is in the default space).
    assert set(Operator) - used == {Operator.MATCH, Operator.RAW, Operator.SPACE_ID}


def test_fixture_documents_are_not_changed_by_queries(collection):
    before = copy.deepcopy(DOCUMENTS)
    for case in CASES:
        condition = parse_condition(case.condition)
        for doc in DOCUMENTS:
            matches(condition, doc, field_map=case.field_map, now=NOW)
    assert DOCUMENTS == before


# --- MATCH: mongomock has no $text, so the compiled shape and the evaluator are tested apart ----------


def test_match_compiles_to_text_search():
    condition = parse_condition(C("MATCH", "ignored", "gift bob"))
    assert compile_filter(condition) == {"$text": {"$search": "gift bob"}}
    assert needs_text_search(condition)


def test_match_inside_top_level_and_compiles_next_to_other_clauses():
    condition = parse_condition(C("AND", children=[C("MATCH", value="gift"), C("TENANT_ID", value="t1")]))
    assert compile_filter(condition) == {"$and": [{"$text": {"$search": "gift"}}, {"tenantId": {"$eq": "t1"}}]}
    assert needs_text_search(condition)
    assert not needs_text_search(parse_condition(C("CONTAINS", "state.note", "gift")))


MATCH_CASES = [
    ("gift", {"d01"}),
    ("GIFT bob", {"d01", "d04"}),  # any term, case-insensitive
    ("wrap", {"d01"}),
    ("order", set(ALL_IDS.split())),  # every document's aggregateName is "order"
    ("shanghai", {"d01", "d03"}),  # any string field, nested too
    ("red", {"d01", "d02", "d04", "d06", "d09"}),  # strings inside arrays
    ("gif", set()),  # whole words only
    ("nothing-here", set()),
]


@pytest.mark.parametrize(("text", "expected_ids"), MATCH_CASES)
def test_match_in_the_evaluator(text, expected_ids):
    condition = parse_condition(C("MATCH", value=text))
    assert {doc["_id"] for doc in DOCUMENTS if matches(condition, doc, now=NOW)} == expected_ids


# --- RAW ----------------------------------------------------------------------------------------------


def test_raw_runs_on_mongo_when_allowed(collection):
    raw = {"state.score": {"$gte": 90}, "state.tags": {"$in": ["red"]}}
    condition = parse_condition(C("RAW", value=raw), allow_raw=True)
    assert compile_filter(condition) == raw
    assert ids(collection.find(compile_filter(condition))) == {"d01", "d04", "d09"}


def test_raw_accepts_json_text(collection):
    condition = parse_condition(C("RAW", value='{"state.name": {"$regex": "^B"}}'), allow_raw=True)
    assert ids(collection.find(compile_filter(condition))) == {"d04"}


def test_raw_in_the_evaluator_asks_for_mongo():
    condition = parse_condition(C("AND", children=[C("ALL"), C("RAW", value={"a": 1})]), allow_raw=True)
    with pytest.raises(QueryValidationError) as info:
        matches(condition, DOCUMENTS[0])
    assert info.value.path == "condition.children[1]"
    assert "RAW conditions need the Mongo backend" in info.value.rule


# --- MongoDB rules mongomock does not follow: evaluator only -------------------------------------------


def test_booleans_are_not_numbers():
    # MongoDB: true is a boolean, never equal to 1 (mongomock matches them, as Python's True == 1).
    doc = {"_id": "x", "flag": 1, "n": True}
    assert not matches(parse_condition(C("TRUE", "flag")), doc)
    assert not matches(parse_condition(C("EQ", "n", 1)), doc)
    assert not matches(parse_condition(C("GT", "n", 0)), doc)
    assert matches(parse_condition(C("EQ", "flag", 1)), doc)


def test_sub_document_equality_is_ordered():
    # MongoDB compares embedded documents field by field in order (mongomock ignores the order).
    doc = DOCUMENTS[1]
    assert matches(parse_condition(C("EQ", "state.address", {"city": "Beijing", "zip": "100000"})), doc)
    assert not matches(parse_condition(C("EQ", "state.address", {"zip": "100000", "city": "Beijing"})), doc)


def test_between_bounds_per_element_through_an_array_of_documents():
    # MongoDB applies the per-element rule through arrays of documents too (mongomock only on plain arrays).
    condition = parse_condition(C("BETWEEN", "state.items.qty", [3, 4]))
    assert {doc["_id"] for doc in DOCUMENTS if matches(condition, doc)} == {"d01", "d07"}


def test_exists_false_is_the_negation_of_exists_true():
    # MongoDB: one array element having the field makes it exist (mongomock also matches d05 for false).
    doc = DOCUMENTS[4]  # d05: items [{"sku": "A1", "qty": 7}, {"sku": "D4"}]
    assert matches(parse_condition(C("EXISTS", "state.items.qty", True)), doc)
    assert not matches(parse_condition(C("EXISTS", "state.items.qty", False)), doc)


def test_exclude_below_a_null_keeps_the_null():
    # MongoDB leaves non-document values alone when excluding a path below them (mongomock drops them).
    projected = apply_projection(DOCUMENTS[7], Projection(exclude=("state.items.qty",)))  # d08: items None
    assert projected["state"]["items"] is None
    projected = apply_projection(DOCUMENTS[0], Projection(exclude=("state.items.qty",)))
    assert projected["state"]["items"] == [{"sku": "A1"}, {"sku": "B2"}]


def test_eq_with_array_matches_nested_array_element():
    # MongoDB: {tags: {$eq: ["x"]}} also matches tags == [["x"], ...] (mongomock does not).
    assert matches(parse_condition(C("EQ", "tags", ["x"])), {"tags": [["x"], ["y"]]})


# --- regex safety ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["a.b*c (x)", ".*", "^$", "[a-z]+", "a|b", "\\d", "(?i)x", "{1,2}", "a\nb"])
def test_text_operators_escape_their_input(text):
    doc = {"_id": "x", "s": f"<{text}>", "other": "abc"}
    for operator in ("CONTAINS", "STARTS_WITH", "ENDS_WITH"):
        inside = {"CONTAINS": text, "STARTS_WITH": "<" + text, "ENDS_WITH": text + ">"}[operator]
        condition = parse_condition(C(operator, "s", inside))
        assert matches(condition, doc)
        assert not matches(parse_condition(C(operator, "other", inside)), doc)
        client = mongomock.MongoClient()
        client.db.c.insert_one(doc)
        assert client.db.c.count_documents(compile_filter(condition)) == 1
        assert client.db.c.count_documents(compile_filter(parse_condition(C(operator, "other", inside)))) == 0


def test_values_are_wrapped_in_explicit_operators():
    condition = parse_condition(
        C("AND", children=[C("EQ", "a", "$gt"), C("IN", "b", [{"k": 1}]), C("NE", "c", {"x": [1]})])
    )
    assert compile_filter(condition) == {
        "$and": [{"a": {"$eq": "$gt"}}, {"b": {"$in": [{"k": 1}]}}, {"c": {"$ne": {"x": [1]}}}]
    }


def test_compiled_lists_are_lists():
    condition = parse_condition(C("BETWEEN", "a", [1, 2]))
    assert condition.value == (1, 2)
    assert compile_filter(parse_condition(C("IDS", value=["a"]))) == {"_id": {"$in": ["a"]}}


def test_ignore_case_compiles_to_anchored_regex():
    assert compile_filter(parse_condition(C("EQ", "s", "a.b", ignoreCase=True))) == {
        "s": {"$regex": "^a\\.b(?![\\s\\S])", "$options": "i"}
    }
    assert compile_filter(parse_condition(C("NE", "s", "x", ignoreCase=True))) == {
        "$nor": [{"s": {"$regex": "^x(?![\\s\\S])", "$options": "i"}}]
    }
    # ignoreCase on a number is a plain equality
    assert compile_filter(parse_condition(C("EQ", "n", 5, ignoreCase=True))) == {"n": {"$eq": 5}}


def test_compile_field_map_renames_only_the_first_segment():
    assert compile_filter(parse_condition(C("EQ", "id.id", 1)), field_map={"id": "_id"}) == {"_id.id": {"$eq": 1}}
    assert compile_filter(parse_condition(C("TENANT_ID", value="t")), field_map={"tenantId": "x"}) == {
        "x": {"$eq": "t"}
    }


def test_date_operator_bounds_are_exact():
    condition = parse_condition(C("TODAY", "t", **SH))
    start = at(2024, 4, 1)
    assert compile_filter(condition, now=NOW) == {"t": {"$gte": start, "$lt": start + 86_400_000}}
    assert compile_filter(parse_condition(C("BEFORE_TODAY", "t", **SH)), now=NOW) == {"t": {"$lt": start}}
    assert compile_filter(parse_condition(C("THIS_WEEK", "t", **DAY)), now=NOW) == {
        "t": {"$gte": "2024-04-01", "$lt": "2024-04-08"}
    }


def test_now_must_be_aware():
    with pytest.raises(ValueError, match="timezone-aware"):
        compile_filter(parse_condition(C("TODAY", "t")), now=datetime(2024, 1, 1))


# --- dates.py ------------------------------------------------------------------------------------------


def window(operator: str, now: datetime, zone: str = "UTC", days: int | None = None):
    result = dates.date_window(operator, now=now, zone=ZoneInfo(zone), days=days)
    return (result.start and result.start.date(), result.end and result.end.date())


def test_windows_across_the_year_boundary():
    now = datetime(2024, 1, 2, 12, tzinfo=UTC)  # Tuesday
    assert window("LAST_MONTH", now) == (date(2023, 12, 1), date(2024, 1, 1))
    assert window("THIS_MONTH", now) == (date(2024, 1, 1), date(2024, 2, 1))
    assert window("THIS_WEEK", now) == (date(2024, 1, 1), date(2024, 1, 8))
    assert window("LAST_WEEK", now) == (date(2023, 12, 25), date(2024, 1, 1))
    assert window("RECENT_DAYS", now, days=3) == (date(2023, 12, 31), date(2024, 1, 3))
    assert window("EARLIER_DAYS", now, days=3) == (None, date(2023, 12, 31))
    december = datetime(2023, 12, 31, 23, tzinfo=UTC)  # Sunday
    assert window("THIS_MONTH", december) == (date(2023, 12, 1), date(2024, 1, 1))
    assert window("NEXT_WEEK", december) == (date(2024, 1, 1), date(2024, 1, 8))
    assert window("TOMORROW", december) == (date(2024, 1, 1), date(2024, 1, 2))


def test_earlier_days_is_before_the_recent_days_window():
    for days in (1, 2, 7, 30):
        recent = dates.date_window("RECENT_DAYS", now=NOW, zone=SHANGHAI, days=days)
        earlier = dates.date_window("EARLIER_DAYS", now=NOW, zone=SHANGHAI, days=days)
        assert earlier.start is None and earlier.end == recent.start


def test_day_starts_follow_the_zone_offset_across_daylight_saving():
    # New York moved to daylight time on 2024-03-10: that day is 23 hours long.
    now = datetime(2024, 3, 10, 12, tzinfo=ZoneInfo("America/New_York"))
    today = dates.date_window("TODAY", now=now, zone=ZoneInfo("America/New_York"))
    assert today.end.astimezone(UTC) - today.start.astimezone(UTC) == timedelta(hours=23)
    assert dates.to_epoch_ms(today.start) == dates.to_epoch_ms(datetime(2024, 3, 10, 5, tzinfo=UTC))


def test_date_patterns():
    pattern = dates.parse_date_pattern("yyyy-MM-dd'T'HH:mm:ss.SSS")
    moment = datetime(2024, 4, 1, 9, 5, 7, 42_000, tzinfo=SHANGHAI)
    assert pattern.format(moment) == "2024-04-01T09:05:07.042"
    assert dates.parse_date_pattern("yyyyMMdd").format(moment) == "20240401"
    for bad, message in [
        ("dd/MM/yyyy", "from the year down"),
        ("yyyy-MM", "from the year down"),
        ("yyyy-MM-dd hh:mm", "unsupported letters 'hh'"),
        ("yyyy-MM-dd'T", "unclosed quote"),
        ("", "non-empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            dates.parse_date_pattern(bad)


def test_before_today_takes_wows_time_of_day():
    today_at = dates.date_window("BEFORE_TODAY", now=NOW, zone=SHANGHAI, days=dates.parse_time_of_day("17:05:09"))
    assert today_at.start is None and today_at.end == datetime(2024, 4, 1, 17, 5, 9, tzinfo=SHANGHAI)
    assert dates.parse_time_of_day(0) == dates.parse_time_of_day("00:00") == time(0)
    assert dates.parse_time_of_day(86_399) == time(23, 59, 59)
    assert dates.parse_time_of_day("23:59:59.123456789") == time(23, 59, 59, 123456)
    assert dates.date_window("BEFORE_TODAY", now=NOW, zone=SHANGHAI).end == datetime(2024, 4, 1, tzinfo=SHANGHAI)
    for bad in (86_400, -1, True, 1.5, "24:00", "7:00", "07:60", "07:00:00.", "07:00Z", "", None, [1]):
        with pytest.raises(ValueError, match="a time of day"):
            dates.parse_time_of_day(bad)


@pytest.mark.parametrize("value", [86_400, -1, 0.5, True, "24:00", "9:30", "noon", {"h": 1}])
def test_a_before_today_value_that_is_no_time_of_day_is_refused_naming_it(value):
    with pytest.raises(QueryValidationError) as refused:
        parse_condition(C("BEFORE_TODAY", "state.createdAt", value))
    assert refused.value.path == "condition.value" and "BEFORE_TODAY takes a time of day" in str(refused.value)


def test_space_id_takes_a_space_id_and_matches_nothing_here():
    assert parse_condition(C("SPACE_ID", value="s-1")) == Condition(operator=Operator.IDS, value=())
    for operator in ("SPACE_ID", "OWNER_ID"):
        for bad in (None, "", 1, ["a"], "a\x00b"):
            with pytest.raises(QueryValidationError) as refused:
                parse_condition(C(operator, value=bad))
            assert refused.value.path == "condition.value"
    with pytest.raises(QueryValidationError, match="cannot be used inside ELEM_MATCH"):
        parse_condition(C("ELEM_MATCH", "state.items", children=[C("SPACE_ID", value="")]))


def test_recent_days_needs_a_positive_count():
    with pytest.raises(ValueError, match="between 1 and"):
        dates.date_window("RECENT_DAYS", now=NOW, zone=SHANGHAI, days=0)


# --- parse errors: path and rule --------------------------------------------------------------------------

ERRORS = [
    ("not an object", ["EQ"], "condition", "must be a JSON object"),
    ("missing operator", {"field": "a"}, "condition.operator", "an operator is required"),
    (
        "unknown operator",
        C("CONTAIN", "a", "x"),
        "condition.operator",
        "unknown operator 'CONTAIN'. Did you mean 'CONTAINS'?",
    ),
    ("lower-case operator", C("eq", "a", 1), "condition.operator", "Did you mean 'EQ'?"),
    ("operator by its English name", C("GREATER", "a", 1), "condition.operator", "Did you mean 'GT'?"),
    ("operator by SQL's name", C("like", "a", "x"), "condition.operator", "Did you mean 'CONTAINS'?"),
    ("unknown key", {"operator": "ALL", "opts": {}}, "condition.opts", "unknown key"),
    ("field required", C("EQ", value=1), "condition.field", "EQ needs a field"),
    ("field with $", C("EQ", "$where", 1), "condition.field", "not a valid field path"),
    ("field with $ segment", C("EQ", "state.$gt", 1), "condition.field", "not a valid field path"),
    ("empty segment", C("EQ", "state..name", 1), "condition.field", "no empty segments"),
    ("leading digit", C("EQ", "1st", 1), "condition.field", "not a valid field path"),
    ("trailing newline", C("EQ", "name\n", 1), "condition.field", "not a valid field path"),
    ("field not a string", {"operator": "ID", "field": 3, "value": "x"}, "condition.field", "must be a string"),
    ("$ key injection", C("EQ", "name", {"$gt": ""}), "condition.value", "'$gt'"),
    ("nested $ key injection", C("IN", "a", [{"b": {"$ne": 1}}]), "condition.value[0].b", "'$ne'"),
    (
        "injection in a child",
        C("AND", children=[C("ALL"), C("NE", "a", {"$where": "1"})]),
        "condition.children[1].value",
        "keys starting with '$' are not allowed",
    ),
    ("RAW refused by default", C("RAW", value={"a": 1}), "condition.operator", "RAW conditions are disabled"),
    ("value type", C("AND", children=[C("ALL"), C("GT", "a", [1])]), "condition.children[1].value", "GT compares"),
    ("NaN", C("EQ", "a", float("nan")), "condition.value", "finite"),
    ("boolean comparison", C("LT", "a", True), "condition.value", "finite number or a string"),
    ("ID needs text", C("ID", value=5), "condition.value", "ID takes a non-empty string"),
    ("IDS items", C("IDS", value=["a", 1]), "condition.value[1]", "IDS takes a non-empty string"),
    ("IN needs a list", C("IN", "a", "x"), "condition.value", "IN takes a list"),
    ("list too long", C("IN", "a", list(range(1001))), "condition.value", "at most 1000"),
    ("ALL_IN empty", C("ALL_IN", "a", []), "condition.value", "at least one value"),
    ("BETWEEN size", C("BETWEEN", "a", [1]), "condition.value", "two values"),
    ("BETWEEN mixed", C("BETWEEN", "a", [1, "z"]), "condition.value", "both be numbers or both be strings"),
    ("DELETED value", C("DELETED", value="active"), "condition.value", "Did you mean 'ACTIVE'?"),
    ("EXISTS value", C("EXISTS", "a", "yes"), "condition.value", "true or false"),
    ("RECENT_DAYS zero", C("RECENT_DAYS", "a", 0), "condition.value", "whole number of days from 1"),
    ("EARLIER_DAYS float", C("EARLIER_DAYS", "a", 1.5), "condition.value", "whole number of days"),
    ("value on NULL", C("NULL", "a", 1), "condition.value", "NULL takes no value"),
    ("MATCH blank", C("MATCH", value="  "), "condition.value", "at least one word"),
    ("children on EQ", C("EQ", "a", 1, children=[C("ALL")]), "condition.children", "EQ takes no children"),
    ("OR without children", C("OR", children=[]), "condition.children", "OR needs at least one child"),
    ("ELEM_MATCH without children", C("ELEM_MATCH", "a"), "condition.children", "at least one child"),
    (
        "ID inside ELEM_MATCH",
        C("ELEM_MATCH", "items", children=[C("ID", value="x")]),
        "condition.children[0].operator",
        "cannot be used inside ELEM_MATCH",
    ),
    (
        "MATCH inside OR",
        C("OR", children=[C("MATCH", value="x"), C("ALL")]),
        "condition.children[0].operator",
        "top level or inside top-level AND",
    ),
    (
        "two MATCH",
        C("AND", children=[C("MATCH", value="x"), C("MATCH", value="y")]),
        "condition.children[1].operator",
        "only one MATCH",
    ),
    (
        "unknown option",
        C("EQ", "a", "x", ignorecase=True),
        "condition.options.ignorecase",
        "Did you mean 'ignoreCase'?",
    ),
    ("ignoreCase type", C("EQ", "a", "x", ignoreCase="yes"), "condition.options.ignoreCase", "true or false"),
    ("ignoreCase on GT", C("GT", "a", 1, ignoreCase=True), "condition.options.ignoreCase", "applies only to EQ, NE"),
    ("zoneId on EQ", C("EQ", "a", 1, zoneId="UTC"), "condition.options.zoneId", "applies only to date operators"),
    (
        "bad zone",
        C("TODAY", "a", zoneId="Mars/Olympus"),
        "condition.options.zoneId",
        "unknown time zone 'Mars/Olympus'",
    ),
    ("zone path escape", C("TODAY", "a", zoneId="../etc/passwd"), "condition.options.zoneId", "unknown time zone"),
    ("bad date pattern", C("TODAY", "a", datePattern="dd/MM/yyyy"), "condition.options.datePattern", "year down"),
    ("options type", {"operator": "ALL", "options": []}, "condition.options", "must be a JSON object"),
    ("date pattern type", C("TODAY", "a", datePattern=["yyyy"]), "condition.options.datePattern", "must be a string"),
]


@pytest.mark.parametrize(("name", "data", "path", "message"), ERRORS, ids=[e[0] for e in ERRORS])
def test_parse_errors(name, data, path, message):
    with pytest.raises(QueryValidationError) as info:
        parse_condition(data)
    assert info.value.path == path
    assert message in info.value.rule
    assert str(info.value) == f"{path}: {info.value.rule}"


RAW_ERRORS = [
    ({"$where": "this.a == 1"}, "condition.value.$where", "$where is refused"),
    ({"$or": [{"a": 1}, {"$where": "sleep(1000)"}]}, "condition.value.$or[1].$where", "$where is refused"),
    ({"a": {"$function": {"body": "x"}}}, "condition.value.a.$function", "server-side code"),
    ({"$expr": {"$gt": ["$a", 1]}}, "condition.value.$expr", "$expr is refused"),
    ({"$jsonSchema": {"required": ["a"]}}, "condition.value.$jsonSchema", "refused"),
    ({"a": {"$accumulator": {}}}, "condition.value.a.$accumulator", "refused"),
    ({"a": {"$near": [0, 0]}}, "condition.value.a.$near", "not an allowed RAW operator"),
    ({"a.$b": 1}, "condition.value.a.$b", "not a valid field path"),
    ("not json", "condition.value", "JSON text"),
    ([{"a": 1}], "condition.value", "filter object"),
    ({"a": {"$in": list(range(1001))}}, "condition.value.a.$in", "at most 1000 values (got 1001)"),
    ({"a": {"$in": [0.5, float("nan")]}}, "condition.value.a.$in[1]", "finite"),
]


def test_raw_lists_of_up_to_the_limit_pass():
    raw = {"a": {"$in": list(range(1000))}, "b": {"$nin": [1.5, None, "x", True]}}
    assert parse_condition(C("RAW", value=raw), allow_raw=True).value == raw


@pytest.mark.parametrize(("raw", "path", "message"), RAW_ERRORS)
def test_raw_is_refused_even_when_allowed(raw, path, message):
    with pytest.raises(QueryValidationError) as info:
        parse_condition(C("RAW", value=raw), allow_raw=True)
    assert info.value.path == path
    assert message in info.value.rule


def nested_and(levels: int) -> dict:
    condition = C("ALL")
    for _ in range(levels - 1):
        condition = C("AND", children=[condition])
    return condition


def test_depth_cap():
    assert parse_condition(nested_and(16)).operator is Operator.AND
    with pytest.raises(QueryValidationError) as info:
        parse_condition(nested_and(17))
    assert info.value.path == "condition" + ".children[0]" * 16
    assert "nested deeper than 16 levels" in info.value.rule
    with pytest.raises(QueryValidationError, match="deeper than 3"):
        parse_condition(nested_and(4), max_depth=3)


def test_value_depth_cap():
    value: dict = {"x": 1}
    for _ in range(20):
        value = {"x": value}
    with pytest.raises(QueryValidationError, match="values are nested deeper than 16 levels"):
        parse_condition(C("EQ", "a", value))


QUERY_ERRORS = [
    (parse_paged_query, {"pagination": {"index": 1, "size": 201}}, "pagination.size", "at most 200"),
    (parse_paged_query, {"pagination": {"index": 0, "size": 10}}, "pagination.index", "at least 1"),
    (parse_paged_query, {"pagination": {"index": "2", "size": 10}}, "pagination.index", "whole number"),
    (parse_paged_query, {"pagination": {"index": 2**31, "size": 10}}, "pagination.index", "at most"),
    (parse_paged_query, {"pagination": {"page": 1}}, "pagination.page", "unknown key"),
    (parse_paged_query, {"pagination": []}, "pagination", "JSON object"),
    (parse_list_query, {"limit": 1001}, "limit", "at most 1000"),
    (parse_list_query, {"limit": 0}, "limit", "at least 1"),
    (parse_list_query, {"limit": True}, "limit", "whole number"),
    (parse_single_query, {"limit": 5}, "limit", "unknown key"),
    (parse_list_query, {"sorts": []}, "sorts", "Did you mean 'sort'?"),
    (parse_single_query, {"projection": {"include": ["a"], "exclude": ["b"]}}, "projection", "not both"),
    (parse_single_query, {"projection": {"include": ["a.$b"]}}, "projection.include[0]", "not a valid field path"),
    (parse_single_query, {"projection": {"include": ["state", "state.name"]}}, "projection.include[1]", "overlaps"),
    (parse_single_query, {"projection": {"fields": ["a"]}}, "projection.fields", "unknown key"),
    (parse_single_query, {"sort": [{"field": "a", "direction": "asc"}]}, "sort[0].direction", "Did you mean 'ASC'?"),
    (parse_single_query, {"sort": [{"field": "a"}, {"field": "a"}]}, "sort[1].field", "already sorted on"),
    (parse_single_query, {"sort": [{"direction": "ASC"}]}, "sort[0].field", "a field path is required"),
    (parse_single_query, {"sort": {"field": "a"}}, "sort", "must be a list"),
    (parse_single_query, {"condition": C("EQ", "a", {"$gt": 1})}, "condition.value", "'$gt'"),
    (parse_single_query, ["not", "a", "body"], "body", "JSON object"),
    (parse_count_query, C("NOPE"), "condition.operator", "unknown operator"),
]


@pytest.mark.parametrize(("parse", "data", "path", "message"), QUERY_ERRORS)
def test_query_errors(parse, data, path, message):
    with pytest.raises(QueryValidationError) as info:
        parse(data)
    assert info.value.path == path
    assert message in info.value.rule


def test_query_limits_come_from_the_caller():
    assert parse_paged_query({"pagination": {"index": 3, "size": 50}}, max_page_size=50).pagination == Pagination(
        index=3, size=50
    )
    with pytest.raises(QueryValidationError, match="at most 20"):
        parse_paged_query({"pagination": {"size": 21}}, max_page_size=20)
    with pytest.raises(QueryValidationError, match="at most 5"):
        parse_list_query({"limit": 6}, max_limit=5)
    assert parse_list_query({}, max_limit=5).limit == 5  # the default never exceeds the cap
    with pytest.raises(QueryValidationError, match="RAW conditions are disabled"):
        parse_list_query({"condition": C("RAW", value={"a": 1})})
    assert parse_list_query({"condition": C("RAW", value={"a": 1})}, allow_raw=True).condition.value == {"a": 1}


def test_query_defaults():
    single = parse_single_query({})
    assert single.condition == ALL_CONDITION and single.projection.is_empty and single.sort == ()
    assert parse_single_query(None).condition == ALL_CONDITION
    assert parse_list_query({"condition": None}).limit == 10
    paged = parse_paged_query({"pagination": {"index": 2}})
    assert paged.pagination == Pagination(index=2, size=10) and paged.pagination.offset == 10
    assert parse_count_query(None) == ALL_CONDITION
    assert parse_count_query({}) == ALL_CONDITION


def test_full_paged_query():
    query = parse_paged_query(
        {
            "condition": C("AND", children=[C("TENANT_ID", value="t1"), C("GT", "state.score", 1)]),
            "projection": {"exclude": ["state.items"]},
            "sort": [{"field": "state.score", "direction": "DESC"}, {"field": "id"}],
            "pagination": {"index": 1, "size": 2},
        }
    )
    assert query.sort == (SortField(field="state.score", direction=Direction.DESC), SortField(field="id"))
    assert query.projection == Projection(exclude=("state.items",))
    assert compile_sort(query.sort, field_map=SNAPSHOT_MAP) == [("state.score", -1), ("_id", 1)]
    assert compile_projection(query.projection) == {"state.items": 0}


def test_wow_style_empty_values_are_accepted():
    condition = parse_condition(
        {"field": "", "operator": "AND", "value": "", "children": [C("NULL", "a", "")], "options": {}}
    )
    assert condition.value is None and condition.children[0].value is None
    today = parse_condition(C("TODAY", "a", zoneId=None, datePattern=None))  # null options mean "not given"
    assert today.options.zone_id == "UTC" and today.options.date_pattern is None


def test_error_carries_code_and_binding_errors():
    with pytest.raises(QueryValidationError) as info:
        parse_condition(C("EQ", "a..b", 1))
    error = info.value
    assert isinstance(error, WowError)
    assert error.error_code == "IllegalArgument"
    assert error.binding_errors == [{"name": "condition.field", "msg": error.rule}]


def test_and_conditions_adds_scope():
    client = parse_condition(C("MATCH", value="gift"))
    scoped = and_conditions(client, Condition(operator=Operator.TENANT_ID, value="t1"), ALL_CONDITION)
    assert [child.operator for child in scoped.children] == [Operator.MATCH, Operator.TENANT_ID]
    assert and_conditions(ALL_CONDITION) == ALL_CONDITION
    assert and_conditions(client) is client


def test_hand_built_conditions_accept_plain_strings(collection):
    deleted = Condition(operator="DELETED", value="DELETED")
    assert deleted.operator is Operator.DELETED
    assert compile_filter(deleted) == {"deleted": {"$eq": True}}
    both = Condition(operator="AND", children=[deleted, Condition(operator="TENANT_ID", value="t1")])
    assert isinstance(both.children, tuple)
    assert ids(collection.find(compile_filter(both))) == {"d06"}
    assert [doc["_id"] for doc in DOCUMENTS if matches(both, doc)] == ["d06"]
    assert SortField(field="a", direction="DESC").direction is Direction.DESC


def test_the_query_package_imports_no_engine():
    """query/ is the DSL, its semantics and the evaluator: no Django, no pymongo, no bson (the compilers are in
    their backends' folders)."""
    code = (
        "import sys, pkgutil, importlib, wow_django.query as q\n"
        "for m in pkgutil.iter_modules(q.__path__): importlib.import_module('wow_django.query.' + m.name)\n"
        "engines = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'pymongo', 'bson'))\n"
        "assert not engines, engines"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "DJANGO_SETTINGS_MODULE": ""})


# --- projection and sort: evaluator against mongomock ----------------------------------------------------

PROJECTIONS = [
    {"include": ["state.name", "state.items.sku", "tenantId"]},
    {"include": ["id"]},
    {"exclude": ["state.address.zip", "state.items", "contextName"]},
    {"exclude": ["id", "state"]},
]


@pytest.mark.parametrize("projection_data", PROJECTIONS)
def test_projection_matches_mongo(projection_data, collection):
    projection = parse_single_query({"projection": projection_data}).projection
    mongo_projection = compile_projection(projection, field_map=SNAPSHOT_MAP)
    from_mongo = list(collection.find({}, mongo_projection))  # the embedded engine returns insertion order
    mine = [apply_projection(doc, projection, field_map=SNAPSHOT_MAP) for doc in DOCUMENTS]
    assert mine == from_mongo  # field order aside: mongomock moves _id last, MongoDB keeps the stored order


def test_projection_include_keeps_document_order_and_id():
    projection = Projection(include=("state.score", "state.name"))
    projected = apply_projection(DOCUMENTS[0], projection)
    assert projected == {"_id": "d01", "state": {"name": "Alice", "score": 90}}
    assert list(projected["state"]) == ["name", "score"]
    assert apply_projection(DOCUMENTS[0], Projection()) == DOCUMENTS[0]
    assert apply_projection(DOCUMENTS[0], Projection()) is not DOCUMENTS[0]


SORTS = [
    [{"field": "state.score", "direction": "ASC"}, {"field": "id", "direction": "ASC"}],
    [{"field": "state.score", "direction": "DESC"}, {"field": "id", "direction": "DESC"}],
    [{"field": "tenantId", "direction": "DESC"}, {"field": "state.name", "direction": "ASC"}],
    [{"field": "state.address.city"}, {"field": "aggregateId", "direction": "DESC"}],
]


@pytest.mark.parametrize("sort_data", SORTS)
def test_sort_matches_mongo(sort_data, collection):
    sort = parse_single_query({"sort": sort_data}).sort
    from_mongo = [doc["_id"] for doc in collection.find({}, sort=compile_sort(sort, field_map=SNAPSHOT_MAP))]
    assert [doc["_id"] for doc in sort_documents(DOCUMENTS, sort, field_map=SNAPSHOT_MAP)] == from_mongo


def test_sort_uses_mongo_type_order():
    # null/missing < numbers < strings; score "90" (d05) sorts after every number.
    ordered = sort_documents(DOCUMENTS, (SortField(field="state.score"), SortField(field="_id")))
    assert [doc["_id"] for doc in ordered] == "d12 d07 d06 d08 d03 d02 d11 d01 d10 d04 d09 d05".split()


def test_sort_arrays_by_smallest_ascending_and_largest_descending():
    # MongoDB's rule (mongomock uses the smallest element both ways); [] sorts before null.
    docs = [{"_id": "a", "v": [1, 9]}, {"_id": "b", "v": 5}, {"_id": "c", "v": []}, {"_id": "d"}]
    ascending = sort_documents(docs, (SortField(field="v"),))
    descending = sort_documents(docs, (SortField(field="v", direction=Direction.DESC),))
    assert [d["_id"] for d in ascending] == ["c", "d", "a", "b"]
    assert [d["_id"] for d in descending] == ["a", "b", "d", "c"]


@pytest.mark.parametrize(("value", "rule"), [
    ({"a\x00b": 1}, "keys may not contain the NUL character"),
    ({"n": 2**63}, "integers must fit in 64 bits"),
    ([-(2**63) - 1], "integers must fit in 64 bits"),
])
def test_values_bson_cannot_encode_are_refused(value, rule):
    with pytest.raises(QueryValidationError, match=rule):
        parse_condition({"field": "state.x", "operator": "EQ", "value": value})


def test_the_largest_64_bit_integers_are_accepted():
    parse_condition({"field": "state.x", "operator": "IN", "value": [2**63 - 1, -(2**63)]})


# --- the ORM compiler beyond the case table: MATCH, MongoDB rules mongomock misses, sort, projection ------

ORM_DATABASES = ["default", *SQL_DATABASES]


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
@pytest.mark.parametrize(("text", "expected_ids"), MATCH_CASES)
def test_match_on_the_orm(database, orm_tables, text, expected_ids):
    assert orm_ids(orm_tables[database], parse_condition(C("MATCH", value=text))) == expected_ids


def orm_rows(database: str, states: dict[str, dict]):
    """A fresh snapshot table on ``database`` holding one row per ``_id`` with the given state."""
    from .query_app.stores import snapshot_store

    store = snapshot_store(database)
    store.clear()
    for _id, state in states.items():
        store.put({**ORM_DEFAULTS, **snapshot(_id, "t1", "u1", state)})
    return store


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
def test_orm_follows_the_mongodb_rules_mongomock_misses(database):
    store = orm_rows(database, {"x": {"flag": 1, "n": True, "tags": [["x"], ["y"]]}})
    for data, found in [
        (C("TRUE", "state.flag"), set()),  # booleans are not numbers
        (C("EQ", "state.n", 1), set()),
        (C("GT", "state.n", 0), set()),
        (C("EQ", "state.flag", 1), {"x"}),
        (C("EQ", "state.flag", 1.0), {"x"}),
        (C("EQ", "state.tags", ["x"]), {"x"}),  # {$eq: ["x"]} matches an array element equal to ["x"]
    ]:
        assert orm_ids(store, parse_condition(data)) == found, data
    store = orm_rows(database, {doc["_id"]: doc["state"] for doc in DOCUMENTS})
    # Bounds per element through arrays of documents; one element with the field makes it exist.
    assert orm_ids(store, parse_condition(C("BETWEEN", "state.items.qty", [3, 4]))) == {"d01", "d07"}
    assert "d05" in orm_ids(store, parse_condition(C("EXISTS", "state.items.qty", True)))
    assert "d05" not in orm_ids(store, parse_condition(C("EXISTS", "state.items.qty", False)))


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
def test_orm_sub_document_equality_ignores_key_order(database):
    # The one rule where the ORM compiler leaves the evaluator: jsonb (PostgreSQL) keeps no key order,
    # so embedded documents compare as sets of fields on both SQL engines.
    store = orm_rows(database, {doc["_id"]: doc["state"] for doc in DOCUMENTS})
    for address in ({"city": "Beijing", "zip": "100000"}, {"zip": "100000", "city": "Beijing"}):
        assert orm_ids(store, parse_condition(C("EQ", "state.address", address))) == {"d02"}
    assert orm_ids(store, parse_condition(C("EQ", "state.address", {"city": "Beijing"}))) == set()
    assert orm_ids(store, parse_condition(C("EQ", "state.address", {"city": "Beijing", "zip": 100000}))) == set()


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
@pytest.mark.parametrize("text", ["a.b*c (x)", ".*", "^$", "[a-z]+", "a|b", "\\d", "(?i)x", "{1,2}", "a\nb", "%", "_",
                                  "\\", "'; --", "***=x", "(?x)"])
def test_orm_text_operators_take_text_literally(database, text):
    store = orm_rows(database, {"x": {"s": f"<{text}>", "other": "abc", "upper": f"<{text.upper()}>"}})
    for operator in ("CONTAINS", "STARTS_WITH", "ENDS_WITH"):
        inside = {"CONTAINS": text, "STARTS_WITH": "<" + text, "ENDS_WITH": text + ">"}[operator]
        assert orm_ids(store, parse_condition(C(operator, "state.s", inside))) == {"x"}
        assert orm_ids(store, parse_condition(C(operator, "state.other", inside))) == set()
        assert orm_ids(store, parse_condition(C(operator, "state.upper", inside, ignoreCase=True))) == {"x"}
    assert orm_ids(store, parse_condition(C("EQ", "state.s", f"<{text}>".upper(), ignoreCase=True))) == {"x"}
    assert orm_ids(store, parse_condition(C("NE", "state.s", f"<{text}>", ignoreCase=True))) == set()


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
def test_orm_refuses_raw_naming_the_node(database, orm_tables):
    from wow_django.backends.django.compiler import compile_q
    from wow_django.backends.django.queries import SNAPSHOT_COLUMNS

    condition = parse_condition(C("AND", children=[C("ALL"), C("RAW", value={"a": 1})]), allow_raw=True)
    with pytest.raises(QueryValidationError) as info:
        compile_q(condition, columns=SNAPSHOT_COLUMNS)
    assert info.value.path == "condition.children[1]"
    assert "RAW conditions need the Mongo backend" in info.value.rule


def orm_sorted_ids(store, sort) -> list[str]:
    from wow_django.backends.django.compiler import compile_order_by
    from wow_django.backends.django.queries import SNAPSHOT_COLUMNS

    order = compile_order_by(sort, columns=SNAPSHOT_COLUMNS, field_map=SNAPSHOT_MAP)
    return list(store.queryset("order").order_by(*order).values_list("aggregate_id", flat=True))


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
@pytest.mark.parametrize("sort_data", [*SORTS, [{"field": "state.score"}, {"field": "id"}],
                                       [{"field": "state.tags", "direction": "DESC"}, {"field": "id"}],
                                       [{"field": "state.tags"}, {"field": "id"}],
                                       [{"field": "state.items.qty", "direction": "DESC"}, {"field": "id"}],
                                       [{"field": "state.active"}, {"field": "state.name", "direction": "DESC"}],
                                       [{"field": "deleted", "direction": "DESC"}, {"field": "id"}],
                                       [{"field": "state.createdAt"}, {"field": "id", "direction": "DESC"}]])
def test_orm_sort_is_the_evaluators(database, orm_tables, sort_data):
    sort = parse_single_query({"sort": sort_data}).sort
    expected_order = [doc["_id"] for doc in sort_documents(DOCUMENTS, sort, field_map=SNAPSHOT_MAP)]
    assert orm_sorted_ids(orm_tables[database], sort) == expected_order


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
def test_orm_sorts_arrays_by_smallest_ascending_and_largest_descending(database):
    store = orm_rows(database, {"a": {"v": [1, 9]}, "b": {"v": 5}, "c": {"v": []}, "d": {}, "e": {"v": [True]},
                                "f": {"v": ["s", 2]}, "g": {"v": None}})
    ascending = orm_sorted_ids(store, (SortField(field="state.v"), SortField(field="_id")))
    descending = orm_sorted_ids(store, (SortField(field="state.v", direction=Direction.DESC), SortField(field="_id")))
    assert ascending == ["c", "d", "g", "a", "f", "b", "e"]
    assert descending == ["e", "f", "a", "b", "d", "g", "c"]


@pytest.mark.django_db(databases=ORM_DATABASES)
@pytest.mark.parametrize("database", SQL_DATABASES)
@pytest.mark.parametrize("projection_data", PROJECTIONS)
def test_orm_projection_is_the_evaluators(database, orm_tables, projection_data):
    from wow_django.backends.django.queries import DjangoSnapshotQueryService

    projection = parse_single_query({"projection": projection_data}).projection
    service = DjangoSnapshotQueryService(orm_tables[database], "order")
    found = service.find_documents(ALL_CONDITION, projection=projection, sort=(SortField(field="_id"),), skip=0,
                                   limit=0)
    stored = [dict(zip(service.COLUMNS, [{**ORM_DEFAULTS, **doc}[name] for name in service.COLUMNS], strict=True))
              for doc in DOCUMENTS]
    assert found == [apply_projection(doc, projection, field_map=SNAPSHOT_MAP) for doc in stored]

"""The ORM compiler and the django query services against the Python evaluator, on SQLite and PostgreSQL.

The differential tests generate small documents (nested objects and arrays,
values of every JSON type chosen to collide with the conditions' values) and
conditions using every operator and option, write the documents as rows on
both SQL databases and require the rows each condition selects, and the
order of each sort, to be what the evaluator says. Hypothesis runs
derandomised and bounded, so the suite is repeatable.

Documents are generated with sorted object keys: sub-document equality is the
one place the ORM compiler ignores key order (see ``wow_django.backends.django.compiler``),
tested on its own in ``test_condition.py``.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from django.db import NotSupportedError, OperationalError, connections, transaction
from django.db.models import Q
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wow_django.backends.django.compiler import (
    ConditionExpression,
    are_literal,
    compile_condition,
    compile_order_by,
    compile_q,
    condition_data,
    query_size,
)
from wow_django.backends.django.queries import (
    EVENT_STREAM_COLUMNS,
    SNAPSHOT_COLUMNS,
    DjangoEventStreamQueryService,
    DjangoSnapshotQueryService,
    query_settings,
)
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.query import FIELD_MAPS
from wow_django.query import dates
from wow_django.query.condition import (
    Direction,
    ListQuery,
    Operator,
    SortField,
    parse_condition,
    parse_count_query,
    parse_list_query,
)
from wow_django.query.errors import QueryTooExpensive, QueryValidationError
from wow_django.query.evaluator import _field_sort_key, matches, sort_documents
from wow_django.query.semantics import map_field

from .query_app.stores import ALIASES, event_store, snapshot_store

DATABASES = ["default", *ALIASES]
SHANGHAI = ZoneInfo("Asia/Shanghai")
NOW = datetime(2024, 4, 1, 4, 0, tzinfo=SHANGHAI)  # Monday in Shanghai, Sunday in UTC
SNAPSHOT_MAP = FIELD_MAPS["snapshot"]
STREAM_MAP = FIELD_MAPS["event_stream"]


def at(*parts: int) -> int:
    year, month, day, hour, minute = (*parts, 0, 0)[:5]
    return dates.to_epoch_ms(datetime(year, month, day, hour, minute, tzinfo=SHANGHAI))


# --- generated documents ------------------------------------------------------------------------------

KEYS = ["a", "b", "c", "0", "1"]
WORDS = ["", "a", "A", "b", "ab", "aB", "a b", "é", "É", "x_y", "a%", "%", "_", "\\", "1", "90", "a.b", "[a]",
         "Gift wrap", "gift", "2024-04-01", "2024-03-31 23:00:00", "2024-04-08"]
NUMBERS = [0, 1, -1, 2, 3, 1.5, -0.5, 2.0, 90, 10**16, 1e16, at(2024, 4, 1, 0, 30), at(2024, 3, 31), at(2024, 3, 25),
           at(2024, 4, 2), at(2024, 2, 29, 12), at(2024, 4, 30, 23)]

scalars = st.one_of(
    st.sampled_from([None, True, False]),
    st.sampled_from(NUMBERS),
    st.integers(-3, 3),
    st.sampled_from(WORDS),
    st.text(alphabet="aAbé É_%.\\\n", max_size=3),
)


def sorted_dict(d: dict) -> dict:
    return dict(sorted(d.items()))


json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(KEYS), children, max_size=3).map(sorted_dict),
    ),
    max_leaves=6,
)
objects = st.dictionaries(st.sampled_from(KEYS), json_values, min_size=1, max_size=3).map(sorted_dict)
# Documents where paths lead somewhere: "a" is always there, arrays of objects are common.
states = st.fixed_dictionaries(
    {"a": st.one_of(json_values, st.lists(objects, max_size=3), objects)},
    optional={key: st.one_of(json_values, st.lists(st.one_of(objects, scalars), max_size=3)) for key in KEYS[1:]},
).map(sorted_dict)


@st.composite
def snapshot_documents(draw, index: int) -> dict:
    return {
        "_id": f"s{index}",
        "contextName": "shop",
        "aggregateName": "order",
        "tenantId": draw(st.sampled_from(["t1", "t2", "T1"])),
        "ownerId": draw(st.sampled_from(["", "u1", "a b"])),
        "version": draw(st.integers(-2, 3)),
        "eventId": draw(st.sampled_from(["", "e1", "gift"])),
        "firstOperator": "",
        "operator": draw(st.sampled_from(["", "op"])),
        "firstEventTime": 0,
        "eventTime": draw(st.sampled_from([0, at(2024, 4, 1, 0, 30)])),
        "snapshotTime": draw(st.sampled_from(NUMBERS[:5] + [at(2024, 3, 31)])),
        "deleted": draw(st.booleans()),
        "state": draw(states),
    }


events = st.fixed_dictionaries({
    "id": st.sampled_from(["e1", "e2"]),
    "name": st.sampled_from(["created", "paid", "a"]),
    "revision": st.just("1"),
    "bodyType": st.just("tests.Event"),
    "body": states,
}).map(sorted_dict)


@st.composite
def stream_documents(draw, index: int) -> dict:
    body = draw(st.lists(events, max_size=3))
    return {
        "_id": f"s{index}",
        "contextName": "shop",
        "aggregateName": "order",
        "aggregateId": draw(st.sampled_from(["a1", "a2"])),
        "tenantId": draw(st.sampled_from(["t1", "t2"])),
        "ownerId": draw(st.sampled_from(["", "u1"])),
        "requestId": f"r{index}",
        "commandId": "c",
        "version": draw(st.integers(1, 3)),
        "header": draw(states),
        "body": body,
        "size": len(body),
        "createTime": draw(st.sampled_from(NUMBERS[:5] + [at(2024, 3, 31), at(2024, 4, 1, 0, 30)])),
    }


# --- generated conditions -------------------------------------------------------------------------------

SNAPSHOT_PATHS = ["state.a", "state.b", "state.0", "state.a.b", "state.a.0", "state.0.a", "state.a.b.c", "state.b.1",
                  "state.b.1.a", "state.c.a.b", "state", "tenantId", "ownerId", "version", "deleted", "id",
                  "aggregateId", "snapshotTime", "eventTime", "operator", "tenantId.a", "nothing", "nothing.a"]
STREAM_PATHS = ["body", "body.name", "body.body", "body.body.a", "body.body.a.b", "body.0.name", "body.1.body.b",
                "header.a", "header.a.b", "header.0", "size", "createTime", "aggregateId", "id", "version", "tenantId"]
ELEMENT_PATHS = ["a", "b", "a.b", "a.0", "a.1.b", "b.a", "name", "body.a", "id"]
ZONES = ["UTC", "Asia/Shanghai", "America/New_York"]
PATTERNS = [None, "yyyy-MM-dd", "yyyy-MM-dd HH:mm:ss"]
comparables = st.one_of(st.sampled_from(NUMBERS), st.integers(-3, 3), st.sampled_from(WORDS[1:]),
                        st.sampled_from([-1.5, 0.5, 89.99, 1e300, -1e300]))
texts = st.one_of(st.sampled_from(WORDS), st.text(alphabet="aAbé É_%.\\", max_size=2))


def values_in(value) -> list:
    """``value`` and every value inside it."""
    found = [value]
    if isinstance(value, dict):
        for item in value.values():
            found += values_in(item)
    elif isinstance(value, list):
        for item in value:
            found += values_in(item)
    return found


def leaf(paths: list[str], in_element: bool, pool: tuple):
    field = st.sampled_from(paths)
    # Values the documents hold (and pieces of their strings) make conditions that select some rows.
    present = [v for v in pool if v is not None]
    values = st.one_of(st.sampled_from(present), json_values) if present else json_values
    scalars_present = [v for v in present if isinstance(v, str) or isinstance(v, int | float) and not isinstance(v, bool)]
    comparable = st.one_of(st.sampled_from(scalars_present), comparables) if scalars_present else comparables
    strings = [v for v in present if isinstance(v, str)]
    text = st.one_of(texts, st.sampled_from(strings).flatmap(
        lambda v: st.integers(0, len(v)).flatmap(lambda i: st.integers(i, len(v)).map(lambda j: v[i:j])))) \
        if strings else texts

    @st.composite
    def build(draw) -> dict:
        kinds = ["EQ", "NE", "GT", "LT", "GTE", "LTE", "TEXT", "IN", "NOT_IN", "BETWEEN", "ALL_IN", "NULL", "NOT_NULL",
                 "TRUE", "FALSE", "EXISTS", "DATE", "DATE", "ALL"]
        if not in_element:
            kinds += ["ID", "IDS", "AGGREGATE_ID", "AGGREGATE_IDS", "TENANT_ID", "OWNER_ID", "DELETED", "SPACE_ID"]
        kind = draw(st.sampled_from(kinds))
        if kind in ("EQ", "NE"):
            data = {"field": draw(field), "operator": kind, "value": draw(values)}
            if draw(st.booleans()):
                data["options"] = {"ignoreCase": draw(st.booleans())}
            return data
        if kind in ("GT", "LT", "GTE", "LTE"):
            return {"field": draw(field), "operator": kind, "value": draw(comparable)}
        if kind == "TEXT":
            operator = draw(st.sampled_from(["CONTAINS", "STARTS_WITH", "ENDS_WITH"]))
            return {"field": draw(field), "operator": operator, "value": draw(text),
                    "options": {"ignoreCase": draw(st.booleans())}}
        if kind in ("IN", "NOT_IN"):
            return {"field": draw(field), "operator": kind, "value": draw(st.lists(values, max_size=3))}
        if kind == "ALL_IN":
            return {"field": draw(field), "operator": kind, "value": draw(st.lists(values, min_size=1, max_size=3))}
        if kind == "BETWEEN":
            bounds = draw(st.one_of(st.lists(st.sampled_from(NUMBERS + [-1.5, 0.5]), min_size=2, max_size=2),
                                    st.lists(st.sampled_from(WORDS[1:]), min_size=2, max_size=2)))
            return {"field": draw(field), "operator": kind, "value": bounds}
        if kind == "ALL":
            return {"operator": "ALL"}
        if kind in ("NULL", "NOT_NULL", "TRUE", "FALSE"):
            return {"field": draw(field), "operator": kind}
        if kind == "EXISTS":
            return {"field": draw(field), "operator": kind, "value": draw(st.sampled_from([True, False, None]))}
        if kind == "DATE":
            operator = draw(st.sampled_from(sorted(dates.DATE_OPERATORS)))
            options = {"zoneId": draw(st.sampled_from(ZONES))}
            pattern = draw(st.sampled_from(PATTERNS))
            if pattern:
                options["datePattern"] = pattern
            data = {"field": draw(field), "operator": operator, "options": options}
            if operator in dates.DAY_COUNT_OPERATORS:
                data["value"] = draw(st.integers(1, 40))
            elif operator in dates.TIME_OF_DAY_OPERATORS and draw(st.booleans()):  # Wow's time of day
                data["value"] = draw(st.one_of(st.integers(0, dates.SECONDS_PER_DAY - 1),
                                               st.sampled_from(["00:00", "12:30", "23:59:59", "06:00:00.250"])))
            return data
        if kind in ("IDS", "AGGREGATE_IDS"):
            return {"operator": kind, "value": draw(st.lists(st.sampled_from(["s0", "s1", "s2", "a1", "x"]),
                                                             max_size=3))}
        if kind == "DELETED":
            return {"operator": kind, "value": draw(st.sampled_from(["ACTIVE", "DELETED", "ALL"]))}
        return {"operator": kind, "value": draw(st.sampled_from(["s0", "s1", "a1", "t1", "u1", "x"]))}

    return build()


def conditions(paths: list[str], in_element: bool = False, depth: int = 0, pool: tuple = ()):
    leaves = leaf(paths, in_element, pool)
    if depth >= 2:
        return leaves

    @st.composite
    def build(draw) -> dict:
        kind = draw(st.sampled_from(["leaf", "leaf", "leaf", "AND", "OR", "NOR", "ELEM_MATCH"]))
        if kind == "leaf":
            return draw(leaves)
        if kind == "ELEM_MATCH":
            children = draw(st.lists(conditions(ELEMENT_PATHS, True, depth + 1, pool), min_size=1, max_size=2))
            return {"field": draw(st.sampled_from(paths)), "operator": "ELEM_MATCH", "children": children}
        children = draw(st.lists(conditions(paths, in_element, depth + 1, pool), min_size=0 if kind == "AND" else 1,
                                 max_size=3))
        return {"operator": kind, "children": children}

    return build()


@st.composite
def top_level_conditions(draw, paths: list[str], documents: tuple = ()) -> dict:
    pool = tuple(value for document in documents for value in values_in(document))
    condition = draw(conditions(paths, pool=pool))
    if draw(st.integers(0, 5)) == 0:  # MATCH may only stand at the top, or in a top-level AND
        return {"operator": "AND", "children": [{"operator": "MATCH", "value": draw(texts.filter(str.strip))},
                                                condition]}
    return condition


# --- the comparison ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def rows(stores, documents):
    """``documents`` written on every database, rolled back afterwards; queries run as the services run them."""
    with contextlib.ExitStack() as stack:
        for store in stores:
            stack.enter_context(transaction.atomic(using=store.using))
            stack.enter_context(query_settings(store.using))
            for document in documents:
                store.put(document)
        yield
        for store in stores:
            transaction.set_rollback(True, using=store.using)


def orm_ids(store, condition, columns, field_map) -> list[str]:
    q = compile_q(condition, columns=columns, field_map=field_map, now=NOW)
    return sorted(store.queryset("order").filter(q).values_list(columns["_id"].name, flat=True))


def evaluator_ids(documents, condition, field_map) -> list[str]:
    return sorted(doc["_id"] for doc in documents if matches(condition, doc, field_map=field_map, now=NOW))


def sort_is_comparable(documents, sort, field_map) -> bool:
    """Whether the evaluator's order uses only what the ORM sorts by (no two objects or nested arrays tie-broken
    by content)."""
    for item in sort:
        path = map_field(item.field, field_map)
        descending = item.direction is Direction.DESC
        ranks = [_field_sort_key(doc, path, descending)[0] for doc in documents]
        if ranks.count(4) > 1 or ranks.count(5) > 1:
            return False
    return True


def document_nodes(condition):
    """``condition`` and the nodes below it that read the document (ELEM_MATCH children read elements)."""
    yield condition
    if condition.operator in (Operator.AND, Operator.OR, Operator.NOR):
        for child in condition.children:
            yield from document_nodes(child)


def check(stores, documents, condition_data, sort_data, columns, field_map) -> None:
    """The rows every document-level node of the condition selects, and the order of the sort, on each database,
    are the evaluator's."""
    for node in document_nodes(parse_condition(condition_data)):
        check_condition(stores, documents, node, condition_data, columns, field_map)
    check_sort(stores, documents, sort_data, columns, field_map)


def check_condition(stores, documents, condition, condition_data, columns, field_map) -> None:
    expected = evaluator_ids(documents, condition, field_map)
    for store in stores:
        assert orm_ids(store, condition, columns, field_map) == expected, (store.using, condition, condition_data)


def check_sort(stores, documents, sort_data, columns, field_map) -> None:
    sort = parse_list_query({"sort": sort_data}).sort + (SortField(field="_id"),)
    if sort_is_comparable(documents, sort, field_map):
        expected_order = [doc["_id"] for doc in sort_documents(documents, sort, field_map=field_map)]
        order = compile_order_by(sort, columns=columns, field_map=field_map)
        for store in stores:
            found = list(store.queryset("order").order_by(*order).values_list(columns["_id"].name, flat=True))
            assert found == expected_order, (store.using, sort_data)


def sorts(paths: list[str]):
    return st.lists(st.fixed_dictionaries({"field": st.sampled_from(paths),
                                           "direction": st.sampled_from(["ASC", "DESC"])}),
                    max_size=2, unique_by=lambda item: item["field"])


PROFILE = settings(max_examples=120, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large])


@pytest.mark.django_db(databases=DATABASES)
@PROFILE
@given(data=st.data())
def test_snapshot_conditions_and_sorts_match_the_evaluator(data):
    documents = [data.draw(snapshot_documents(i)) for i in range(data.draw(st.integers(2, 6)))]
    cases = data.draw(st.lists(st.tuples(top_level_conditions(SNAPSHOT_PATHS, documents), sorts(SNAPSHOT_PATHS)),
                               min_size=1, max_size=4))
    stores = [snapshot_store(alias) for alias in ALIASES]
    with rows(stores, documents):
        for condition_data, sort_data in cases:
            check(stores, documents, condition_data, sort_data, SNAPSHOT_COLUMNS, SNAPSHOT_MAP)


@pytest.mark.django_db(databases=DATABASES)
@settings(PROFILE, max_examples=60)
@given(data=st.data())
def test_event_stream_conditions_and_sorts_match_the_evaluator(data):
    documents = [data.draw(stream_documents(i)) for i in range(data.draw(st.integers(2, 5)))]
    cases = data.draw(st.lists(st.tuples(top_level_conditions(STREAM_PATHS, documents), sorts(STREAM_PATHS)),
                               min_size=1, max_size=4))
    stores = [event_store(alias) for alias in ALIASES]
    with rows(stores, documents):
        for condition_data, sort_data in cases:
            check(stores, documents, condition_data, sort_data, EVENT_STREAM_COLUMNS, STREAM_MAP)


def test_every_operator_is_generated():
    """The generators above reach every operator but RAW (which SQL refuses); each condition survives the
    round trip through ``condition_data`` (how SQLite hands ELEM_MATCH to the evaluator)."""
    seen: set[str] = set()

    @settings(max_examples=1000, derandomize=True, database=None)
    @given(top_level_conditions(SNAPSHOT_PATHS))
    def collect(data):
        condition = parse_condition(data)
        seen.update(node.operator.value for node in condition.walk())
        assert parse_condition(condition_data(condition)) == condition

    collect()
    # SPACE_ID is resolved by the parser (ALL, or IDS of no id): it reaches the compilers as those.
    assert set(Operator) - {Operator(name) for name in seen} == {Operator.RAW, Operator.SPACE_ID}


# --- hand-picked cases: values the generators rarely combine ---------------------------------------------

HAND_PICKED = [
    {"n": 1, "f": 1.0, "b": True, "s": "1", "z": None},
    {"n": [1, [2, 3]], "f": [[1.0]], "b": [False, None], "s": ["1", "2"], "z": []},
    {"n": {"0": 5, "1": [7]}, "f": {"a": 1.5}, "b": {"b": True}, "s": {"a": "x"}},
    {"n": [{"0": 1}, {"1": 2}, 3], "f": [], "s": "", "z": [[None]]},
    {"n": -1, "f": -1.5, "s": "a\nb", "z": [{"a": None}, {"b": 1}]},
]


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("condition_data", [
    {"field": "state.n", "operator": "EQ", "value": 1},
    {"field": "state.n", "operator": "EQ", "value": [2, 3]},
    {"field": "state.n", "operator": "EQ", "value": {"0": 5, "1": [7]}},
    {"field": "state.n.0", "operator": "EQ", "value": 1},
    {"field": "state.n.0", "operator": "EQ", "value": 5},
    {"field": "state.n.1", "operator": "EXISTS", "value": False},
    {"field": "state.n.1", "operator": "NULL"},
    {"field": "state.n.2", "operator": "EQ", "value": 3},
    {"field": "state.n.99999999999999999999", "operator": "NULL"},
    {"field": "state.f", "operator": "EQ", "value": 1},
    {"field": "state.f", "operator": "EQ", "value": [1]},
    {"field": "state.f", "operator": "GT", "value": -1.5},
    {"field": "state.f.a", "operator": "GTE", "value": 1.5},
    {"field": "state.b", "operator": "EQ", "value": 1},
    {"field": "state.b", "operator": "FALSE"},
    {"field": "state.b", "operator": "NULL"},
    {"field": "state.b.b", "operator": "TRUE"},
    {"field": "state.s", "operator": "EQ", "value": 1},
    {"field": "state.s", "operator": "LT", "value": "2"},
    {"field": "state.s", "operator": "ENDS_WITH", "value": "b"},
    {"field": "state.s", "operator": "STARTS_WITH", "value": ""},
    {"field": "state.s", "operator": "EQ", "value": "A\nB", "options": {"ignoreCase": True}},
    {"field": "state.z", "operator": "NULL"},
    {"field": "state.z", "operator": "EQ", "value": []},
    {"field": "state.z", "operator": "EQ", "value": [None]},
    {"field": "state.z.a", "operator": "NULL"},
    {"field": "state.z.a", "operator": "NOT_NULL"},
    {"field": "state.z", "operator": "ELEM_MATCH", "children": [{"field": "a", "operator": "NULL"}]},
    {"field": "state.z", "operator": "ELEM_MATCH", "children": [{"field": "a", "operator": "EXISTS"}]},
    {"field": "state.n", "operator": "ELEM_MATCH", "children": [{"field": "x", "operator": "NULL"}]},
    {"field": "state.n", "operator": "NOT_IN", "value": [1, -1, None]},
    {"field": "state.n", "operator": "ALL_IN", "value": [3, {"0": 1}]},
    {"field": "version", "operator": "GT", "value": -1.5},
    {"field": "version", "operator": "LTE", "value": 0.5},
    {"field": "version", "operator": "EQ", "value": 1.0},
    {"field": "version", "operator": "EQ", "value": 1.5},
    {"field": "version", "operator": "IN", "value": [True, "1", 1e300]},
    {"field": "deleted", "operator": "EQ", "value": 0},
    {"field": "tenantId", "operator": "GT", "value": "T"},
    {"field": "tenantId", "operator": "CONTAINS", "value": "T", "options": {"ignoreCase": True}},
])
def test_hand_picked_values_match_the_evaluator(condition_data):
    documents = [{"_id": f"h{i}", "contextName": "shop", "aggregateName": "order", "tenantId": "t1" if i % 2 else "T2",
                  "ownerId": "", "version": i - 1, "eventId": "", "firstOperator": "", "operator": "",
                  "firstEventTime": 0, "eventTime": 0, "snapshotTime": 0, "deleted": i == 3, "state": state}
                 for i, state in enumerate(HAND_PICKED)]
    stores = [snapshot_store(alias) for alias in ALIASES]
    with rows(stores, documents):
        check(stores, documents, condition_data, [{"field": "state.n"}], SNAPSHOT_COLUMNS, SNAPSHOT_MAP)


# --- how conditions compile ---------------------------------------------------------------------------------


def test_scalar_columns_compile_to_plain_lookups():
    def q(data, field_map=SNAPSHOT_MAP):
        return compile_q(parse_condition(data), columns=SNAPSHOT_COLUMNS, field_map=field_map, now=NOW)

    assert q({"operator": "TENANT_ID", "value": "t1"}) == Q(tenant_id="t1")
    assert q({"operator": "IDS", "value": ["a", "b"]}) == Q(aggregate_id__in=["a", "b"])
    assert q({"field": "aggregateId", "operator": "EQ", "value": "a"}) == Q(aggregate_id="a")
    assert q({"operator": "DELETED", "value": "ACTIVE"}) == Q(deleted=False)
    assert q({"field": "version", "operator": "GTE", "value": 2}) == Q(version__gte=2)
    assert q({"field": "version", "operator": "IN", "value": [1, 2.0, 2.5, "3", True]}) == Q(version__in=[1, 2])
    assert q({"operator": "NOR", "children": [{"operator": "OWNER_ID", "value": "u"}]}) == ~Q(owner_id="u")
    # Always true, always false.
    assert q({"operator": "ALL"}) == Q()
    assert q({"operator": "OR", "children": [{"operator": "ALL"}, {"operator": "ID", "value": "a"}]}) == Q()
    assert q({"field": "tenantId", "operator": "EQ", "value": 5}) == Q(pk__in=[])
    assert q({"field": "state.x", "operator": "GT", "value": 1}).children[0].__class__ is ConditionExpression


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_client_text_and_paths_are_parameters_never_sql(alias):
    evil = "x'); DROP TABLE wow_query_tests_snapshottable; --"
    data = {"operator": "AND", "children": [
        {"field": "state.evilsegment.sneaky", "operator": "EQ", "value": evil},
        {"field": "state.evilsegment", "operator": "CONTAINS", "value": evil, "options": {"ignoreCase": True}},
        {"field": "state.evilsegment", "operator": "ELEM_MATCH",
         "children": [{"field": "evilchild", "operator": "GT", "value": evil}]},
        {"operator": "MATCH", "value": evil},
        {"field": "tenantId", "operator": "NE", "value": evil},
    ]}
    store = snapshot_store(alias)
    queryset = store.queryset("order").filter(compile_q(parse_condition(data), columns=SNAPSHOT_COLUMNS, now=NOW))
    sql, params = queryset.query.get_compiler(alias).as_sql()
    for text in ("evil", "DROP", "sneaky"):
        assert text not in sql
    assert evil in params and any("evilsegment" in str(param) for param in params)
    assert list(queryset) == []


@pytest.mark.django_db(databases=DATABASES)
def test_postgresql_compares_and_sorts_text_by_code_point_whatever_the_database_collation():
    # This server's C.UTF-8 already orders by code point; en_US.UTF-8 would not ("a" < "B"), hence COLLATE "C".
    store = snapshot_store("wow_pg")
    condition = parse_condition({"operator": "AND", "children": [
        {"field": "state.a", "operator": "GT", "value": "B"}, {"field": "tenantId", "operator": "LT", "value": "B"}]})
    queryset = store.queryset("order").filter(compile_q(condition, columns=SNAPSHOT_COLUMNS)).order_by(
        *compile_order_by([SortField(field="state.a"), SortField(field="ownerId")], columns=SNAPSHOT_COLUMNS))
    sql, _ = queryset.query.get_compiler("wow_pg").as_sql()
    # state.a > "B" (the value, and an element of an array value), tenantId < "B", the sort keys of state.a
    # and ownerId.
    assert sql.count('COLLATE "C"') == 5


def test_other_engines_are_refused():
    expression = ConditionExpression(compile_condition(parse_condition({"field": "state.a", "operator": "NULL"}),
                                                       columns=SNAPSHOT_COLUMNS), SNAPSHOT_COLUMNS)
    compiler = SimpleNamespace(compile=lambda ref: ('"t"."state"', []))
    with pytest.raises(NotSupportedError, match="SQLite and PostgreSQL only, not for mysql"):
        expression.as_sql(compiler, SimpleNamespace(vendor="mysql"))


def test_are_literal_escapes_every_metacharacter():
    assert are_literal("a.b*c+d?e(f)g[h]i{j}k|l^m$n\\o") == "a\\.b\\*c\\+d\\?e\\(f\\)g\\[h\\]i\\{j\\}k\\|l\\^m\\$n\\\\o"
    assert are_literal("é ß%_'") == "é ß%_'"



# --- the services ----------------------------------------------------------------------------------------------


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_raw_is_refused_before_anything_is_read(alias, django_assert_num_queries):
    service = DjangoSnapshotQueryService(snapshot_store(alias), "order")
    raw = parse_condition({"operator": "RAW", "value": {"state.a": 1}}, allow_raw=True)
    with django_assert_num_queries(0, connection=connections[alias]):
        for call in (lambda: service.list(ListQuery(condition=raw)), lambda: service.count(raw)):
            with pytest.raises(QueryValidationError) as info:
                call()
            assert info.value.path == "condition" and "RAW conditions need the Mongo backend" in info.value.rule


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_impossible_conditions_do_not_query(alias, django_assert_num_queries):
    service = DjangoSnapshotQueryService(snapshot_store(alias), "order")
    impossible = parse_condition({"field": "version", "operator": "EQ", "value": "1"})
    with django_assert_num_queries(0, connection=connections[alias]):
        assert service.list(ListQuery(condition=impossible)) == []
        assert service.count(impossible) == 0


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("alias", ALIASES)
def test_event_stream_match_reads_event_bodies(alias):
    store = event_store(alias)
    document = {"_id": "s1", "contextName": "shop", "aggregateName": "order", "aggregateId": "a1", "tenantId": "t1",
                "ownerId": "", "requestId": "r1", "commandId": "c1", "version": 1, "header": {"trace": "Ünïcode"},
                "body": [{"id": "e1", "name": "paid", "revision": "1", "bodyType": "x.Paid",
                          "body": {"note": ["Gift wrap"]}}], "size": 1, "createTime": 5}
    service = DjangoEventStreamQueryService(store, "order")
    with rows([store], [document]):
        for text, found in [("GIFT", 1), ("ünïcode", 1), ("paid", 1), ("x", 1), ("wrap gifts", 1), ("gifts", 0)]:
            assert service.count(parse_count_query({"operator": "MATCH", "value": text})) == found, text
        listed = service.list(parse_list_query({"condition": {"field": "body.body.note", "operator": "EQ",
                                                              "value": "Gift wrap"},
                                                "projection": {"include": ["body.name"]}}))
        assert listed == [{"id": "s1", "body": [{"name": "paid"}]}]


class FailingQuerySet:
    """Stands for a queryset whose database is gone."""

    def __init__(self, error):
        self.error = error

    def filter(self, *args, **kwargs):
        return self

    order_by = values_list = filter

    def __getitem__(self, item):
        return self

    def __iter__(self):
        raise self.error

    def count(self):
        raise self.error


def test_queries_the_engine_finds_too_complex_are_bad_queries():
    store = SimpleNamespace(using="default", queryset=lambda name: FailingQuerySet(OperationalError(
        "parser stack overflow")))
    with pytest.raises(QueryValidationError, match="cannot run a query this complex"):
        DjangoSnapshotQueryService(store, "order").list(ListQuery())


def test_a_query_stopped_by_the_statement_timeout_is_too_expensive_not_transient():
    store = SimpleNamespace(using="default", queryset=lambda name: FailingQuerySet(OperationalError(
        "canceling statement due to statement timeout")))
    service = DjangoSnapshotQueryService(store, "order")
    with pytest.raises(QueryTooExpensive, match=r"DATABASE_QUERY_TIMEOUT_MS.*narrow the condition") as raised:
        service.list(ListQuery())
    assert raised.value.error_code == "QueryTooExpensive"
    with pytest.raises(QueryTooExpensive):
        service.count(parse_count_query({}))


@pytest.mark.parametrize("error", [OperationalError("server closed the connection unexpectedly"),
                                   OperationalError("could not serialize access due to concurrent update")])
def test_database_failures_are_recoverable(error):
    store = SimpleNamespace(using="default", queryset=lambda name: FailingQuerySet(error))
    service = DjangoSnapshotQueryService(store, "order")
    with pytest.raises(RecoverableStoreError, match="querying order snapshots failed transiently"):
        service.list(ListQuery())
    with pytest.raises(RecoverableStoreError, match="retry"):
        service.count(parse_count_query({}))


@pytest.mark.django_db(databases=DATABASES)
def test_postgresql_runs_without_jit_and_with_the_stores_statement_timeout():
    connection = connections["wow_pg"]

    def current() -> tuple[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('jit'), current_setting('statement_timeout')")
            return cursor.fetchone()

    before = current()
    service = DjangoSnapshotQueryService(snapshot_store("wow_pg", max_time_ms=1234), "order")
    with service._postgres_settings():
        assert current() == ("off", "1234ms")
    assert current() == before
    with DjangoSnapshotQueryService(snapshot_store("wow_pg"), "order")._postgres_settings():
        assert current() == ("off", before[1])
    assert service.count(parse_count_query({})) == 0
    assert current() == before
    # SQLite has neither: the store's limit is ignored there.
    with DjangoSnapshotQueryService(snapshot_store("wow_sqlite", max_time_ms=5), "order")._postgres_settings():
        pass


# --- the deepest conditions the parser lets through ---------------------------------------------------------

DEEP_LEAVES = [
    {"field": "a.b.c", "operator": "NE", "value": [1, {"a": [2]}]},
    {"field": "a.0.b", "operator": "NOT_IN", "value": [1, None, {"x": 1}]},
    {"field": "b", "operator": "CONTAINS", "value": "x", "options": {"ignoreCase": True}},
    {"field": "c.d", "operator": "EXISTS", "value": False},
    {"field": "c", "operator": "THIS_WEEK", "options": {"zoneId": "Asia/Shanghai", "datePattern": "yyyy-MM-dd"}},
]


def deepest(kind: str, depth: int = 16) -> dict:
    """A condition ``depth`` levels deep: nested ELEM_MATCH, or alternating AND/OR/NOR, with leaves at each level."""
    node = DEEP_LEAVES[0]
    for level in range(depth - (3 if kind == "elem" else 2)):
        siblings = [dict(leaf) for leaf in DEEP_LEAVES[1:]]
        if kind == "elem":
            node = {"field": "a", "operator": "ELEM_MATCH", "children": [node, *siblings]}
        else:
            for sibling in siblings:
                sibling["field"] = "state." + sibling["field"]
            if level == 0:
                node = {**node, "field": "state." + node["field"]}
            node = {"operator": ("AND", "OR", "NOR")[level % 3], "children": [node, *siblings]}
    if kind == "elem":
        return {"operator": "AND", "children": [{"field": "state.a", "operator": "ELEM_MATCH", "children": [node]}]}
    return {"operator": "AND", "children": [node, {"operator": "MATCH", "value": "x"}]}


@pytest.mark.django_db(databases=DATABASES)
@pytest.mark.parametrize("kind", ["elem", "logic"])
def test_the_deepest_conditions_run_on_both_engines(kind):
    nested_state: dict = {"b": "X", "c": "2024-04-02"}
    for _ in range(15):
        nested_state = {"a": [nested_state, {"b": "y"}], "b": "xx", "c": {"d": 1}}
    documents = [{"_id": f"d{i}", "contextName": "shop", "aggregateName": "order", "tenantId": "t1", "ownerId": "",
                  "version": 1, "eventId": "", "firstOperator": "", "operator": "", "firstEventTime": 0,
                  "eventTime": 0, "snapshotTime": 0, "deleted": False, "state": state}
                 for i, state in enumerate([nested_state, {}, {"a": [{"a": []}], "b": "x"}])]
    data = deepest(kind)
    parse_condition(data)  # within the default QUERY_MAX_DEPTH
    with pytest.raises(QueryValidationError, match="nested deeper than 16"):
        parse_condition(deepest(kind, 17))
    stores = [snapshot_store(alias) for alias in ALIASES]
    with rows(stores, documents):
        check(stores, documents, data, [{"field": "state.a.a.b"}], SNAPSHOT_COLUMNS, SNAPSHOT_MAP)


# --- resource limits -----------------------------------------------------------------------------------------


def test_field_paths_longer_than_documents_nest_are_refused():
    long = "state." + ".".join(["a"] * 100)
    with pytest.raises(QueryValidationError) as info:
        compile_q(parse_condition({"operator": "AND", "children": [{"field": long, "operator": "NULL"}]}),
                  columns=SNAPSHOT_COLUMNS)
    assert info.value.path == "condition.children[0].field"
    assert "at most 100 segments" in info.value.rule and "got 101" in info.value.rule
    with pytest.raises(QueryValidationError) as info:
        compile_order_by([SortField(field="id"), SortField(field=long)], columns=SNAPSHOT_COLUMNS)
    assert info.value.path == "sort[1].field"
    compile_q(parse_condition({"field": "state." + ".".join(["a"] * 99), "operator": "NULL"}), columns=SNAPSHOT_COLUMNS)


def test_queries_too_large_for_sql_are_refused_before_anything_runs():
    numeric = "state." + ".".join(["a", "0"] * 20)  # a MISSING check walks every prefix of it
    data = {"operator": "OR", "children": [{"field": numeric, "operator": "NULL"}] * 5}
    with pytest.raises(QueryValidationError, match=r"condition is too large for an SQL database: size \d+, at most 8000"):
        compile_q(parse_condition(data), columns=SNAPSHOT_COLUMNS)
    with pytest.raises(QueryValidationError, match="too large"):  # values count too
        compile_q(parse_condition({"operator": "OR", "children": [
            {"field": "state.a", "operator": "IN", "value": list(range(1000))}] * 9}), columns=SNAPSHOT_COLUMNS)
    sort = [SortField(field="state." + ".".join(["a", "0"] * 10) + f".x{i}") for i in range(4)]
    with pytest.raises(QueryValidationError) as info:
        compile_order_by(sort, columns=SNAPSHOT_COLUMNS)
    assert info.value.path == "sort" and "sort is too large" in info.value.rule


@pytest.mark.django_db(databases=DATABASES)
def test_the_largest_queries_allowed_run_on_both_engines():
    numeric = "state." + ".".join(["a", "0"] * 11)
    documents = [{"_id": f"d{i}", "contextName": "shop", "aggregateName": "order", "tenantId": "t1", "ownerId": "",
                  "version": 1, "eventId": "", "firstOperator": "", "operator": "", "firstEventTime": 0,
                  "eventTime": 0, "snapshotTime": 0, "deleted": False, "state": state}
                 for i, state in enumerate([{"a": [{"a": [{"a": None}]}]}, {"a": [{"a": 1}]}, {}])]
    data = {"operator": "OR", "children": [{"field": numeric, "operator": "NULL"},
                                           {"field": numeric, "operator": "IN", "value": [None, 1, "x"]},
                                           {"field": "state." + ".".join(["a"] * 99), "operator": "NULL"}]}
    size = query_size(compile_condition(parse_condition(data), columns=SNAPSHOT_COLUMNS))
    assert 7000 < size <= 8000
    stores = [snapshot_store(alias) for alias in ALIASES]
    with rows(stores, documents):
        check(stores, documents, data, [{"field": "state." + ".".join(["a"] * 99)}], SNAPSHOT_COLUMNS, SNAPSHOT_MAP)


@pytest.mark.django_db(databases=DATABASES)
def test_the_runtimes_query_services_carry_the_timeout_setting_and_postgresql_enforces_it():
    from wow_django.application.runtime import get_runtime

    with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django", "DATABASE_ALIAS": "wow_pg",
                                "DATABASE_QUERY_TIMEOUT_MS": 1}):
        runtime = get_runtime()
        service = runtime.backend("SNAPSHOT_STORE").snapshot_queries(runtime.snapshot_store, "order")
        events = runtime.backend("EVENT_STORE").event_queries(runtime.event_store, "order")
        assert service.max_time_ms == 1 and events.max_time_ms == 1
        with connections["wow_pg"].cursor() as cursor:  # a statement that outlives 1 ms is cancelled
            with pytest.raises(QueryTooExpensive, match=r"longer than 1 ms"), service._reading():
                cursor.execute("SELECT pg_sleep(0.05)")
    with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django", "DATABASE_ALIAS": "wow_pg"}):
        runtime = get_runtime()
        assert runtime.backend("SNAPSHOT_STORE").snapshot_queries(runtime.snapshot_store, "order").max_time_ms == 10_000

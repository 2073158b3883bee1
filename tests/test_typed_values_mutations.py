"""Typed values, pinned where a mutation pass found them unpinned (see tests/test_typed_values.py).

Pure functions: :mod:`wow_django.domain.values` (stored, canonical_time, parse_time, exact JSON),
:mod:`wow_django.query.typed` (conditions brought to the stored type), the Mongo codec and the
embedded engine's record of the collections that hold ``Decimal128``.
"""

from __future__ import annotations

import enum
import json
import time
import typing
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from bson import Decimal128
from pydantic import BaseModel, ConfigDict, Field

from wow_django.backends.django.models import CanonicalJSONEncoder, ExactJSONDecoder
from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.codec import from_bson, holds_decimal, to_bson
from wow_django.domain.values import ExactJSONEncoder, canonical_time, dumps, loads, parse_time, stored
from wow_django.query.condition import Condition, Operator, parse_condition
from wow_django.query.errors import QueryValidationError
from wow_django.query.typed import (
    ValueType,
    annotation_type,
    event_stream_resolver,
    model_type,
    snapshot_resolver,
    type_condition,
)

Op = Operator

# --- canonical time ------------------------------------------------------------------------------------------


def test_canonical_time_is_utc_with_six_digits_of_microseconds():
    assert canonical_time(datetime(2026, 1, 1, 8, 0, 0, 5, tzinfo=timezone(timedelta(hours=8)))) == \
        "2026-01-01T00:00:00.000005Z"
    assert canonical_time(datetime(2026, 1, 1, 0, 0, 0, 120000, tzinfo=timezone(timedelta(hours=-5)))) == \
        "2026-01-01T05:00:00.120000Z"


def test_a_naive_datetime_is_utc_whatever_the_machine_s_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    try:
        assert canonical_time(datetime(2026, 1, 1, 9, 30)) == "2026-01-01T09:30:00.000000Z"
        assert parse_time("2026-01-01T09:30:00") == "2026-01-01T09:30:00.000000Z"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(("value", "expected"), [
    (" 2026-01-01T10:00:00+08:00 ", "2026-01-01T02:00:00.000000Z"),  # spaces around it
    ("2026-01-01", "2026-01-01T00:00:00.000000Z"),  # a date: its midnight, UTC
    (1767232800000, "2026-01-01T02:00:00.000000Z"),  # epoch milliseconds
    (1767232800000.5, "2026-01-01T02:00:00.000500Z"),
    (Decimal("1767232800001"), "2026-01-01T02:00:00.001000Z"),
    (datetime(2026, 1, 1, 10, tzinfo=timezone(timedelta(hours=8))), "2026-01-01T02:00:00.000000Z"),
])
def test_parse_time_takes_text_epoch_milliseconds_and_datetimes(value, expected):
    assert parse_time(value) == expected


@pytest.mark.parametrize(("value", "message"), [
    (True, "expected a time"),
    (float("inf"), "non-finite"),
    (float("nan"), "non-finite"),
    (Decimal("Infinity"), "non-finite"),
    (10**20, "out of the range of dates"),
    ("soon", "is not an ISO-8601 time"),
    ([2026], "got list"),
])
def test_parse_time_refuses_what_is_no_time_saying_why(value, message):
    with pytest.raises(ValueError, match=message):
        parse_time(value)


# --- stored ----------------------------------------------------------------------------------------------


class Colour(str, enum.Enum):  # noqa: UP042 - str() of it is "Colour.RED", not its value
    RED = "red"


class Sku(str):
    pass


class Line(BaseModel):
    price: Decimal


class Everything(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    amount: Decimal = Decimal("1.50")
    nan: Decimal = Decimal("NaN")
    infinite: Decimal = Decimal("-Infinity")
    ratio: float = float("nan")
    colour: Colour = Colour.RED
    by_colour: dict[Colour, int] = {Colour.RED: 1}
    by_flag: dict[bool, int] = {True: 1}
    by_number: dict[int, Decimal] = {2: Decimal("2.0")}
    sku: Sku = Sku("A-1")
    lines: list[Line] = [Line(price=Decimal("0.10"))]
    at: datetime = datetime(2026, 1, 1, 10, tzinfo=timezone(timedelta(hours=8)))
    moments: tuple[datetime, ...] = (datetime(2026, 1, 1),)


def test_stored_keeps_decimals_and_makes_the_rest_json():
    document = stored(Everything())
    assert document == {
        "amount": Decimal("1.50"), "nan": "NaN", "infinite": "-Infinity", "ratio": None, "colour": "red",
        "by_colour": {"red": 1}, "by_flag": {"true": 1}, "by_number": {"2": Decimal("2.0")}, "sku": "A-1",
        "lines": [{"price": Decimal("0.10")}], "at": "2026-01-01T02:00:00.000000Z",
        "moments": ["2026-01-01T00:00:00.000000Z"],
    }
    assert str(document["amount"]) == "1.50"
    assert type(document["sku"]) is str and type(document["colour"]) is str


# --- exact JSON ------------------------------------------------------------------------------------------


def test_dumps_writes_each_decimal_s_exact_digits():
    assert dumps({"a": Decimal("0.1000000000000000000000001"), "b": [Decimal("1.50"), 2, "x"]}) == \
        '{"a":0.1000000000000000000000001,"b":[1.50,2,"x"]}'
    assert loads(dumps([Decimal("1E+5"), Decimal("-0.00")])) == [Decimal("1E+5"), Decimal("-0.00")]


def test_dumps_with_a_decimal_sorts_keys_and_escapes_as_told():
    value = {"b": Decimal("1"), "é": 1, "a": {"d": 1, "c": Decimal("2")}}
    assert dumps(value, sort_keys=True) == '{"a":{"c":2,"d":1},"b":1,"\\u00e9":1}'
    assert dumps(value, ensure_ascii=False) == '{"b":1,"é":1,"a":{"d":1,"c":2}}'


def test_dumps_with_a_decimal_writes_other_keys_as_json_does():
    value = {True: Decimal("1"), 2.5: 2, None: 3, 7: 4}
    assert dumps(value) == json.dumps({True: 1, 2.5: 2, None: 3, 7: 4}, separators=(",", ":"))


def test_dumps_uses_default_for_other_objects_with_and_without_decimals():
    class Point:
        def __init__(self, x):
            self.x = x

    def default(item):
        if isinstance(item, Point):
            return {"x": item.x}
        raise TypeError(type(item).__name__)

    assert dumps({"p": Point(1)}, default=default) == '{"p":{"x":1}}'
    assert dumps({"p": Point(Decimal("1.5")), "q": Decimal("2")}, default=default) == '{"p":{"x":1.5},"q":2}'
    with pytest.raises(TypeError):
        dumps({"p": Point(1), "q": Decimal("2")})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("NaN"), Decimal("Infinity"),
                                   [Decimal(1), float("nan")], [Decimal(1), Decimal("-Infinity")]])
def test_dumps_refuses_nan_and_infinities(value):
    with pytest.raises(ValueError):
        dumps(value)


def test_loads_reads_fractions_and_exponents_as_decimals():
    assert loads('{"a": 1.10, "b": 1e2, "c": 3}') == {"a": Decimal("1.10"), "b": Decimal("1E+2"), "c": 3}
    assert isinstance(loads("[0.1]")[0], Decimal)


def test_the_exact_encoder_takes_a_subclass_s_default():
    class Encoder(ExactJSONEncoder):
        def default(self, o):
            return sorted(o) if isinstance(o, set) else super().default(o)

    assert json.dumps({"s": {2, 1}, "d": Decimal("1.0")}, cls=Encoder) == '{"s":[1,2],"d":1.0}'


def test_the_django_columns_write_canonical_exact_json_and_read_decimals():
    text = json.dumps({"b": Decimal("1.50"), "a": [Decimal("0.1000000000000000000000001")]}, cls=CanonicalJSONEncoder)
    assert text == '{"a":[0.1000000000000000000000001],"b":1.50}'
    assert json.loads(text, cls=ExactJSONDecoder) == {"a": [Decimal("0.1000000000000000000000001")],
                                                      "b": Decimal("1.50")}


# --- typing conditions -----------------------------------------------------------------------------------


class Payment(BaseModel):
    amount: Decimal
    at: datetime


class Ledger(BaseModel):
    total: Decimal = Decimal(0)
    limit: typing.Annotated[Decimal, Field(ge=0)] | None = None
    due: datetime | None = None
    payments: list[Payment] = []
    rates: dict[str, Decimal] = {}
    history: list[datetime] = []
    either: Decimal | datetime | None = None
    note: str = ""


class Placed(BaseModel):
    amount: Decimal
    at: datetime


class Noted(BaseModel):
    amount: str


RESOLVE = snapshot_resolver(Ledger)


def typed(condition: dict, now: datetime | None = None) -> Condition:
    return type_condition(parse_condition(condition), RESOLVE, now=now)


@pytest.mark.parametrize(("path", "expected"), [
    ("total", ValueType.DECIMAL), ("limit", ValueType.DECIMAL), ("due", ValueType.TIME),
    ("payments.amount", ValueType.DECIMAL), ("payments.0.amount", ValueType.DECIMAL),
    ("payments.at", ValueType.TIME), ("rates.eur", ValueType.DECIMAL), ("history", ValueType.TIME),
    ("history.3", ValueType.TIME), ("either", None), ("note", None), ("payments", None), ("unknown", None),
    ("rates", None),
])
def test_the_type_of_a_path_is_read_from_the_model(path, expected):
    assert model_type(Ledger, tuple(path.split("."))) is expected


def test_only_state_paths_of_a_snapshot_and_body_paths_of_an_event_are_typed():
    assert RESOLVE("state.total") is ValueType.DECIMAL
    assert RESOLVE("total") is None and RESOLVE("header.total") is None and RESOLVE("state") is None
    resolve = event_stream_resolver([Placed, Noted])
    assert resolve("body.body.at") is ValueType.TIME
    assert resolve("body.body.amount") is None  # a Decimal in one event, text in another
    assert resolve("body.header.at") is None and resolve("header.body.at") is None
    assert event_stream_resolver([Placed])("body.body.amount") is ValueType.DECIMAL
    assert annotation_type(typing.Optional[Decimal], ()) is ValueType.DECIMAL  # noqa: UP045


@pytest.mark.parametrize(("value", "expected"), [
    (9.99, Decimal("9.99")), (0.1, Decimal("0.1")), (50, Decimal(50)), (" 50.00 ", Decimal("50.00")),
    ("1e3", Decimal("1E+3")),
])
def test_a_number_for_a_decimal_field_becomes_the_decimal_it_was_written_as(value, expected):
    condition = typed({"field": "state.total", "operator": "EQ", "value": value})
    assert condition.value == expected and isinstance(condition.value, Decimal)
    assert str(condition.value) == str(expected)


@pytest.mark.parametrize(("value", "message"), [
    (True, "not True"), ("Infinity", "finite"), ("NaN", "finite"), ("lots", "'lots' is not a number"),
    ({"a": 1}, "a number or numeric text"), ([1], "a number or numeric text"),
])
def test_a_value_that_is_no_finite_number_is_refused_for_a_decimal_field(value, message):
    with pytest.raises(QueryValidationError, match=message):
        typed({"field": "state.total", "operator": "EQ", "value": value})
    with pytest.raises(QueryValidationError, match=message):
        typed({"field": "state.total", "operator": "IN", "value": [1, value]})


@pytest.mark.parametrize("operator", ["EQ", "NE", "GT", "GTE", "LT", "LTE"])
def test_every_comparison_is_typed(operator):
    assert typed({"field": "state.total", "operator": operator, "value": "1.5"}).value == Decimal("1.5")
    assert typed({"field": "state.due", "operator": operator, "value": 0}).value == "1970-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("operator", ["IN", "NOT_IN", "ALL_IN", "BETWEEN"])
def test_every_list_operator_is_typed(operator):
    condition = typed({"field": "state.total", "operator": operator, "value": ["1.5", "2"]})
    assert condition.value == (Decimal("1.5"), Decimal(2)) and all(isinstance(v, Decimal) for v in condition.value)
    condition = typed({"field": "state.history", "operator": operator,
                       "value": ["2026-01-01T08:00:00+08:00", "2026-01-02"]})
    assert condition.value == ("2026-01-01T00:00:00.000000Z", "2026-01-02T00:00:00.000000Z")


def test_null_values_are_left_alone():
    assert typed({"field": "state.total", "operator": "EQ", "value": None}).value is None
    assert typed({"field": "state.due", "operator": "IN", "value": [None, 0]}).value == (
        None, "1970-01-01T00:00:00.000000Z")


def test_conditions_under_and_or_nor_and_elem_match_are_typed():
    condition = typed({"operator": "OR", "children": [
        {"operator": "AND", "children": [{"field": "state.total", "operator": "GT", "value": "1"}]},
        {"operator": "NOR", "children": [{"field": "state.due", "operator": "LT", "value": 0}]},
        {"field": "state.payments", "operator": "ELEM_MATCH", "children": [
            {"field": "amount", "operator": "GT", "value": "2.5"},
            {"field": "total", "operator": "GT", "value": "3"},  # payments.total: no such field, untyped
        ]},
    ]})
    (and_, nor, elem) = condition.children
    assert and_.children[0].value == Decimal(1)
    assert nor.children[0].value == "1970-01-01T00:00:00.000000Z"
    assert [child.value for child in elem.children] == [Decimal("2.5"), "3"]


def test_a_datetime_given_from_python_is_canonical_text_on_any_field():
    moment = datetime(2026, 1, 1, 10, tzinfo=timezone(timedelta(hours=8)))
    condition = type_condition(Condition(operator=Op.EQ, field="state.note", value=moment), RESOLVE)
    assert condition.value == "2026-01-01T02:00:00.000000Z"
    condition = type_condition(Condition(operator=Op.IN, field="anything", value=(moment, 1)), None)
    assert condition.value == ("2026-01-01T02:00:00.000000Z", 1)


NOW = datetime(2026, 3, 10, 20, 0, tzinfo=UTC)  # 2026-03-11 04:00 in Shanghai


def bounds(condition: Condition) -> list[tuple[str, str]]:
    nodes = condition.children if condition.operator is Op.AND else (condition,)
    return [(node.operator.value, node.value) for node in nodes]


def test_date_operators_on_a_time_field_become_half_open_bounds_in_the_condition_s_zone():
    today = typed({"field": "state.due", "operator": "TODAY", "options": {"zoneId": "Asia/Shanghai"}}, NOW)
    assert bounds(today) == [("GTE", "2026-03-10T16:00:00.000000Z"), ("LT", "2026-03-11T16:00:00.000000Z")]
    earlier = typed({"field": "state.due", "operator": "EARLIER_DAYS", "value": 2}, NOW)
    assert bounds(earlier) == [("LT", "2026-03-09T00:00:00.000000Z")]
    recent = typed({"field": "state.history", "operator": "RECENT_DAYS", "value": 2}, NOW)
    assert bounds(recent) == [("GTE", "2026-03-09T00:00:00.000000Z"), ("LT", "2026-03-11T00:00:00.000000Z")]
    untyped = typed({"field": "state.note", "operator": "TODAY"}, NOW)
    assert untyped.operator is Op.TODAY  # a field of another type keeps its date operator


# --- MongoDB --------------------------------------------------------------------------------------------------


def test_to_bson_makes_every_decimal_a_decimal128_and_copies_only_what_it_changes():
    plain = {"a": [1, {"b": "x"}], "c": 2.5}
    assert to_bson(plain) is plain
    converted = to_bson({"a": [Decimal("1.50"), {"b": (Decimal("2"),)}], "c": 1})
    assert converted == {"a": [Decimal128("1.50"), {"b": [Decimal128("2")]}], "c": 1}
    assert isinstance(to_bson(Decimal("0.1")), Decimal128)


def test_a_decimal_that_decimal128_cannot_hold_exactly_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"the Decimal 1\.2345678901234567890123456789012345 cannot be stored"):
        to_bson({"a": [Decimal("1.2345678901234567890123456789012345")]})
    with pytest.raises(ValueError, match="cannot be stored on MongoDB exactly"):
        to_bson(Decimal("1E+7000"))


def test_from_bson_reads_every_decimal128_back_as_a_decimal():
    document = {"a": Decimal128("1.50"), "b": [Decimal128("2"), {"c": [Decimal128("0.1")]}], "d": "x"}
    assert from_bson(document) == {"a": Decimal("1.50"), "b": [Decimal("2"), {"c": [Decimal("0.1")]}], "d": "x"}
    assert isinstance(document["b"][1]["c"][0], Decimal)
    assert from_bson([Decimal128("3")]) == [Decimal("3")] and from_bson(Decimal128("4")) == Decimal("4")


def test_holds_decimal_looks_everywhere():
    assert holds_decimal({"a": [{"b": (1, Decimal("1"))}]})
    assert holds_decimal([Decimal("1")]) and holds_decimal({"a": {"b": Decimal("1")}})
    assert not holds_decimal({"a": [1.5, "1.5", {"b": None}]})


def test_the_embedded_engine_remembers_which_collection_of_which_database_holds_decimal128():
    connection = MongoConnection("mongomock://localhost/one")
    try:
        first = connection.database("one")["orders"]
        same_name = connection.database("two")["orders"]
        assert not connection.holds_decimals(first)
        connection.note_decimals(first)
        assert connection.holds_decimals(first) and not connection.holds_decimals(same_name)
        assert not connection.holds_decimals(connection.database("one")["other"])
    finally:
        connection.close()


@pytest.mark.parametrize("value", [Decimal("NaN"), [Decimal("Infinity")], {"a": [Decimal("-Infinity")]}])
def test_a_condition_from_python_refuses_non_finite_decimals(value):
    with pytest.raises(QueryValidationError, match="numbers must be finite"):
        parse_condition({"field": "x", "operator": "EQ", "value": value})


# --- the django backend's rows ------------------------------------------------------------------------------


def test_rows_whose_connection_hands_some_json_decoded_still_read_fractions_as_decimals():
    from wow_django.backends.django.event_store import decode_json_columns

    row = (None,) * 7
    assert decode_json_columns([(*row, '{"a": 1.50}', '{"b": [0.1]}')]) == [{"a": Decimal("1.50")}, {"b": [Decimal("0.1")]}]
    decoded = decode_json_columns([(*row, {"a": 1}, b'{"b": 0.10}')])
    assert decoded == [{"a": 1}, {"b": Decimal("0.10")}] and str(decoded[1]["b"]) == "0.10"

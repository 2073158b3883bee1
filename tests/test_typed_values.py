"""Stored values keep their types (DESIGN "Architecture"): Decimals compare as numbers, times in time order.

On every backend: in memory, MongoDB (mongomock://; a real server with WOW_TEST_MONGO_URI), the django
backend on SQLite and on PostgreSQL. Through the Python API (stores, query services) and over HTTP.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from tests.support import fresh_wow
from wow_django.application.runtime import get_runtime
from wow_django.backends.mongo.client import disconnect
from wow_django.domain import Aggregate, Command, Event, State, creates, handles, sourcing
from wow_django.persistence.records import AggregateId
from wow_django.query.condition import ListQuery, parse_condition, parse_sort
from wow_django.query.errors import QueryValidationError
from wow_django.testing import isolated_registry
from wow_django.testing.mongo import REAL_MONGO_REASON, real_mongo_uri


def headers(tenant: str) -> dict:
    return {"HTTP_COMMAND_TENANT_ID": tenant}


ON_SQLITE = pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
ON_POSTGRES = pytest.mark.django_db(databases=["default", "wow_pg"], transaction=True)
REAL_MONGO = pytest.mark.skipif(not real_mongo_uri(), reason=REAL_MONGO_REASON)


def _on(param: str):
    """The WOW settings of one backend, in force while the generator runs (real MongoDB: dropped after)."""
    if param.startswith("django"):
        settings = fresh_wow("django", DATABASE_ALIAS="wow_" + param.split("_")[1])
    elif param == "real_mongo":
        settings = fresh_wow("mongo", MONGO_URI=f"{real_mongo_uri().rstrip('/')}/wow_typed_{uuid.uuid4().hex[:8]}")
    else:
        settings = fresh_wow(param)
    with override_settings(WOW=settings):
        yield param
        if param == "real_mongo":
            store = get_runtime().event_store
            store.database.client.drop_database(store.database.name)
    disconnect(settings["MONGO_URI"])


@pytest.fixture(params=["in_memory", "mongo", pytest.param("real_mongo", marks=REAL_MONGO),
                        pytest.param("django_sqlite", marks=ON_SQLITE), pytest.param("django_pg", marks=ON_POSTGRES)])
def backend(request):
    yield from _on(request.param)


@pytest.fixture(params=["mongo", pytest.param("real_mongo", marks=REAL_MONGO)])
def mongo_backend(request):
    """The MongoDB backends only: the embedded engine and, with WOW_TEST_MONGO_URI, a real server."""
    yield from _on(request.param)


TOTALS = ["9.99", "250.5", "100.00", "50", "49.99"]  # stored as 9.99, 250.50, 100.00, 50.00, 49.99: as text,
# '9.99' > '50.00' > '49.99' > '250.50' > '100.00'


def place_orders(totals=TOTALS, tenant="t1") -> list[str]:
    from sample_project.orders.aggregates import OrderLine, PlaceOrder

    gateway = get_runtime().gateway
    ids = []
    for total in totals:
        result = gateway.send(PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A-1", quantity=1,
                                                                             unit_price=Decimal(total))]),
                              tenant_id=tenant, wait="SNAPSHOT")
        assert result.succeeded, result
        ids.append(result.aggregate_id)
    return ids


def query(aggregate: str, condition: dict, sort=None, tenant="t1", kind="snapshot") -> list[dict]:
    runtime = get_runtime()
    service = runtime.snapshot_queries(aggregate) if kind == "snapshot" else runtime.event_queries(aggregate)
    built = ListQuery(condition=parse_condition(condition), sort=parse_sort(sort or []), limit=100)
    return service.list(built, tenant_id=tenant)


def totals(documents) -> list[Decimal]:
    return [doc["state"]["total_amount"] for doc in documents]


def test_decimals_are_stored_as_numbers_and_read_back_exactly(backend):
    order_id = place_orders(["100.00"])[0]
    runtime = get_runtime()
    key = AggregateId("order", order_id, "order-service", "t1")
    snapshot = runtime.snapshot_store.load(key)
    amount = snapshot.state["total_amount"]
    assert isinstance(amount, Decimal) and str(amount) == "100.00"  # the scale too, not a float's 100.0
    body = runtime.event_store.load(key)[0].body[0].body
    assert isinstance(body["total_amount"], Decimal) and str(body["total_amount"]) == "100.00"
    loaded = runtime.gateway.repository.load(_order(), order_id, tenant_id="t1")
    assert loaded.state.total_amount == Decimal("100.00") and isinstance(loaded.state.total_amount, Decimal)
    # The document a query returns holds the Decimal too (Python read API).
    assert totals(query("order", {"field": "aggregateId", "operator": "EQ", "value": order_id})) == [Decimal("100.00")]


def _order():
    from sample_project.orders.aggregates import Order

    return Order


@pytest.mark.parametrize("value", [50, 50.0, "50", "50.00", Decimal("50")])
def test_a_decimal_field_compares_numerically_whatever_the_number_is_written_as(backend, value):
    place_orders()
    found = query("order", {"field": "state.total_amount", "operator": "GT", "value": value},
                  sort=[{"field": "state.total_amount", "direction": "ASC"}])
    assert [str(t) for t in totals(found)] == ["100.00", "250.50"]


def test_decimal_fields_sort_numerically_and_take_every_comparison(backend):
    place_orders()
    descending = query("order", {"operator": "ALL"}, sort=[{"field": "state.total_amount", "direction": "DESC"}])
    assert [str(t) for t in totals(descending)] == ["250.50", "100.00", "50.00", "49.99", "9.99"]
    cases = [
        ("BETWEEN", ["10", "100"], ["49.99", "50.00", "100.00"]),
        ("LTE", "50.0", ["9.99", "49.99", "50.00"]),
        ("EQ", "100", ["100.00"]),
        ("NE", 100, ["9.99", "49.99", "50.00", "250.50"]),
        ("IN", ["9.99", 250.5], ["9.99", "250.50"]),
        ("NOT_IN", ["9.99", "250.5"], ["49.99", "50.00", "100.00"]),
    ]
    for operator, value, expected in cases:
        found = query("order", {"field": "state.total_amount", "operator": operator, "value": value},
                      sort=[{"field": "state.total_amount", "direction": "ASC"}])
        assert [str(t) for t in totals(found)] == expected, (operator, value)


def test_event_bodies_are_typed_for_event_stream_queries(backend):
    place_orders()
    found = query("order", {"field": "body.body.total_amount", "operator": "GTE", "value": "100"},
                  kind="event_stream")
    assert sorted(doc["body"][0]["body"]["total_amount"] for doc in found) == [Decimal("100.00"), Decimal("250.5")]


def test_a_value_that_is_no_number_for_a_decimal_field_is_refused_naming_the_field(backend):
    with pytest.raises(QueryValidationError, match=r"state\.total_amount holds a Decimal: 'lots' is not a number"):
        query("order", {"field": "state.total_amount", "operator": "GT", "value": "lots"})


LONG = "1." + "2" * 34  # 35 significant digits: more than MongoDB's Decimal128 holds


@pytest.mark.parametrize("operator, value", [("GT", LONG), ("BETWEEN", ["1", LONG]), ("IN", ["1", LONG]),
                                             ("GT", "1E+7000")])
def test_a_decimal_beyond_decimal128_is_refused_naming_the_field_on_every_backend(backend, operator, value):
    """Issue 22, item 11: on MongoDB it raised decimal.Inexact outside the error mapping (a 500); every
    backend refuses it, so one condition means the same everywhere."""
    with pytest.raises(QueryValidationError, match=r"state\.total_amount holds a Decimal: .*34 at most"):
        query("order", {"field": "state.total_amount", "operator": operator, "value": value})
    # A Decimal object (the Python API), on any field, is refused by the parser at its place in the condition.
    for field in ("state.total_amount", "state.customer_id"):
        with pytest.raises(QueryValidationError, match=r"condition\.value: .*34 at most"):
            query("order", {"field": field, "operator": "EQ", "value": Decimal(LONG)})
    # Trailing zeros beyond 34 digits change no value: compared as usual.
    assert query("order", {"field": "state.total_amount", "operator": "GT", "value": "1." + "0" * 40}) == []
    response = APIClient().post("/api/order/snapshot/count", {"field": "state.total_amount", "operator": "GT",
                                                              "value": LONG}, format="json", **headers(tenant="t1"))
    assert response.status_code == 400, response.content
    assert "state.total_amount" in response.json()["errorMsg"]


def test_over_http_the_readme_example_counts_the_orders_over_50_and_answers_numbers(backend):
    place_orders()
    api = APIClient()
    response = api.post("/api/order/snapshot/count", {"field": "state.total_amount", "operator": "GT", "value": 50},
                        format="json", **headers(tenant="t1"))
    assert response.status_code == 200, response.content
    assert response.json() == 2
    response = api.post("/api/order/snapshot/list", {
        "condition": {"field": "state.total_amount", "operator": "GTE", "value": "50"},
        "sort": [{"field": "state.total_amount", "direction": "DESC"}]}, format="json", **headers(tenant="t1"))
    assert response.status_code == 200, response.content
    assert b'"total_amount":250.5' in response.content.replace(b" ", b"")
    assert [doc["state"]["total_amount"] for doc in response.json()] == [250.5, 100, 50]  # JSON numbers
    refused = api.post("/api/order/snapshot/count", {"field": "state.total_amount", "operator": "GT", "value": "x"},
                       format="json", **headers(tenant="t1"))
    assert refused.status_code == 400 and "state.total_amount" in refused.content.decode()


# --- times ---------------------------------------------------------------------------------------------------


@pytest.fixture
def ledger(backend):
    """An aggregate of the test's own with a Decimal and a datetime in its state and its event."""
    with isolated_registry():
        class Book(Command, name="book_entry"):
            amount: Decimal
            due_at: datetime

        class Reschedule(Command, name="reschedule_entry"):
            due_at: datetime

        class Booked(Event, name="entry_booked"):
            amount: Decimal
            due_at: datetime

        class Rescheduled(Event, name="entry_rescheduled"):
            due_at: datetime

        class EntryState(State):
            amount: Decimal = Decimal(0)
            due_at: datetime | None = None
            history: list[datetime] = []

            @sourcing(Booked)
            def _booked(self, event: Booked) -> None:
                self.amount, self.due_at = event.amount, event.due_at
                self.history = [event.due_at]

            @sourcing(Rescheduled)
            def _rescheduled(self, event: Rescheduled) -> None:
                self.due_at = event.due_at
                self.history = [*self.history, event.due_at]

        class Entry(Aggregate, name="entry", state=EntryState):
            @creates(Book)
            def book(self, command: Book) -> Booked:
                return Booked(amount=command.amount, due_at=command.due_at)

            @handles(Reschedule)
            def reschedule(self, command: Reschedule) -> Rescheduled:
                return Rescheduled(due_at=command.due_at)

        def book(due_at, amount="1.00", tenant="t1") -> str:
            result = get_runtime().gateway.send(Book(amount=Decimal(amount), due_at=due_at), tenant_id=tenant,
                                                wait="SNAPSHOT")
            assert result.succeeded, result
            return result.aggregate_id

        yield book, Entry


def due(documents) -> list[str]:
    return [doc["state"]["due_at"] for doc in documents]


def test_times_are_stored_as_canonical_utc_text_and_read_back_as_aware_datetimes(ledger):
    book, entry = ledger
    entry_id = book(datetime(2026, 3, 1, 9, 30, tzinfo=UTC).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Shanghai")))
    runtime = get_runtime()
    snapshot = runtime.snapshot_store.load(AggregateId("entry", entry_id, "order-service", "t1"))
    assert snapshot.state["due_at"] == "2026-03-01T09:30:00.000000Z"
    assert snapshot.state["history"] == ["2026-03-01T09:30:00.000000Z"]
    loaded = runtime.gateway.repository.load(entry, entry_id, tenant_id="t1")
    assert loaded.state.due_at == datetime(2026, 3, 1, 9, 30, tzinfo=UTC) and loaded.state.due_at.tzinfo is not None


def test_time_fields_compare_and_sort_in_time_order_whatever_the_offset_a_value_was_written_in(ledger):
    book, _ = ledger
    shanghai = datetime(2026, 1, 1, 10, 0, tzinfo=__import__("zoneinfo").ZoneInfo("Asia/Shanghai"))  # 02:00Z
    book(shanghai)
    book(datetime(2026, 1, 1, 3, 0, tzinfo=UTC))
    book(datetime(2026, 1, 1, 1, 59, 59, 999999))  # naive: taken as UTC
    book(datetime(2026, 1, 1, 2, 0, 0, 500000, tzinfo=UTC))  # microseconds: text order needs the fixed width
    ordered = query("entry", {"operator": "ALL"}, sort=[{"field": "state.due_at", "direction": "ASC"}])
    assert due(ordered) == ["2026-01-01T01:59:59.999999Z", "2026-01-01T02:00:00.000000Z",
                            "2026-01-01T02:00:00.500000Z", "2026-01-01T03:00:00.000000Z"]
    for value in ["2026-01-01T10:00:00+08:00", "2026-01-01T02:00:00Z", "2026-01-01T02:00:00",
                  1767232800000]:  # the same instant four ways
        found = query("entry", {"field": "state.due_at", "operator": "GT", "value": value},
                      sort=[{"field": "state.due_at", "direction": "ASC"}])
        assert due(found) == ["2026-01-01T02:00:00.500000Z", "2026-01-01T03:00:00.000000Z"], value
        found = query("entry", {"field": "state.due_at", "operator": "EQ", "value": value})
        assert due(found) == ["2026-01-01T02:00:00.000000Z"], value
    found = query("entry", {"field": "state.due_at", "operator": "BETWEEN",
                            "value": ["2026-01-01T01:00:00Z", "2026-01-01T10:00:00+08:00"]})  # to 02:00Z
    assert sorted(due(found)) == ["2026-01-01T01:59:59.999999Z", "2026-01-01T02:00:00.000000Z"]
    found = query("entry", {"field": "state.history", "operator": "LT", "value": "2026-01-01T02:00:00Z"})
    assert due(found) == ["2026-01-01T01:59:59.999999Z"]  # a list of times: each element typed


def test_date_operators_on_a_time_field_use_its_time_bounds(ledger):
    book, _ = ledger
    now = datetime.now(UTC)
    recent, old = now - timedelta(minutes=1), now - timedelta(days=10)
    book(recent)
    book(old)
    found = query("entry", {"field": "state.due_at", "operator": "RECENT_DAYS", "value": 2})
    assert len(found) == 1 and found[0]["state"]["due_at"].startswith(recent.strftime("%Y-%m-%dT%H:%M"))
    found = query("entry", {"field": "state.due_at", "operator": "EARLIER_DAYS", "value": 2})
    assert len(found) == 1 and found[0]["state"]["due_at"].startswith(old.strftime("%Y-%m-%d"))


def test_a_value_that_is_no_time_for_a_time_field_is_refused_naming_the_field(ledger):
    with pytest.raises(QueryValidationError, match=r"state\.due_at holds a time: 'soon' is not an ISO-8601 time"):
        query("entry", {"field": "state.due_at", "operator": "GT", "value": "soon"})
    with pytest.raises(QueryValidationError, match=r"state\.due_at holds a time"):
        query("entry", {"field": "state.due_at", "operator": "IN", "value": [True]})



def test_wow_rebuild_snapshots_rewrites_snapshots_stored_with_decimals_as_text(backend):
    """Snapshots of an earlier version held Decimals as text: the rebuild rewrites them typed."""
    import dataclasses
    from io import StringIO

    from django.core.management import call_command

    order_id = place_orders(["100.00"])[0]
    runtime = get_runtime()
    key = AggregateId("order", order_id, "order-service", "t1")
    typed = runtime.snapshot_store.load(key)
    old_form = {**typed.state, "total_amount": "100.00", "paid_amount": "0",
                "items": [{**line, "unit_price": str(line["unit_price"])} for line in typed.state["items"]]}
    runtime.snapshot_store.save(dataclasses.replace(typed, state=old_form))
    over_50 = {"field": "state.total_amount", "operator": "GT", "value": 50}
    assert query("order", over_50) == []  # text does not compare with numbers
    call_command("wow_rebuild_snapshots", "order", stdout=StringIO())
    assert totals(query("order", over_50)) == [Decimal("100.00")]


# --- found unpinned by a mutation pass ------------------------------------------------------------------------


def place_lines(prices: list[str], tenant="t1") -> str:
    from sample_project.orders.aggregates import OrderLine, PlaceOrder

    lines = [OrderLine(sku=f"A-{n}", quantity=1, unit_price=Decimal(price)) for n, price in enumerate(prices)]
    result = get_runtime().gateway.send(PlaceOrder(customer_id="c-1", items=lines), tenant_id=tenant,
                                        wait="SNAPSHOT")
    assert result.succeeded, result
    return result.aggregate_id


def test_decimals_inside_lists_are_typed_stored_and_read_back(backend):
    both = place_lines(["5.00", "7.50"])
    place_lines(["5.00", "9.99"])
    runtime = get_runtime()
    key = AggregateId("order", both, "order-service", "t1")
    prices = [line["unit_price"] for line in runtime.snapshot_store.load(key).state["items"]]
    assert prices == [Decimal("5.00"), Decimal("7.50")] and all(isinstance(p, Decimal) for p in prices)
    body = runtime.event_store.load(key)[0].body[0].body
    assert [line["unit_price"] for line in body["items"]] == [Decimal("5.00"), Decimal("7.50")]
    assert runtime.gateway.repository.load(_order(), both, tenant_id="t1").state.items[1].unit_price == Decimal("7.5")
    found = query("order", {"field": "state.items.unit_price", "operator": "ALL_IN", "value": ["5", 7.5]})
    assert [doc["aggregateId"] for doc in found] == [both]
    found = query("order", {"field": "state.items", "operator": "ELEM_MATCH", "children": [
        {"field": "unit_price", "operator": "GT", "value": "7"}, {"field": "unit_price", "operator": "LT", "value": 8}]})
    assert [doc["aggregateId"] for doc in found] == [both]
    found = query("order", {"field": "state.items.unit_price", "operator": "EQ", "value": 9.99})  # as written
    assert len(found) == 1 and found[0]["aggregateId"] != both


def test_typed_conditions_under_and_or_nor(backend):
    place_orders()
    found = query("order", {"operator": "OR", "children": [
        {"operator": "AND", "children": [{"field": "state.total_amount", "operator": "GT", "value": "200"}]},
        {"operator": "NOR", "children": [{"field": "state.total_amount", "operator": "GTE", "value": "10"}]},
    ]}, sort=[{"field": "state.total_amount", "direction": "ASC"}])
    assert [str(t) for t in totals(found)] == ["9.99", "250.50"]


def test_on_mongo_a_misplaced_match_built_by_hand_is_refused_with_decimal128_or_without(mongo_backend):
    """The parser refuses MATCH under OR; MongoDB refuses $text there too. The embedded engine, which runs MATCH
    in Python, refuses it as a server would, whether the collection holds Decimal128 (all in Python) or not."""
    from wow_django.query.condition import Condition, Operator

    # (The other backends run MATCH wherever it stands.)
    misplaced = Condition(operator=Operator.OR, children=(
        Condition(operator=Operator.MATCH, value="c-1"),
        Condition(operator=Operator.GT, field="state.total_amount", value=Decimal(0))))
    service = get_runtime().snapshot_queries("order")
    for orders in ([], ["1.00"]):
        place_orders(orders)
        with pytest.raises(QueryValidationError, match="MATCH"):
            service.list(ListQuery(condition=misplaced, limit=10), tenant_id="t1")
        with pytest.raises(QueryValidationError, match="MATCH"):
            service.count(misplaced, tenant_id="t1")


def test_raw_runs_on_mongo_over_a_collection_that_holds_decimal128(mongo_backend):
    # RAW is MongoDB's own language: the other backends refuse it (tests/test_query_service.py).
    order_id = place_orders(["1.00"])[0]
    raw = parse_condition({"operator": "RAW", "value": {"state.customer_id": "c-1"}}, allow_raw=True)
    found = get_runtime().snapshot_queries("order").list(ListQuery(condition=raw, limit=10), tenant_id="t1")
    assert [doc["aggregateId"] for doc in found] == [order_id]


def test_decimal_bounds_compare_exactly_where_the_database_can(backend):
    """SQLite binds a Decimal as a REAL (its JSON fractions are REALs): a 21-digit bound rounds there."""
    place_orders(["100.00", "99.99"])
    close = "99.999999999999999999"  # a float rounds it to 100.0
    found = query("order", {"field": "state.total_amount", "operator": "GT", "value": close})
    assert [str(t) for t in totals(found)] == ([] if backend == "django_sqlite" else ["100.00"])
    found = query("order", {"field": "state.total_amount", "operator": "IN", "value": [close, "99.99"]},
                  sort=[{"field": "state.total_amount", "direction": "ASC"}])
    assert [str(t) for t in totals(found)] == (["99.99", "100.00"] if backend == "django_sqlite" else ["99.99"])

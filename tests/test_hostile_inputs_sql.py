"""Hostile clients on the SQL backends (issue 26): NUL characters (item 2), costly text conditions (item 3),
the store's own words kept out of answers (item 5).

PostgreSQL stores no NUL (text or JSON), so every backend refuses them alike with a 400 naming the field,
before any lookup, and nothing is stored; credentials with one are a 401 with ``WWW-Authenticate``; a
database's refusal never answers 500 nor shows its SQL. Run on the django backend on SQLite (which would
store the NUL) and on PostgreSQL (which would fail).
"""

from __future__ import annotations

import base64
import dataclasses
import uuid

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from wow_django.application.runtime import get_runtime
from wow_django.persistence.records import AggregateId

from .conftest import isolated
from .support import fresh_wow

ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "3.50"}]}


@pytest.fixture(params=[
    pytest.param("wow_sqlite", marks=pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)),
    pytest.param("wow_pg", marks=pytest.mark.django_db(databases=["default", "wow_pg"], transaction=True)),
])
def api(request):
    with isolated(fresh_wow("django", DATABASE_ALIAS=request.param)):
        yield APIClient()


def post(api, path, body, **extra):
    return api.post(f"/api/{path}", body, format="json", HTTP_COMMAND_TENANT_ID="t1", **extra)


def refused(response, status: int, names: list[str] | None = None) -> dict:
    assert response.status_code == status, response.content[:1000]
    body = response.json()
    if names is not None:
        assert [e["name"] for e in body["bindingErrors"]] == names, body
        assert all("NUL" in e["msg"] for e in body["bindingErrors"]), body
    text = response.content.decode()
    assert "INSERT" not in text and "SELECT" not in text and "0x00" not in text
    return body


def place(api) -> str:
    response = post(api, "order/place_order", ORDER)
    assert response.status_code == 200, response.content
    return response.json()["aggregateId"]


@pytest.mark.parametrize(("body", "name"), [
    ({**ORDER, "customer_id": "c-\x00"}, "customer_id"),
    ({**ORDER, "items": [{"sku": "A\x00", "quantity": 1, "unit_price": "1"}]}, "items[0].sku"),
    ({**ORDER, "note\x00": "x"}, "body"),
])
def test_a_nul_in_a_command_body_is_a_400_naming_the_field_and_nothing_is_stored(api, body, name):
    before = place(api)
    refused(post(api, "order/place_order", body), 400, [name])
    stored = get_runtime().event_store.load(AggregateId("order", before, tenant_id="t1"))
    assert [s.version for s in stored] == [1]  # only the order placed before


@pytest.mark.parametrize("condition", [
    {"field": "state.customer_id", "operator": "EQ", "value": "c\x00"},
    {"field": "state.customer_id", "operator": "NE", "value": "c\x00"},
    {"field": "state.customer_id", "operator": "IN", "value": ["a", "c\x00"]},
    {"field": "state.customer_id", "operator": "NOT_IN", "value": ["c\x00"]},
    {"field": "state.tags", "operator": "ALL_IN", "value": ["c\x00"]},
    {"field": "state.customer_id", "operator": "BETWEEN", "value": ["a", "c\x00"]},
    {"field": "state.customer_id", "operator": "GT", "value": "c\x00"},
    {"field": "state.customer_id", "operator": "LT", "value": "c\x00"},
    {"field": "state.customer_id", "operator": "CONTAINS", "value": "c\x00"},
])
def test_a_nul_in_a_condition_value_is_a_400_on_every_query_route(api, condition):
    place(api)
    for path in ("order/snapshot/list", "order/snapshot/paged", "order/snapshot/count", "order/event/list"):
        body = refused(post(api, path, {"condition": condition}), 400)
        assert body["bindingErrors"] and body["bindingErrors"][0]["name"].startswith("condition."), body


def test_a_nul_in_a_path_a_query_parameter_or_a_header_is_a_400(api):
    order_id = place(api)
    refused(api.get(f"/api/order/{order_id}%00/state", HTTP_COMMAND_TENANT_ID="t1"), 400, ["id"])
    refused(api.get(f"/api/order/{order_id}/state?tenantId=t%001", HTTP_COMMAND_TENANT_ID="t1"), 400,
            ["tenantId"])
    refused(post(api, "order/place_order", ORDER, HTTP_COMMAND_REQUEST_ID="r-\x00"), 400, ["Command-Request-Id"])
    assert api.get(f"/api/order/{order_id}/state", HTTP_COMMAND_TENANT_ID="t1").status_code == 200


@pytest.mark.parametrize("accept", ["application/json", "text/html"])
def test_a_nul_in_basic_credentials_is_a_401_with_a_challenge(api, accept):
    """Also as the browsable API's page (which reads the user again while rendering), and with what DRF's
    lenient decoding still reads (characters outside base64 skipped)."""
    headers = [base64.b64encode(f"{user}:pw\x00".encode()).decode() for user in ("ad\x00min", "admin")]
    headers.append("YQA6Yg==!")  # "a\0:b" once the "!" is skipped
    for credentials in headers:
        response = api.get("/api/order/x/state", HTTP_AUTHORIZATION=f"Basic {credentials}",
                           HTTP_COMMAND_TENANT_ID="t1", HTTP_ACCEPT=accept)
        assert response.status_code == 401, response.content[:500]
        assert response["WWW-Authenticate"].startswith("Basic")
        if accept == "application/json":
            assert response.json()["errorCode"] == "AuthenticationFailed"
    both = api.get("/api/order/x/state?tenantId=a%00", HTTP_AUTHORIZATION=f"Basic {headers[0]}",
                   HTTP_COMMAND_TENANT_ID="t1", HTTP_ACCEPT=accept)
    assert both.status_code == 401, both.content[:500]


def test_a_database_error_while_authenticating_is_a_401(api):
    from django.conf import settings

    with override_settings(WOW={**settings.WOW, "API_AUTHENTICATION_CLASSES": [
            "tests.test_hostile_inputs_sql.RefusedByTheDatabase"]}):
        for accept in ("application/json", "text/html"):  # the page reads the user again: no second lookup
            response = api.get("/api/order/x/state", HTTP_AUTHORIZATION="Basic eDp5", HTTP_COMMAND_TENANT_ID="t1",
                               HTTP_ACCEPT=accept)
            assert response.status_code == 401, response.content[:500]
            assert response["WWW-Authenticate"].startswith("Basic")
            assert "SELECT" not in response.content.decode()


class RefusedByTheDatabase:
    """An authenticator whose user lookup the database refuses (as PostgreSQL does a NUL it cannot take)."""

    def authenticate(self, request):
        from django.db import DataError

        raise DataError('SELECT "auth_user"."id" FROM "auth_user": PostgreSQL text fields cannot contain NUL')

    def authenticate_header(self, request):
        return 'Basic realm="api"'


def test_the_python_api_refuses_a_nul_naming_the_field(api):
    from sample_project.orders.aggregates import OrderLine, PlaceOrder
    from wow_django.exceptions import CommandValidationError

    gateway = get_runtime().gateway
    with pytest.raises(CommandValidationError) as caught:
        gateway.send(PlaceOrder(customer_id="c-\x00", items=[OrderLine(sku="A", quantity=1, unit_price="1")]),
                     tenant_id="t1")
    assert caught.value.binding_errors == [{"name": "customer_id", "msg": "must not contain NUL characters (\\u0000)"}]
    with pytest.raises(CommandValidationError) as caught:
        gateway.send(PlaceOrder(customer_id="c", items=[OrderLine(sku="A", quantity=1, unit_price="1")]),
                     tenant_id="t1", operator="op\x00")
    assert caught.value.binding_errors[0]["name"] == "operator"


def test_a_stream_the_database_refuses_is_an_error_without_its_sql(api):
    """Below the gateway (a stream built by hand): on PostgreSQL the store's error names the stream, not the
    statement, whose text goes to the log; SQLite stores what it is given."""
    from django.conf import settings

    from wow_django.exceptions import EventStoreError
    from wow_django.testing import make_stream

    store = get_runtime().event_store
    stream = make_stream(AggregateId("order", uuid.uuid4().hex, "order-service", "t1"), 1)
    record = stream.body[0]
    bad = dataclasses.replace(stream, body=(dataclasses.replace(record, body={"text": "a\x00"}),))
    if settings.WOW["DATABASE_ALIAS"] != "wow_pg":
        store.append(bad)
        assert [s.version for s in store.load(bad.aggregate_id)] == [1]
        return
    with pytest.raises(EventStoreError) as caught:
        store.append(bad)
    assert bad.id in str(caught.value)
    assert "INSERT" not in str(caught.value) and "0x00" not in str(caught.value)
    assert store.load(bad.aggregate_id) == []


def test_a_database_refusal_on_a_read_is_a_400_without_the_sql(api, monkeypatch):
    """Whatever reaches the database and is refused as data (here played by the store) answers 400, with the
    database's text in the log only."""
    from django.db import DataError

    order_id = place(api)
    store = get_runtime().event_store

    def refusing(*args, **kwargs):
        raise DataError('invalid input syntax: SELECT "wow_event_stream"."body" FROM "wow_event_stream" WHERE …')

    monkeypatch.setattr(store, "load", refusing)
    # The repository reads the snapshot and the streams after it together on the django backend.
    monkeypatch.setattr(get_runtime().snapshot_store, "load_with_tail", refusing)
    response = api.get(f"/api/order/{order_id}/state", HTTP_COMMAND_TENANT_ID="t1")
    body = refused(response, 400)
    assert body["errorCode"] == "IllegalArgument"


def test_a_store_error_answers_without_the_stores_words(api, monkeypatch):
    """Issue 26, item 5: a store's refusal that is not a known conflict answers what happened; the server's
    message (a statement, a document) goes to the log only."""
    from wow_django.exceptions import EventStoreError

    store = get_runtime().event_store

    def refusing(stream):
        raise EventStoreError('E11000 index wow_x dup key: { body: "secret" } / INSERT INTO "wow_event_stream"')

    monkeypatch.setattr(store, "append", refusing)
    response = post(api, "order/place_order", ORDER)
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["errorCode"] == "EventStoreError"
    assert "secret" not in body["errorMsg"] and "E11000" not in body["errorMsg"] and "INSERT" not in body["errorMsg"]


# --- issue 26, item 3: costly text conditions ---------------------------------------------------------------

def _contains(n: int, length: int) -> dict:
    return {"operator": "OR", "children": [
        {"field": "state.customer_id", "operator": "CONTAINS", "value": "x" * length, "options": {"ignoreCase": True}}
        for _ in range(n)]}


def test_the_text_of_a_querys_conditions_is_bounded_in_all(api):
    place(api)
    body = refused(post(api, "order/snapshot/list", {"condition": _contains(50, 4096)}), 400)
    error = body["bindingErrors"][0]
    assert error["name"] == "condition.children[4].value" and "16384 characters in all" in error["msg"], body
    assert post(api, "order/snapshot/list", {"condition": _contains(4, 4096)}).status_code == 200


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_sqlite_stops_a_query_at_its_time_limit(monkeypatch):
    """SQLite has no statement timeout: the progress handler stops the statement once the clock passes the
    limit (here the clock jumps an hour after its first look), and the answer is QueryTooExpensive. (PostgreSQL's
    statement_timeout has its own test with the query service.)"""
    from wow_django.backends.django import queries

    with isolated(fresh_wow("django", DATABASE_ALIAS="wow_sqlite")):
        api = APIClient()
        for _ in range(5):
            place(api)
        looks = []
        start = queries._now()

        def clock():
            looks.append(1)
            return start if len(looks) == 1 else start + 3600

        monkeypatch.setattr(queries, "_now", clock)
        monkeypatch.setattr(queries, "SQLITE_PROGRESS_STEPS", 1)
        body = refused(post(api, "order/snapshot/list", {"condition": _contains(1, 10)}), 400)
        assert body["errorCode"] == "QueryTooExpensive" and "DATABASE_QUERY_TIMEOUT_MS" in body["errorMsg"], body
        monkeypatch.setattr(queries, "_now", lambda: start)
        assert post(api, "order/snapshot/list", {"condition": _contains(1, 10)}).status_code == 200

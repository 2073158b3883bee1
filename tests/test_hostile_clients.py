"""Hostile clients over HTTP (issue 12, items 14-18 and 21): every refusal is a 400-class JSON error
naming the field and the rule, nothing is stored, never a 500.

The HTTP tests run on the in-memory backend, on mongomock:// and on the django backend (SQLite):
the limits live in the shared condition parser, so every backend answers the same.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from wow_django.application.runtime import get_runtime
from wow_django.persistence.records import AggregateId

pytestmark = pytest.mark.usefixtures("queued_commands")

ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "3.50"}]}


@pytest.fixture
def backend(every_backend):
    """Settings on each backend (the django one on the wow_sqlite database)."""
    return every_backend


@pytest.fixture
def api(backend):
    return APIClient()


def post(api, path, body, tenant="t1", **extra):
    return api.post(f"/api/{path}", body, format="json", HTTP_COMMAND_TENANT_ID=tenant, **extra)


def raw_post(api, path, raw: str | bytes, tenant="t1", content_type="application/json", **extra):
    return api.post(f"/api/{path}", data=raw, content_type=content_type, HTTP_COMMAND_TENANT_ID=tenant, **extra)


def assert_error(response, status: int, code: str, names=None) -> dict:
    assert response.status_code == status, response.content[:2000]
    body = response.json()
    assert set(body) == {"errorCode", "errorMsg", "bindingErrors"}
    assert body["errorCode"] == code, body
    if names is not None:
        assert [e["name"] for e in body["bindingErrors"]] == list(names), body
    return body


def place(api, tenant="t1") -> str:
    response = post(api, "order/place_order", ORDER, tenant=tenant, HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
    assert response.status_code == 200, response.content
    return response.json()["aggregateId"]


def stored_versions(order_id: str, tenant: str = "t1") -> list[int]:
    return [s.version for s in get_runtime().event_store.load(AggregateId("order", order_id, tenant_id=tenant))]


# --- 15: deep field paths and deeply nested values are 400s, not RecursionErrors ----------------------------

DEEP_FIELD = ".".join(["state"] + ["a"] * 949)


@pytest.mark.parametrize(("body", "name"), [
    ({"sort": [{"field": DEEP_FIELD}]}, "sort[0].field"),
    ({"condition": {"field": DEEP_FIELD, "operator": "EQ", "value": 1}}, "condition.field"),
    ({"condition": {"operator": "AND", "children": [{"field": DEEP_FIELD, "operator": "NULL"}]}},
     "condition.children[0].field"),
    ({"projection": {"include": [DEEP_FIELD]}}, "projection.include[0]"),
    ({"projection": {"exclude": ["state.x", DEEP_FIELD]}}, "projection.exclude[1]"),
])
def test_a_field_path_of_950_segments_is_a_400_naming_the_field_and_the_rule(api, body, name):
    order_id = place(api)  # a document for the backend to walk
    for path in ("order/snapshot/list", "order/event/list"):
        error = assert_error(post(api, path, body), 400, "IllegalArgument", [name])
        assert "at most 100 segments" in error["bindingErrors"][0]["msg"], error
        assert "(got 950)" in error["bindingErrors"][0]["msg"]
    assert stored_versions(order_id) == [1]


def test_a_raw_filter_key_of_950_segments_is_a_400(api, backend):
    with override_settings(WOW={**backend, "QUERY_ALLOW_RAW": True}):
        body = {"condition": {"operator": "RAW", "value": {DEEP_FIELD: 1}}}
        error = assert_error(post(api, "order/snapshot/list", body), 400, "IllegalArgument")
        assert "at most 100 segments" in error["errorMsg"]


def test_a_path_of_100_segments_is_still_a_field_path(api):
    place(api)
    field = ".".join(["state"] + ["a"] * 99)
    assert post(api, "order/snapshot/count", {"field": field, "operator": "NULL"}).json() == 1
    response = post(api, "order/snapshot/list", {"sort": [{"field": field}], "projection": {"include": [field]}})
    assert response.status_code == 200, response.content


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _parser_limit(api) -> int:
    """The deepest list the JSON parser takes here (it depends on the stack depth of the request)."""
    low, high = 10, 5000
    while low < high:
        middle = (low + high + 1) // 2
        response = raw_post(api, "order/snapshot/list", '{"unknownKey": X}'.replace("X", _nested(middle)))
        if response.json()["errorMsg"].startswith("Malformed JSON"):  # the parser's refusal, not the query's
            high = middle - 1
        else:
            low = middle
    return low


@pytest.mark.parametrize("template", [
    '%s',
    '{"sort": %s}',
    '{"limit": %s}',
    '{"condition": %s}',
    '{"projection": %s}',
    '{"projection": {"include": %s}}',
    '{"pagination": {"size": %s}}',
    '{"condition": {"field": "state.a", "operator": "GT", "value": %s}}',
    '{"condition": {"field": "state.a", "operator": "CONTAINS", "value": %s}}',
    '{"condition": {"field": %s, "operator": "EQ", "value": 1}}',
])
def test_a_list_nested_just_below_the_parsers_limit_gets_a_400(api, template):
    limit = _parser_limit(api)
    assert limit > 100
    for depth in range(limit - 12, limit + 1):
        for path in ("order/snapshot/list", "order/snapshot/paged"):
            response = raw_post(api, path, template.replace("%s", _nested(depth)))
            assert response.status_code == 400, (depth, response.content[:300])
            assert len(response.content) < 2000
    response = raw_post(api, "order/snapshot/count", template.replace("%s", _nested(limit)))
    assert response.status_code == 400, response.content[:300]


def test_a_command_body_nested_just_below_the_parsers_limit_gets_a_400(api):
    limit = _parser_limit(api)
    for depth in range(limit - 12, limit + 1):
        for raw in (_nested(depth), '{"customer_id": X, "items": []}'.replace("X", _nested(depth)),
                    '{"customer_id": "c", "items": X}'.replace("X", _nested(depth))):
            response = raw_post(api, "order/place_order", raw)
            assert response.status_code == 400, (depth, response.content[:300])


# --- 14: text values and field paths are capped ---------------------------------------------------------------

LONG_TEXT = "x" * 4097  # one past the cap
LONG_FIELD = "state." + "f" * 1019  # 1025 characters, one past the cap


@pytest.mark.parametrize(("condition", "name"), [
    ({"field": "state.customer_id", "operator": "CONTAINS", "value": LONG_TEXT}, "condition.value"),
    ({"field": "state.customer_id", "operator": "STARTS_WITH", "value": LONG_TEXT}, "condition.value"),
    ({"field": "state.customer_id", "operator": "ENDS_WITH", "value": LONG_TEXT,
      "options": {"ignoreCase": True}}, "condition.value"),
    ({"operator": "MATCH", "value": LONG_TEXT}, "condition.value"),
    ({"field": "state.customer_id", "operator": "EQ", "value": LONG_TEXT, "options": {"ignoreCase": True}},
     "condition.value"),
    ({"operator": "AND", "children": [
        {"operator": "ALL"},
        {"field": "state.customer_id", "operator": "NE", "value": LONG_TEXT, "options": {"ignoreCase": True}}]},
     "condition.children[1].value"),
])
def test_text_operator_values_are_capped(api, condition, name):
    for path in ("order/snapshot/list", "order/event/count"):
        body = condition if path.endswith("count") else {"condition": condition}
        error = assert_error(post(api, path, body), 400, "IllegalArgument", [name])
        assert "at most 4096 characters (got 4097)" in error["bindingErrors"][0]["msg"], error
        assert len(error["errorMsg"]) < 400


def test_text_at_the_cap_is_searched(api):
    place(api)
    condition = {"field": "state.customer_id", "operator": "CONTAINS", "value": "x" * 4096}
    assert post(api, "order/snapshot/count", condition).json() == 0
    condition = {"field": "state.customer_id", "operator": "EQ", "value": "C-1" + "x" * 4093,
                 "options": {"ignoreCase": True}}
    assert post(api, "order/snapshot/count", condition).json() == 0


def test_a_raw_regex_is_capped(api, backend):
    with override_settings(WOW={**backend, "QUERY_ALLOW_RAW": True}):
        body = {"condition": {"operator": "RAW", "value": {"state.customer_id": {"$regex": LONG_TEXT}}}}
        error = assert_error(post(api, "order/snapshot/list", body), 400, "IllegalArgument",
                             ["condition.value.state.customer_id.$regex"])
        assert "at most 4096 characters" in error["errorMsg"]


@pytest.mark.parametrize(("body", "name"), [
    ({"sort": [{"field": LONG_FIELD}]}, "sort[0].field"),
    ({"condition": {"field": LONG_FIELD, "operator": "EQ", "value": 1}}, "condition.field"),
    ({"condition": {"field": LONG_FIELD, "operator": "CONTAINS", "value": "x"}}, "condition.field"),
    ({"projection": {"include": [LONG_FIELD]}}, "projection.include[0]"),
])
def test_field_paths_are_capped_in_length(api, body, name):
    error = assert_error(post(api, "order/snapshot/paged", body), 400, "IllegalArgument", [name])
    assert "at most 1024 characters (got 1025)" in error["bindingErrors"][0]["msg"], error
    assert len(error["errorMsg"]) < 400


def test_a_field_path_at_the_cap_is_a_field_path(api):
    field = "state." + "f" * 1018
    assert post(api, "order/snapshot/count", {"field": field, "operator": "NULL"}).status_code == 200


def test_a_megabyte_of_text_is_refused_without_echoing_it(api):
    huge = "(a|b)*" * 400_000
    for condition in ({"field": "state.customer_id", "operator": "CONTAINS", "value": huge},
                      {"field": huge, "operator": "EQ", "value": 1},
                      {"field": "state.x", "operator": "TODAY", "options": {"zoneId": huge}},
                      {"field": "state.x", "operator": "TODAY", "options": {"datePattern": huge}},
                      {"field": "state.x", "operator": huge}):
        response = post(api, "order/snapshot/count", condition)
        assert response.status_code == 400, response.content[:300]
        assert len(response.content) < 1000, response.content[:300]


def test_long_keys_are_not_echoed_whole(api, backend):
    key = "k" * 100_000
    for body in ({key: 1}, {"condition": {"field": "state.a", "operator": "EQ", "value": {key: {"$gt": 1}}}},
                 {"condition": {"field": "state.a", "operator": "TODAY", "options": {key: 1}}}):
        response = post(api, "order/snapshot/list", body)
        assert response.status_code == 400 and len(response.content) < 4000, response.content[:300]
    with override_settings(WOW={**backend, "QUERY_ALLOW_RAW": True}):
        body = {"condition": {"operator": "RAW", "value": {key: 1}}}
        response = post(api, "order/snapshot/list", body)
        assert response.status_code == 400 and len(response.content) < 4000, response.content[:300]


# --- 16: JSON numbers of command bodies are decimals, judged by the model ------------------------------------


def stored_bodies(order_id: str, tenant: str = "t1") -> list[dict]:
    return [event.body for stream in get_runtime().event_store.load(AggregateId("order", order_id, tenant_id=tenant))
            for event in stream.body]


def test_a_payment_of_0_99999999999999999999_does_not_pay_a_1_00_order(api):
    raw = '{"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 1, "unit_price": 1.00}]}'
    placed = raw_post(api, "order/place_order", raw, HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
    assert placed.status_code == 200, placed.content
    order_id = placed.json()["aggregateId"]
    paid = raw_post(api, f"order/{order_id}/pay_order", '{"amount": 0.99999999999999999999, "payment_id": "p-1"}')
    error = assert_error(paid, 400, "CommandValidation", ["amount"])
    assert "decimal" in error["bindingErrors"][0]["msg"].lower(), error
    assert stored_versions(order_id) == [1]
    paid = raw_post(api, f"order/{order_id}/pay_order", '{"amount": 1.00, "payment_id": "p-1"}',
                    HTTP_COMMAND_WAIT_STAGE="SNAPSHOT")
    assert paid.status_code == 200, paid.content
    assert stored_versions(order_id) == [1, 2]


def test_decimals_sent_as_numbers_are_stored_as_sent(api):
    raw = '{"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": 1.00}]}'
    order_id = raw_post(api, "order/place_order", raw, HTTP_COMMAND_WAIT_STAGE="SNAPSHOT").json()["aggregateId"]
    [placed] = stored_bodies(order_id)
    # Stored as the Decimals sent, scale included (typed values), not as floats.
    assert (placed["items"][0]["unit_price"], str(placed["items"][0]["unit_price"])) == (Decimal("1.00"), "1.00")
    assert (placed["total_amount"], str(placed["total_amount"])) == (Decimal("2.00"), "2.00")
    state = api.get(f"/api/order/{order_id}/state", HTTP_COMMAND_TENANT_ID="t1").json()
    assert state["items"][0]["unit_price"] == 1.0  # a JSON number


@pytest.mark.parametrize(("raw", "name"), [
    ('{"customer_id": "c", "items": [{"sku": "A-1", "quantity": 1, "unit_price": 0.001}]}', "items.0.unit_price"),
    ('{"customer_id": "c", "items": [{"sku": "A-1", "quantity": 1, "unit_price": 1e12}]}', "items.0.unit_price"),
    ('{"customer_id": "c", "items": [{"sku": "A-1", "quantity": 1.5, "unit_price": 1}]}', "items.0.quantity"),
    ('{"customer_id": 1.5, "items": [{"sku": "A-1", "quantity": 1, "unit_price": 1}]}', "customer_id"),
])
def test_the_models_rules_judge_decimal_numbers(api, raw, name):
    assert_error(raw_post(api, "order/place_order", raw), 400, "CommandValidation", [name])


def test_overflowing_numbers_are_still_refused_in_command_bodies(api):
    raw = '{"customer_id": "c", "items": [{"sku": "A-1", "quantity": 1, "unit_price": 1e999}]}'
    assert_error(raw_post(api, "order/place_order", raw), 400, "IllegalArgument")


def test_numbers_the_model_leaves_untyped_stay_json_numbers():
    from decimal import Decimal
    from typing import Any

    from pydantic import BaseModel

    from wow_django.domain import Command
    from wow_django.http.parsers import CommandJSONParser

    class Line(BaseModel):
        price: Decimal
        extra: dict

    class Tag(Command, name="tag_untyped"):
        note: Any = None
        lines: list[Line] = []
        weight: float = 0.0

    import io
    body = CommandJSONParser().parse(io.BytesIO(
        b'{"note": {"x": [2.5]}, "lines": [{"price": 1.10, "extra": {"y": 1e2}}], "weight": 0.1}'))
    command = Tag.from_json(body)
    assert command.note == {"x": [2.5]} and type(command.note["x"][0]) is float
    assert command.lines[0].price == Decimal("1.10") and str(command.lines[0].price) == "1.10"
    assert type(command.lines[0].extra["y"]) is float
    assert command.weight == 0.1
    assert command.model_dump(mode="json") == {"note": {"x": [2.5]}, "weight": 0.1,
                                               "lines": [{"price": "1.10", "extra": {"y": 100.0}}]}


# --- 17: unsafe requests without a JSON content type are refused, whatever the body -----------------------


def basic_client(*codenames, name="operator") -> APIClient:
    import base64

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(name, f"{name}@example.com", "pw")
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="wow_bus", codename=codename))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{name}:pw".encode()).decode())
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "text/plain", None])
def test_an_empty_form_post_with_basic_credentials_does_not_repush(bus_http_env, content_type):
    from wow_django.bus import get_bus

    bus = get_bus()
    bus.send("order.purchased", {}, event_id="evt-csrf")
    bus.record_feedback("evt-csrf", "member-service", False, "down", dead_lettered=True)
    bus.record_feedback("evt-csrf", "message-service", False, "down", dead_lettered=True)
    client = basic_client("view_busevent", "repush_event")
    extra = {} if content_type is None else {"content_type": content_type}
    response = client.generic("POST", "/bus/events/evt-csrf/repush/", "", **extra)
    error = assert_error(response, 415, "UnsupportedMediaType", [])
    assert "application/json" in error["errorMsg"] and "POST" in error["errorMsg"], error
    assert client.get("/bus/events/evt-csrf/").json()["event"]["retryCount"] == 0
    # The same request as JSON is what a real client sends: it re-pushes.
    assert client.post("/bus/events/evt-csrf/repush/", {}, format="json").status_code == 200
    assert client.get("/bus/events/evt-csrf/").json()["event"]["retryCount"] == 1


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_an_empty_non_json_command_post_is_refused_before_it_runs(api, content_type):
    order_id = place(api)
    extra = {} if content_type is None else {"content_type": content_type}
    for path in ("order/place_order", f"order/{order_id}/pay_order", f"order/{order_id}/cancel_order"):
        response = api.generic("POST", f"/api/{path}", "", HTTP_COMMAND_TENANT_ID="t1", **extra)
        assert_error(response, 415, "UnsupportedMediaType", [])
    response = api.generic("PUT", f"/api/order/{order_id}/recover", "a=b", HTTP_COMMAND_TENANT_ID="t1",
                           content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "UnsupportedMediaType", [])
    assert stored_versions(order_id) == [1]


def test_bodiless_delete_and_json_queries_still_work(api):
    order_id = place(api)
    assert api.delete(f"/api/order/{order_id}", HTTP_COMMAND_TENANT_ID="t1").status_code == 200
    assert stored_versions(order_id) == [1, 2]
    response = api.generic("POST", "/api/order/snapshot/count", "", content_type="application/json; charset=utf-8",
                           HTTP_COMMAND_TENANT_ID="t1")
    assert response.status_code == 200, response.content


# --- 18: binding errors and echoed text are capped ----------------------------------------------------------


def many_unknown_keys(count: int, base: dict) -> str:
    import json

    keys = ", ".join(f'"k{i}": 0' for i in range(count))
    return json.dumps(base)[:-1] + ", " + keys + "}"


def test_a_body_of_150000_unknown_keys_gets_a_small_400(api):
    order_id = place(api)
    raw = many_unknown_keys(150_000, {"amount": "7.00", "payment_id": "p-1"})
    assert len(raw) > 1_500_000
    response = raw_post(api, f"order/{order_id}/pay_order", raw)
    error = assert_error(response, 400, "CommandValidation")
    assert len(response.content) < 10_000, len(response.content)
    assert len(error["bindingErrors"]) == 20
    assert error["bindingErrors"][0] == {"name": "k0", "msg": "unknown field: not part of this command"}
    assert "149980 more binding errors left out" in error["errorMsg"], error["errorMsg"][-300:]
    assert stored_versions(order_id) == [1]


def test_long_names_and_messages_are_shortened(api):
    order_id = place(api)
    key = "k" * 50_000
    response = raw_post(api, f"order/{order_id}/pay_order",
                        '{"amount": "7.00", "payment_id": "p-1", "%s": 1, "x": 2}' % key)  # noqa: UP031
    error = assert_error(response, 400, "CommandValidation")
    assert len(response.content) < 3000, len(response.content)
    assert [e["name"][:10] for e in error["bindingErrors"]] == ["kkkkkkkkkk", "x"]
    assert error["bindingErrors"][0]["name"].endswith("...")
    assert stored_versions(order_id) == [1]


@pytest.mark.django_db
def test_a_bus_envelope_with_150000_unknown_keys_gets_a_small_400(bus_http_env):
    from wow_django.bus import get_bus

    from .support import client_with, stored_counts

    client = client_with("view_busevent", "send_event", name="sender")
    raw = many_unknown_keys(150_000, {"topic": "order.purchased", "payload": {}})
    response = client.post("/bus/events/", raw, content_type="application/json")
    error = assert_error(response, 400, "BusValidation")
    assert len(response.content) < 10_000, len(response.content)
    assert len(error["bindingErrors"]) == 20
    assert "149980 more binding errors left out" in error["errorMsg"]
    assert stored_counts(get_bus().store) == (0, 0)


# --- 21: secrets stay out of check messages, error messages and 503 bodies -----------------------------------

SECRET = "tok-Zq8rXb2LkP0wVn5sYt7uMc4e"


def check_texts(wow: dict) -> str:
    from django.core import checks

    with override_settings(WOW=wow):
        messages = checks.run_checks(tags=["wow_django"])
    return "\n".join(f"{m.id} {m.msg} {m.hint}" for m in messages)


@pytest.mark.parametrize("tokens", [
    {"member-service": SECRET, "message-service": 5},
    {"member-service": SECRET, "message-service": ""},
    {"member-service": SECRET, 7: "tok-other-aaaaaaaaaaaaaaaaaaaaaaa"},
    [("member-service", SECRET)],
])
def test_a_bad_callback_token_entry_does_not_print_the_tokens(tokens):
    text = check_texts({"BUS_CALLBACK_TOKENS": tokens})
    assert "BUS_CALLBACK_TOKENS" in text and "wow_django.E001" in text, text
    assert SECRET not in text and "tok-other" not in text, text


def test_a_weak_token_is_reported_by_its_consumer_not_its_value():
    text = check_texts({"BUS_CALLBACK_TOKENS": {"member-service": "short-secret-1"}})
    assert "wow_django.W102" in text and "'member-service'" in text and "short-secret-1" not in text


@pytest.mark.parametrize("uri", [
    "admin:p4ssw0rd-Xy@db.internal:27017/orders",
    "admin:p4ssw0rd-Xy@db.internal/orders?authSource=admin",
    "redis://admin:p4ssw0rd-Xy@db.internal/orders",
    "mongodb://admin:p4ss/w0rd-Xy@db.internal/orders",
])
def test_a_mongo_uri_is_never_echoed_with_its_password(uri):
    from django.core.exceptions import ImproperlyConfigured

    from wow_django.backends.mongo.client import parse_uri, redact

    assert "p4ss" not in redact(uri) and "admin:***@" in redact(uri)
    if "mongodb://" not in uri:
        with pytest.raises(ImproperlyConfigured) as raised:
            parse_uri(uri)
        assert "p4ss" not in str(raised.value)
        if "://" not in uri:
            assert "admin:***@db.internal" in str(raised.value)
    text = check_texts({"STORAGE": "mongo", "MONGO_URI": uri})
    assert "p4ss" not in text, text


def test_a_transport_url_with_a_password_is_not_echoed_by_checks():
    text = check_texts({"BUS_TRANSPORT_URL": "amqp://guest:p4ssw0rd-Xy@rabbit.internal:5672//x", "STORAGE": 5})
    assert "p4ss" not in text, text


TOPOLOGY = ("mongo-0.internal:27017: timed out, Timeout: 1.0s, Topology Description: <TopologyDescription "
            "id: 65f, topology_type: ReplicaSetNoPrimary, servers: [<ServerDescription ('mongo-0.internal', 27017) "
            "server_type: Unknown, rtt: None, error=NetworkTimeout('mongo-0.internal:27017: timed out')>]>")


def test_a_503_does_not_show_the_topology_to_anonymous_clients(api, monkeypatch):
    from pymongo.errors import ServerSelectionTimeoutError

    from wow_django.backends.mongo.errors import recoverable_errors

    def unavailable(*args, **kwargs):
        with recoverable_errors("appending"):
            raise ServerSelectionTimeoutError(TOPOLOGY)

    runtime = get_runtime()
    monkeypatch.setattr(runtime.event_store, "append", unavailable)
    monkeypatch.setattr(type(runtime.snapshot_queries("order")), "list", unavailable)
    for response in (post(api, "order/place_order", ORDER), post(api, "order/snapshot/list", {})):
        error = assert_error(response, 503, "StoreUnavailable", [])
        assert response["Retry-After"] == "1"
        assert "retry" in error["errorMsg"]
        assert "internal" not in response.content.decode() and "Topology" not in response.content.decode()


def test_a_503_does_not_show_the_broker_url(api, monkeypatch):
    from kombu.exceptions import OperationalError

    from wow_django.application.runtime import get_runtime as runtime

    def unreachable(*args, **kwargs):
        raise OperationalError("[Errno 111] Connection refused: amqp://guest:p4ssw0rd-Xy@rabbit.internal//")

    monkeypatch.setattr(runtime().event_store, "append", unreachable)
    response = post(api, "order/place_order", ORDER)
    assert_error(response, 503, "BrokerUnavailable", [])
    assert "p4ss" not in response.content.decode() and "rabbit.internal" not in response.content.decode()

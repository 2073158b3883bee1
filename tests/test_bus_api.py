"""The bus endpoints through DRF's APIClient: permissions, errors as {errorCode, errorMsg, bindingErrors},
listing, detail, send, re-push, trace, topic consumers and the consumers' token callback."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from rest_framework.test import APIClient

from wow_django.bus import get_bus
from wow_django.bus.context import bus_context
from wow_django.exceptions import EnvelopeValidationError
from wow_django.http.bus_authentication import consumer_for_token

from .support import CONSUMERS, TOKENS, callback, client_with, stored_counts

pytestmark = pytest.mark.django_db

@pytest.fixture
def viewer():
    return client_with("view_busevent", name="viewer")


@pytest.fixture
def operator():
    return client_with("view_busevent", "repush_event", "send_event", "manage_topic_consumers", name="operator")


def error(response):
    body = response.json()
    assert set(body) == {"errorCode", "errorMsg", "bindingErrors"}
    return body


def test_reading_needs_authentication_and_the_view_permission(bus_http_env):
    response = APIClient().get("/bus/events/")
    assert response.status_code == 401 and error(response)["errorCode"] == "NotAuthenticated"
    staff_only = client_with(staff=True, name="staff")
    response = staff_only.get("/bus/events/")
    assert response.status_code == 403 and "wow_bus.view_busevent" in error(response)["errorMsg"]
    assert client_with("view_busevent", name="reader").get("/bus/events/").status_code == 200
    assert client_with(superuser=True, name="root").get("/bus/events/").status_code == 200


def test_send_over_http_then_list_and_detail(bus_http_env, operator, viewer):
    response = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {"orderId": "o-1"},
                                              "eventId": "evt-http-1"}, format="json", HTTP_X_REQUEST_ID="req-42")
    assert response.status_code == 201
    assert response.json() == {"eventId": "evt-http-1", "status": "SENT", "stored": True, "duplicate": False,
                               "consumers": list(CONSUMERS), "error": None}
    again = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {}, "eventId": "evt-http-1"},
                          format="json")
    assert again.status_code == 200 and again.json()["duplicate"] is True
    nobody = operator.post("/bus/events/", {"topic": "order.unknown", "payload": {}}, format="json")
    assert nobody.status_code == 200 and nobody.json()["stored"] is False
    assert viewer.post("/bus/events/", {"topic": "order.purchased", "payload": {}}, format="json").status_code == 403

    listed = viewer.get("/bus/events/", {"status": "SENT", "topic": "order.purchased"}).json()
    assert listed["total"] == 1
    [item] = listed["list"]
    assert item["initiator"] == {"service": "order-service", "operation": None, "userId": "operator",
                                 "clientRequestId": "req-42"}
    assert item["consumption"]["text"] == "0/2 consumed" and item["occurredAt"].endswith("Z")
    detail = viewer.get("/bus/events/evt-http-1/").json()
    assert detail["event"]["eventId"] == "evt-http-1" and detail["parent"] is None and detail["children"] == []
    assert "statusRevision" not in item and "statusRevision" not in detail["event"]  # the store's CAS token
    assert [c["consumerId"] for c in detail["consumers"]] == list(CONSUMERS)


def test_the_event_list_pages_by_cursor(bus_http_env, operator, viewer):
    """``?cursor=`` (empty: the first page) pages by key: every event once, in the listing's order, the
    filters applied, no total; a bad cursor or a page number with it is a 400."""
    for n in range(5):
        sent = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {"n": n},
                                              "eventId": f"evt-page-{n}"}, format="json")
        assert sent.status_code == 201
    by_number = viewer.get("/bus/events/", {"size": 50}).json()
    seen, cursor, pages, previous = [], "", [], []
    while cursor is not None:
        page = viewer.get("/bus/events/", {"cursor": cursor, "size": 2, "topic": "order.purchased"}).json()
        assert set(page) == {"size", "list", "next", "previous"} and page["size"] == 2 and len(page["list"]) <= 2
        seen += [item["eventId"] for item in page["list"]]
        pages.append([item["eventId"] for item in page["list"]])
        previous.append(page["previous"])
        cursor = page["next"]
    assert seen == [item["eventId"] for item in by_number["list"]] and len(seen) == 5 and len(pages) == 3
    assert previous[0] is None and all(previous[1:])  # the first page has none before it
    # Back from the last page by `previous`, given as `before`: the same pages in reverse, then none.
    back, before = [], previous[-1]
    while before is not None:
        page = viewer.get("/bus/events/", {"before": before, "size": 2, "topic": "order.purchased"}).json()
        back.insert(0, [item["eventId"] for item in page["list"]])
        assert page["next"] is not None
        before = page["previous"]
    assert back == pages[:-1]
    assert viewer.get("/bus/events/", {"cursor": "", "topic": "order.other"}).json() == {
        "size": 20, "list": [], "next": None, "previous": None}
    for params, name in (({"cursor": "not-a-cursor"}, "cursor"), ({"cursor": "", "page": 2}, "page"),
                         ({"before": "W10"}, "before"), ({"before": previous[1], "page": 1}, "page"),
                         ({"before": previous[1], "cursor": previous[1]}, "before"),
                         ({"cursor": "", "size": 0}, "size"), ({"cursor": "", "status": "LOST"}, "status")):
        response = viewer.get("/bus/events/", params)
        assert response.status_code == 400 and [e["name"] for e in error(response)["bindingErrors"]] == [name]


def test_bad_input_is_a_4xx_with_binding_errors_and_stores_nothing(bus_http_env, operator, viewer):
    response = operator.post("/bus/events/", {"topic": "order purchased", "payload": {"$bad": 1},
                                              "initiator": {"service": 5}}, format="json")
    body = error(response)
    assert response.status_code == 400 and body["errorCode"] == "BusValidation"
    assert {e["name"] for e in body["bindingErrors"]} == {"topic", "payload", "initiator.service"}
    response = operator.post("/bus/events/", "[1, 2]", content_type="application/json")
    assert response.status_code == 400 and error(response)["bindingErrors"] == [
        {"name": "(body)", "msg": "must be a JSON object"}]
    response = operator.post("/bus/events/", "{not json", content_type="application/json")
    assert response.status_code == 400 and error(response)["errorCode"] == "IllegalArgument"
    response = viewer.get("/bus/events/", {"status": "DONE", "page": "x"})
    assert response.status_code == 400 and error(response)["bindingErrors"] == [
        {"name": "page", "msg": "must be an integer"}]
    response = viewer.get("/bus/events/", {"status": "DONE", "size": "1000"})
    assert response.status_code == 400 and {e["name"] for e in error(response)["bindingErrors"]} == {"status", "size"}
    assert stored_counts(get_bus().store) == (0, 0)
    assert viewer.get("/bus/events/evt-none/").status_code == 404
    assert error(viewer.get("/bus/traces/trace-none/"))["errorCode"] == "NotFound"
    assert viewer.delete("/bus/events/").status_code == 405


def test_repush_endpoint(bus_http_env, operator, viewer):
    bus = get_bus()
    bus.send("order.purchased", {}, event_id="evt-rp")
    assert viewer.post("/bus/events/evt-rp/repush/", {}, format="json").status_code == 403
    response = operator.post("/bus/events/evt-rp/repush/", {}, format="json")
    assert response.status_code == 409 and error(response)["errorCode"] == "RepushTooEarly"
    bus.record_feedback("evt-rp", "member-service", True)
    bus.record_feedback("evt-rp", "message-service", False, "smtp down", dead_lettered=True)
    response = operator.post("/bus/events/evt-rp/repush/", {"consumerId": "member-service"}, format="json")
    assert response.status_code == 409 and error(response)["errorCode"] == "AlreadyConsumed"
    response = operator.post("/bus/events/evt-rp/repush/", {"consumer": "x"}, format="json")
    assert response.status_code == 400 and error(response)["bindingErrors"][0]["name"] == "consumer"
    response = operator.post("/bus/events/evt-rp/repush/", {"consumerId": "message-service"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["retryCount"], body["status"], body["requestedBy"], body["consumerId"]) == (
        1, "RETRYING", "operator", "message-service")
    detail = viewer.get("/bus/events/evt-rp/").json()
    assert detail["event"]["retryCount"] == 1 and detail["repushes"][0]["requestedBy"] == "operator"
    assert operator.post("/bus/events/evt-none/repush/", {}, format="json").status_code == 404


def test_trace_endpoint(bus_http_env, viewer):
    bus = get_bus()
    bus.set_topic_consumer("points.added", "message-service")
    bus.send("order.purchased", {}, event_id="evt-a", trace_id="trace-http")
    bus.send("points.added", {}, event_id="evt-b", trace_id="trace-http", parent_event_id="evt-a")
    body = viewer.get("/bus/traces/trace-http/").json()
    assert [e["eventId"] for e in body["timeline"]] == ["evt-a", "evt-b"]
    assert body["tree"][0]["children"][0]["eventId"] == "evt-b"
    assert viewer.get("/bus/events/evt-b/").json()["parent"]["eventId"] == "evt-a"


def test_topic_consumers_endpoint(bus_http_env, operator, viewer):
    response = operator.post("/bus/topic-consumers/", {"topic": "order.shipped", "consumerId": "message-service",
                                                       "enabled": True, "description": "shipping notice"},
                             format="json")
    assert response.status_code == 200 and response.json()["updatedBy"] == "operator"
    listed = viewer.get("/bus/topic-consumers/", {"topic": "order.shipped"}).json()["list"]
    assert [(c["consumerId"], c["enabled"], c["description"]) for c in listed] == [
        ("message-service", True, "shipping notice")]
    assert viewer.post("/bus/topic-consumers/", {"topic": "a.b", "consumerId": "x"}, format="json").status_code == 403
    response = operator.post("/bus/topic-consumers/", {"topic": "a.b", "consumerId": "x", "enabled": "yes"},
                             format="json")
    assert response.status_code == 400 and error(response)["bindingErrors"][0]["name"] == "enabled"


def test_callback_records_feedback_for_the_tokens_consumer(bus_http_env):
    bus = get_bus()
    bus.send("order.purchased", {}, event_id="evt-cb")
    first = callback(TOKENS["member-service"], {"eventId": "evt-cb", "success": False, "error": "timeout"})
    assert first.status_code == 201 and first.json() == {"eventId": "evt-cb", "consumerId": "member-service",
                                                         "attemptNo": 1, "success": False}
    second = callback(TOKENS["member-service"], {"eventId": "evt-cb", "success": True,
                                                 "consumerId": "member-service"})
    assert second.json()["attemptNo"] == 2
    callback(TOKENS["message-service"], {"eventId": "evt-cb", "success": True})
    assert bus.store.get_event("evt-cb")["status"] == "CONSUMED"
    rows = [(r["consumerId"], r["attemptNo"], r["success"], r["source"]) for r in bus.store.consumption_rows(["evt-cb"])]
    assert rows == [("member-service", 0, None, "send"), ("member-service", 1, False, "callback"),
                    ("member-service", 2, True, "callback"), ("message-service", 0, None, "send"),
                    ("message-service", 1, True, "callback")]


def test_an_unauthenticated_or_foreign_callback_is_refused_and_stores_nothing(bus_http_env):
    bus = get_bus()
    bus.send("order.purchased", {}, event_id="evt-deny")
    body = {"eventId": "evt-deny", "success": True}
    for token in (None, "wrong-token", TOKENS["member-service"] + "x", ""):
        response = callback(token, body)
        assert response.status_code == 401, token
        assert response["WWW-Authenticate"] == 'Bearer realm="wow-bus"'
        # No credentials: NotAuthenticated; a token that is not a consumer's: AuthenticationFailed.
        expected = "NotAuthenticated" if not token else "AuthenticationFailed"
        assert error(response)["errorCode"] == expected
    response = APIClient().post("/bus/callback/", body, format="json", HTTP_AUTHORIZATION="Bearer two tokens")
    assert response.status_code == 401
    get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    session = APIClient()
    assert session.login(username="root", password="pw")
    assert session.post("/bus/callback/", body, format="json").status_code == 401  # a user is not a consumer
    response = callback(TOKENS["member-service"], {**body, "consumerId": "message-service"})
    assert response.status_code == 403 and "cannot report for 'message-service'" in error(response)["errorMsg"]
    bus.set_topic_consumer("order.purchased", "message-service", enabled=False)
    bus.send("order.purchased", {}, event_id="evt-member-only")
    response = callback(TOKENS["message-service"], {"eventId": "evt-member-only", "success": True})
    assert response.status_code == 403 and error(response)["errorCode"] == "ConsumerNotExpected"
    response = callback(TOKENS["member-service"], {"eventId": "evt-none", "success": True})
    assert response.status_code == 404 and error(response)["errorCode"] == "NotFound"
    response = callback(TOKENS["member-service"], {"eventId": "evt-deny", "success": "yes", "extra": 1})
    assert response.status_code == 400
    assert {e["name"] for e in error(response)["bindingErrors"]} == {"success", "extra"}
    assert [r["attemptNo"] for r in bus.store.consumption_rows(["evt-deny", "evt-member-only"])] == [0, 0, 0]
    assert bus.store.get_event("evt-deny")["status"] == "SENT"


def test_failed_for_some_consumer_is_one_filter_and_the_event_names_the_consumers_error(bus_http_env, viewer):
    """``status=FAILED,PARTIAL`` lists both (by page and by cursor); an event a consumer failed carries that
    failure in ``lastError`` and ``consumption.lastFailure`` though nothing went wrong sending it."""
    bus = get_bus()
    for event_id in ("evt-all-fail", "evt-one-fail", "evt-fine", "evt-retrying"):
        bus.send("order.purchased", {}, event_id=event_id)
    bus.record_feedback("evt-all-fail", "member-service", False, "KeyError: 'sku'\n\nTraceback ...",
                        dead_lettered=True)
    bus.record_feedback("evt-all-fail", "message-service", False, "boom", dead_lettered=True)
    bus.record_feedback("evt-one-fail", "member-service", True)
    bus.record_feedback("evt-one-fail", "message-service", False, "ValueError: no", dead_lettered=True)
    for consumer_id in CONSUMERS:
        bus.record_feedback("evt-fine", consumer_id, True)
    bus.record_feedback("evt-retrying", "member-service", False, "TimeoutError: slow", retrying=True)
    statuses = {e: bus.store.get_event(e)["status"] for e in ("evt-all-fail", "evt-one-fail", "evt-fine")}
    assert statuses == {"evt-all-fail": "FAILED", "evt-one-fail": "PARTIAL", "evt-fine": "CONSUMED"}

    listed = viewer.get("/bus/events/", {"status": "FAILED,PARTIAL"}).json()
    assert listed["total"] == 2 and {e["eventId"] for e in listed["list"]} == {"evt-all-fail", "evt-one-fail"}
    by_cursor = viewer.get("/bus/events/", {"status": "PARTIAL, FAILED", "cursor": ""}).json()
    assert {e["eventId"] for e in by_cursor["list"]} == {"evt-all-fail", "evt-one-fail"}
    assert viewer.get("/bus/events/", {"status": "FAILED"}).json()["total"] == 1

    one = viewer.get("/bus/events/evt-one-fail/").json()["event"]
    assert one["lastError"] == "consumer message-service, attempt 1: ValueError: no"
    assert one["consumption"]["lastFailure"]["consumerId"] == "message-service"
    assert one["consumption"]["lastFailure"]["at"].endswith("Z")
    retrying = viewer.get("/bus/events/evt-retrying/").json()["event"]
    assert retrying["status"] == "SENT" and retrying["lastError"] == "consumer member-service, attempt 1: " \
        "TimeoutError: slow"
    fine = viewer.get("/bus/events/evt-fine/").json()["event"]
    assert fine["lastError"] is None and fine["consumption"]["lastFailure"] is None
    # a parent and its children say the same as each on its own page
    bus.send("order.purchased", {}, event_id="evt-kid", parent_event_id="evt-one-fail")
    bus.record_feedback("evt-kid", "member-service", False, "boom", dead_lettered=True)
    family = viewer.get("/bus/events/evt-kid/").json()
    assert family["parent"]["lastError"] == one["lastError"]
    assert viewer.get("/bus/events/evt-one-fail/").json()["children"][0]["lastError"] == \
        "consumer member-service, attempt 1: boom"


@pytest.mark.parametrize("bus_store", ["mongo", "in_memory", "django"])
def test_events_are_found_by_their_initiators_user_and_request(bus_http_env, operator, viewer):
    operator.post("/bus/events/", {"topic": "order.purchased", "payload": {}, "eventId": "evt-req-a"}, format="json",
                  HTTP_X_REQUEST_ID="req-a")
    operator.post("/bus/events/", {"topic": "order.purchased", "payload": {}, "eventId": "evt-req-b",
                                   "initiator": {"userId": "u-7", "clientRequestId": "req-b"}}, format="json")
    by_request = viewer.get("/bus/events/", {"clientRequestId": "req-a"}).json()
    assert [e["eventId"] for e in by_request["list"]] == ["evt-req-a"] and by_request["total"] == 1
    assert [e["eventId"] for e in viewer.get("/bus/events/", {"userId": "operator"}).json()["list"]] == ["evt-req-a"]
    by_cursor = viewer.get("/bus/events/", {"userId": "u-7", "clientRequestId": "req-b", "cursor": ""}).json()
    assert [e["eventId"] for e in by_cursor["list"]] == ["evt-req-b"]
    assert viewer.get("/bus/events/", {"userId": "u-7", "clientRequestId": "req-a"}).json()["total"] == 0
    # a request id longer than a filter takes (from the bus context, which the envelope does not check) is
    # kept in the event's JSON; bad filters are a 400 naming them on every store (a NUL: no SQL store takes one)
    with bus_context(client_request_id="r" * 300):
        get_bus().send("order.purchased", {}, event_id="evt-long-request")
    assert get_bus().store.get_event("evt-long-request")["initiator"]["clientRequestId"] == "r" * 300
    for params in ({"userId": "a\x00b"}, {"clientRequestId": "r" * 201}, {"service": "\x00"}):
        response = viewer.get("/bus/events/", params)
        assert response.status_code == 400 and [e["name"] for e in error(response)["bindingErrors"]] == list(params)


def test_events_are_found_by_a_search_key_or_a_payload_field_named_by_the_settings(bus_http_env, operator, viewer,
                                                                                 monkeypatch):
    from wow_django.http.schema import search_key_pattern

    monkeypatch.setattr(get_bus(), "search_fields", ("orderId", "userId"))  # WOW['BUS_SEARCH_FIELDS']
    sent = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {"orderId": "o-1", "userId": 7},
                                          "eventId": "evt-key-a", "keys": {"aggregate": "orders.order/o-1"}},
                         format="json")
    assert sent.status_code == 201
    operator.post("/bus/events/", {"topic": "order.purchased", "payload": {"orderId": "o-2"}, "eventId": "evt-key-b"},
                  format="json")
    get_bus().send("order.purchased", {"note": "no order"}, event_id="evt-key-c", keys={"orderId": "o-1"})

    def found(key: str, **params) -> list[str]:
        response = viewer.get("/bus/events/", {"key": key, **params})
        assert response.status_code == 200, response.content
        return [e["eventId"] for e in response.json()["list"]]

    assert set(found("orderId=o-1")) == {"evt-key-a", "evt-key-c"}
    assert found("userId=7") == ["evt-key-a"] and found("aggregate=orders.order/o-1") == ["evt-key-a"]
    assert found("orderId=o-2", cursor="") == ["evt-key-b"] and found("orderId=o-3") == []
    detail = viewer.get("/bus/events/evt-key-a/").json()["event"]
    assert detail["keys"] == {"aggregate": "orders.order/o-1", "orderId": "o-1", "userId": "7"}
    assert "searchKeys" not in detail  # the stored form stays inside
    pattern = re.compile(search_key_pattern())
    for bad in ("orderId", "=o-1", "order id=o-1", "orderId=" + "x" * 201, "orderId=a\x00b"):
        response = viewer.get("/bus/events/", {"key": bad})
        assert response.status_code == 400 and [e["name"] for e in error(response)["bindingErrors"]] == ["key"]
        assert not pattern.match(bad), bad  # the schema refuses what the server refuses, and takes the rest
    assert pattern.match("orderId=o-1") and pattern.match("aggregate=orders.order/o 1=x")
    refused = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {}, "keys": {"bad name": "x"}},
                            format="json")
    assert refused.status_code == 400 and [e["name"] for e in error(refused)["bindingErrors"]] == ["keys.bad name"]
    assert get_bus().store.get_event("evt-key-d") is None


def test_the_status_filters_schema_takes_what_the_server_takes():
    from wow_django.http.schema import STATUS_LIST
    from wow_django.persistence.bus import EventQuery

    pattern = re.compile(STATUS_LIST)
    for taken in ("FAILED", "FAILED,PARTIAL", "PARTIAL, FAILED", "SENT,PENDING,RETRYING"):
        assert pattern.match(taken), taken
    for refused in ("failed", "FAILED,", ",FAILED", "FAILED;PARTIAL", "NOPE", "FAILED,NOPE"):
        assert not pattern.match(refused), refused
    assert EventQuery(status=["FAILED", "PARTIAL"]) == EventQuery(status=("FAILED", "PARTIAL"))
    assert hash(EventQuery(status=["FAILED"])) == hash(EventQuery(status=("FAILED",)))
    with pytest.raises(TypeError, match="EventQuery.status"):
        EventQuery(status=["FAILED", None])
    with pytest.raises(EnvelopeValidationError, match="status"):
        get_bus().query_of(status=["FAILED", None])
    for name in ("topic", "service", "trace_id", "user_id", "client_request_id"):
        with pytest.raises(TypeError, match=f"EventQuery.{name}"):
            EventQuery(**{name: {"$ne": None}})  # never a query operator on MongoDB


def test_token_lookup_checks_every_token():
    with override_settings(WOW={"BUS_CALLBACK_TOKENS": TOKENS}):
        assert consumer_for_token(TOKENS["message-service"]) == "message-service"
        assert consumer_for_token(TOKENS["member-service"][:-1]) is None
        assert consumer_for_token("") is None


def test_weak_or_misnamed_callback_tokens_are_reported_by_checks():
    from wow_django.bus.checks import check_callback_tokens

    with override_settings(WOW={"BUS_CALLBACK_TOKENS": {"member-service": "short", "bad id": "x" * 30}}):
        messages = {m.id: m.msg for m in check_callback_tokens()}
    assert set(messages) == {"wow_django.W102", "wow_django.E101"}
    with override_settings(WOW={"BUS_CALLBACK_TOKENS": TOKENS}):
        assert check_callback_tokens() == []


@pytest.mark.parametrize(("body", "status_code", "code"), [
    ('{"topic": "order.purchased", "payload": {"a": 1e400}}', 400, "IllegalArgument"),
    ('{"topic": "order.purchased", "payload": {"a": 100000000000000000000000}}', 400, "IllegalArgument"),
    ('{"topic": "order.purchased", "payload": {}, "occurredAt": "0001-01-01T00:00:00+01:00"}', 400, "BusValidation"),
    ('{"topic": "order.purchased", "payload": {}, "expireAt": "9999-12-31T23:59:59-01:00"}', 400, "BusValidation"),
])
def test_client_input_bson_or_json_cannot_hold_is_a_400_and_stores_nothing(bus_http_env, operator, body, status_code,
                                                                           code):
    response = operator.post("/bus/events/", body, content_type="application/json")
    assert response.status_code == status_code and error(response)["errorCode"] == code
    assert stored_counts(get_bus().store) == (0, 0)


def test_a_form_post_is_refused_so_no_cross_site_form_can_send(bus_http_env, operator):
    response = operator.post("/bus/events/", {"topic": "order.purchased", "payload": "x"})  # form-encoded
    assert response.status_code == 415 and error(response)["errorCode"] == "UnsupportedMediaType"
    assert stored_counts(get_bus().store) == (0, 0)


def test_an_oversized_body_is_a_json_413(bus_http_env, operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = operator.post("/bus/events/", {"topic": "order.purchased", "payload": {"x": "y" * 2000}},
                             format="json")
    assert response.status_code == 413 and error(response)["errorCode"] == "PayloadTooLarge"
    assert stored_counts(get_bus().store) == (0, 0)


@pytest.mark.parametrize("params", [{"page": "99999999999999999999"}, {"since": "0001-01-01T00:00:00+01:00"},
                                    {"until": "9999-12-31T23:59:59-01:00"}, {"status": "FAILED,NOPE"},
                                    {"status": "FAILED,"}, {"status": "failed"}])
def test_listing_parameters_out_of_range_are_a_400(bus_http_env, viewer, params):
    response = viewer.get("/bus/events/", params)
    assert response.status_code == 400 and error(response)["errorCode"] == "BusValidation"
    assert list(params) == [e["name"] for e in error(response)["bindingErrors"]]


def test_nul_characters_are_refused_naming_the_field(bus_http_env, operator, viewer):
    """Issue 26, item 2: event and trace ids in paths and query strings, a topic consumer's description."""
    for response, name in (
        (viewer.get("/bus/events/evt-\x00/"), "event_id"),
        (viewer.get("/bus/traces/tr\x00/"), "trace_id"),
        (viewer.get("/bus/events/", {"traceId": "t\x00"}), "traceId"),
        (operator.post("/bus/topic-consumers/", {"topic": "order.shipped", "consumerId": "message-service",
                                                 "description": "a\x00b"}, format="json"), "description"),
    ):
        assert response.status_code == 400, response.content
        assert error(response)["bindingErrors"][0]["name"] == name
    listed = viewer.get("/bus/topic-consumers/", {"topic": "order.shipped"}).json()["list"]
    assert listed == []  # nothing stored


def test_the_python_api_refuses_nul_in_an_envelope_and_keeps_a_consumers_error_readable(bus_http_env):
    from wow_django.exceptions import EnvelopeValidationError

    bus = get_bus()
    with pytest.raises(EnvelopeValidationError) as caught:
        bus.send("order.purchased", {"orderId": "o-1", "note": "a\x00b"})
    assert [e["name"] for e in caught.value.binding_errors] == ["payload.note"]
    sent = bus.send("order.purchased", {"orderId": "o-2"})
    row = bus.record_feedback(sent.event_id, "member-service", False, "decode failed at \x00")
    assert row["error"] == "decode failed at \\u0000"

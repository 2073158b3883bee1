"""The HTTP API through DRF's test client, on both local backends: every endpoint and every error."""

from __future__ import annotations

import json
import threading
import time
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from django.test import override_settings
from django.urls import reverse
from kombu.exceptions import OperationalError
from rest_framework import exceptions as drf
from rest_framework.test import APIClient

from sample_project.orders.aggregates import Customer, Order, OrderLine, PayOrder, PlaceOrder
from wow_django.application.gateway import derived_aggregate_id
from wow_django.application.runtime import get_runtime
from wow_django.domain import projection
from wow_django.domain.aggregate import CommandHandler
from wow_django.exceptions import (
    AggregateIsDeleted,
    AggregateNotFound,
    BusError,
    CommandValidationError,
    ConsumerNotExpected,
    DomainError,
    DuplicateAggregateId,
    DuplicateRequestId,
    EnvelopeValidationError,
    EventNotFound,
    EventVersionConflict,
    KeyAlreadyPrepared,
    KeyNotHeld,
    NotAggregateOwner,
    RecoverableStoreError,
    RepushRefused,
    TraceNotFound,
    TransportUnavailable,
    UnacknowledgedWriteError,
    UnknownAggregate,
    UnknownCommand,
)
from wow_django.http.errors import InvalidRequest, ResourceNotFound, error_response
from wow_django.http.tenancy import UserTenantResolver
from wow_django.http.urls import aggregate_urlpatterns
from wow_django.query.errors import QueryValidationError

# Wait stage SENT queues through the queued_commands fixture, not Celery.
pytestmark = pytest.mark.usefixtures("queued_commands")

ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "3.50"}]}


@pytest.fixture
def api(wow):
    return APIClient()


def headers(tenant=None, stage=None, request_id=None) -> dict:
    found = {}
    if tenant is not None:
        found["HTTP_COMMAND_TENANT_ID"] = tenant
    if stage is not None:
        found["HTTP_COMMAND_WAIT_STAGE"] = stage
    if request_id is not None:
        found["HTTP_COMMAND_REQUEST_ID"] = request_id
    return found


def post(api, path, body=None, **kw):
    if body is None:  # no body, still declared JSON: a body-less POST without a JSON content type is a 415
        return api.post(f"/api/{path}", content_type="application/json", **headers(**kw))
    return api.post(f"/api/{path}", body, format="json", **headers(**kw))


def get(api, path, HTTP_ACCEPT=None, **kw):
    extra = {"HTTP_ACCEPT": HTTP_ACCEPT} if HTTP_ACCEPT else {}
    return api.get(f"/api/{path}", **headers(**kw), **extra)


def place(api, tenant="t1", request_id=None, stage="SNAPSHOT", body=None) -> str:
    response = post(api, "order/place_order", body or ORDER, tenant=tenant, stage=stage, request_id=request_id)
    assert response.status_code == 200, response.json()
    return response.json()["aggregateId"]


def pay(api, order_id, tenant="t1", amount="7.00", **kw):
    return post(api, f"order/{order_id}/pay_order", {"amount": amount, "payment_id": "p-1"}, tenant=tenant,
                stage="SNAPSHOT", **kw)


#: The body of a refused command: its result, as Wow answers a failed command.
RESULT_KEYS = {"id", "waitCommandId", "contextName", "function", "result", "signalTime", "succeeded", "commandId",
               "requestId", "aggregateName", "aggregateId", "tenantId", "aggregateVersion", "stage", "events",
               "duplicate", "errorCode", "errorMsg", "bindingErrors"}


def assert_error(response, status: int, code: str, names=None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) in ({"errorCode", "errorMsg", "bindingErrors"}, RESULT_KEYS), set(body)
    assert response["Wow-Error-Code"] == body["errorCode"]  # as Wow's server repeats it
    if set(body) == RESULT_KEYS:
        assert body["succeeded"] is False and body["aggregateVersion"] is None and body["commandId"]
    assert body["errorCode"] == code, body
    assert body["errorMsg"]
    if names is not None:
        assert {e["name"] for e in body["bindingErrors"]} == set(names), body
    return body


def versions(order_id, name="order"):
    """The stored versions of an aggregate, whatever its tenant."""
    store = get_runtime().event_store
    key = store.locate(name, order_id)
    return [s.version for s in store.load(key)] if key is not None else []


# --- commands ----------------------------------------------------------------------------------------------


def test_create_command(api):
    response = post(api, "order/place_order", ORDER, tenant="t1", stage="SNAPSHOT")
    assert response.status_code == 200
    result = response.json()
    assert result["aggregateName"] == "order" and result["tenantId"] == "t1"
    assert (result["aggregateVersion"], result["stage"], result["events"]) == (1, "SNAPSHOT", ["order_placed"])
    assert (result["errorCode"], result["duplicate"], result["bindingErrors"]) == ("Ok", False, [])
    assert get(api, f"order/{result['aggregateId']}/state", tenant="t1").json()["total_amount"] == 7.0  # a JSON number


def test_request_id_derives_the_id_and_makes_retries_idempotent(api):
    first = post(api, "order/place_order", ORDER, tenant="t1", request_id="req-1").json()
    again = post(api, "order/place_order", ORDER, tenant="t1", request_id="req-1")
    assert again.status_code == 200
    assert first["aggregateId"] == again.json()["aggregateId"] == derived_aggregate_id("order", "t1", "req-1")
    assert (first["duplicate"], again.json()["duplicate"], again.json()["aggregateVersion"]) == (False, True, 1)
    assert versions(first["aggregateId"]) == [1]


def test_command_on_an_existing_aggregate(api):
    order_id = place(api)
    response = pay(api, order_id)
    assert response.status_code == 200 and response.json()["aggregateVersion"] == 2
    assert get(api, f"order/{order_id}/state", tenant="t1").json()["status"] == "PAID"


def test_default_wait_stage_is_processed(api):
    response = post(api, "order/place_order", ORDER)
    assert response.json()["stage"] == "PROCESSED" and response.json()["tenantId"] == "(0)"


def test_sent_is_queued_and_answers_202(api, queued_commands):
    api.force_authenticate(User(pk=9, username="frank"))
    # The stage is spelled as the schema's enum (and Wow's CommandStage): upper case.
    assert_error(post(api, "order/place_order", ORDER, tenant="t1", stage="sent", request_id="queued-1"), 400,
                 "CommandValidation", ["Command-Wait-Stage"])
    response = post(api, "order/place_order", ORDER, tenant="t1", stage="SENT", request_id="queued-1")
    assert response.status_code == 202
    assert (response.json()["stage"], response.json()["aggregateVersion"]) == ("SENT", None)
    (message,) = queued_commands
    assert {k: message[k] for k in ("aggregate_name", "command_name", "request_id", "tenant_id", "operator")} == {
        "aggregate_name": "order", "command_name": "place_order", "request_id": "queued-1", "tenant_id": "t1",
        "operator": "9"}
    assert message["aggregate_id"] == response.json()["aggregateId"] == derived_aggregate_id("order", "t1", "queued-1")
    assert versions(message["aggregate_id"]) == [1]  # the fixture ran the queued command


@pytest.mark.parametrize("blocked, takes", [("order_paid", ["order_paid"]), ("order_placed", None),
                                            ("order_placed", ["order_placed"])])
def test_a_stage_not_confirmed_within_the_wait_timeout_answers_202(api, wow, blocked, takes):
    """A projection that does not finish within WOW['COMMAND_WAIT_TIMEOUT_S']: stored, but not confirmed.

    It blocks on the pay command's own event, or on the earlier place
    command's event, which holds the projection's follower before the pay
    stream: either way the snapshot step is done and PROJECTED is not. A
    projection that does not take the pay command's events is not waited for.
    """
    started, release = threading.Event(), threading.Event()

    @projection("order", events=takes)
    def block(message):
        if message.name == blocked:
            started.set()
            release.wait(10)

    with override_settings(WOW={**wow, "COMMAND_WAIT_TIMEOUT_S": 0.2}):
        try:
            order_id = post(api, "order/place_order", ORDER, tenant="t1", stage="PROCESSED").json()["aggregateId"]
            if blocked == "order_placed":
                assert started.wait(10)  # the follower is held before the pay command is sent
            response = post(api, f"order/{order_id}/pay_order", {"amount": "7.00", "payment_id": "p-1"},
                            tenant="t1", stage="PROJECTED")
            assert started.is_set()
            result = response.json()
            assert versions(order_id) == [1, 2]  # stored all the same
            if takes == ["order_placed"]:
                assert (response.status_code, result["stage"], result["errorCode"]) == (200, "PROJECTED", "Ok")
                return
            assert response.status_code == 202
            assert (result["errorCode"], result["stage"], result["aggregateVersion"], result["events"]) == (
                "RequestTimeout", "SNAPSHOT", 2, ["order_paid"])
            assert "did not finish within 0.2s" in result["errorMsg"]
        finally:
            release.set()


def test_a_projected_wait_answers_within_its_command_wait_timeout_with_the_stage_reached(api, wow):
    """A stalled projection follower: a PROJECTED command holds its worker for its Command-Wait-Timeout, no
    longer, and says the stage it reached, even while a repeat of an earlier request of the same aggregate
    waits out a longer timeout in another thread of the worker (before: it waited behind that one)."""
    release = threading.Event()

    @projection("order")
    def stalled(message):
        release.wait(10)

    def send(path, body, request_id, timeout_ms):
        return api.post(f"/api/{path}", body, format="json", HTTP_COMMAND_TENANT_ID="t1",
                        HTTP_COMMAND_WAIT_STAGE="PROJECTED", HTTP_COMMAND_REQUEST_ID=request_id,
                        HTTP_COMMAND_WAIT_TIMEOUT=str(timeout_ms))

    try:
        started = time.monotonic()
        placed = send("order/place_order", ORDER, "stalled-1", 300)
        assert time.monotonic() - started < 2
        assert placed.status_code == 202
        order_id = placed.json()["aggregateId"]
        assert (placed.json()["stage"], placed.json()["errorCode"]) == ("SNAPSHOT", "RequestTimeout")
        repeat = threading.Thread(target=send, args=("order/place_order", ORDER, "stalled-1", 4000))
        repeat.start()
        time.sleep(0.3)  # the repeat is waiting
        started = time.monotonic()
        paid = send(f"order/{order_id}/pay_order", {"amount": "7.00", "payment_id": "p-1"}, "stalled-2", 300)
        took = time.monotonic() - started
    finally:
        release.set()
    repeat.join(10)
    assert took < 2, f"held {took:.1f} s"
    result = paid.json()
    assert paid.status_code == 202 and versions(order_id) == [1, 2]
    assert (result["stage"], result["errorCode"], result["aggregateVersion"]) == ("SNAPSHOT", "RequestTimeout", 2)
    assert "PROJECTED did not finish within 0.3s" in result["errorMsg"]


def test_wait_stage_header_is_validated(api):
    response = post(api, "order/place_order", ORDER, stage="EVENTUALLY")
    assert_error(response, 400, "CommandValidation", ["Command-Wait-Stage"])


def test_a_request_id_reused_with_another_body_is_wows_duplicate_request_id(api):
    first = post(api, "order/place_order", ORDER, request_id="idem-http")
    again = post(api, "order/place_order", ORDER, request_id="idem-http")
    assert again.status_code == 200 and again.json()["duplicate"]
    assert again.json()["commandId"] == first.json()["commandId"]
    other = {**ORDER, "items": [{"sku": "A-1", "quantity": 3, "unit_price": "3.50"}]}
    body = assert_error(post(api, "order/place_order", other, request_id="idem-http"), 400, "DuplicateRequestId")
    assert "new request id" in body["errorMsg"] and body["requestId"] == "idem-http"
    assert versions(first.json()["aggregateId"]) == [1]


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_a_request_refused_by_a_business_rule_is_refused_again_not_run_again(every_backend):
    """Issue 25, item 8: a refusal is kept under its request id for COMMAND_STATUS_TTL_S, as a Stripe
    idempotency key keeps it. The same request again gets the same refusal (marked as a repeat) even once the
    rule would let it pass; another body under that id is DuplicateRequestId; a new request id runs."""
    api = APIClient()
    with override_settings(WOW=every_backend):
        order = post(api, "order/place_order", ORDER).json()["aggregateId"]  # total 7.00
        short = {"amount": "1.00", "payment_id": "p-1"}
        first = assert_error(post(api, f"order/{order}/pay_order", short, request_id="pay-1"), 400, "AMOUNT_MISMATCH")
        assert first["duplicate"] is False and first["aggregateId"] == order
        again = assert_error(post(api, f"order/{order}/pay_order", short, request_id="pay-1"), 400, "AMOUNT_MISMATCH")
        assert again["duplicate"] is True and again["commandId"] == first["commandId"]
        # The full amount under the refused request's id: another body, refused as Wow's DuplicateRequestId.
        full = {"amount": "7.00", "payment_id": "p-1"}
        reused = assert_error(post(api, f"order/{order}/pay_order", full, request_id="pay-1"), 400,
                              "DuplicateRequestId")
        assert "was refused (AMOUNT_MISMATCH)" in reused["errorMsg"]
        # The same request on another order (a client-chosen aggregate) is another request: refused as reused.
        other = post(api, "order/place_order", ORDER).json()["aggregateId"]
        assert_error(post(api, f"order/{other}/pay_order", short, request_id="pay-1"), 400, "DuplicateRequestId")
        assert versions(order) == [1]  # nothing appended by any of them
        status = api.get("/api/order/request/pay-1/status")
        assert status.status_code == 200 and status.json()["errorCode"] == "AMOUNT_MISMATCH"
        paid = post(api, f"order/{order}/pay_order", full, request_id="pay-2")
        assert paid.status_code == 200 and versions(order) == [1, 2]
    # After COMMAND_STATUS_TTL_S the request id is free again: the request runs (and may now pass).
    with override_settings(WOW={**every_backend, "COMMAND_STATUS_TTL_S": 0.3}):
        again_order = post(api, "order/place_order", ORDER).json()["aggregateId"]
        assert_error(post(api, f"order/{again_order}/pay_order", short, request_id="pay-3"), 400, "AMOUNT_MISMATCH")
        assert_error(post(api, f"order/{again_order}/pay_order", full, request_id="pay-3"), 400, "DuplicateRequestId")
        time.sleep(0.5)
        assert post(api, f"order/{again_order}/pay_order", full, request_id="pay-3").status_code == 200


@pytest.mark.parametrize("request_id", ["x" * 129, "tab\there"])
def test_request_id_header_is_validated(api, request_id):
    response = post(api, "order/place_order", ORDER, request_id=request_id)
    body = assert_error(response, 400, "CommandValidation", ["Command-Request-Id"])  # the header, as sent
    assert request_id not in body["errorMsg"] and f"got {len(request_id)} characters" in body["errorMsg"]


def test_command_bodies_are_validated(api):
    body = {"customer_id": "", "items": [{"sku": "bad sku", "quantity": 0, "unit_price": "1"}], "colour": "red"}
    response = post(api, "order/place_order", body)
    assert_error(response, 400, "CommandValidation",
                 ["customer_id", "items.0.sku", "items.0.quantity", "colour"])
    assert_error(post(api, "order/place_order", [1, 2]), 400, "CommandValidation")
    assert_error(api.post("/api/order/place_order", content_type="application/json"), 400, "CommandValidation",
                 ["customer_id", "items"])
    assert_error(api.post("/api/order/place_order"), 415, "UnsupportedMediaType")
    order_id = place(api)
    assert_error(pay(api, order_id, amount="lots"), 400, "CommandValidation", ["amount"])
    assert versions(order_id) == [1]


def test_domain_rules_answer_400_with_the_commands_result(api):
    # As Wow's server: a business rule broken is a 400, its body the command's result (ids included).
    order_id = place(api)
    response = pay(api, order_id, amount="1.00", request_id="pay-short")
    body = assert_error(response, 400, "AMOUNT_MISMATCH")
    assert response["Wow-Error-Code"] == "AMOUNT_MISMATCH"
    assert (body["aggregateId"], body["requestId"], body["aggregateName"], body["stage"]) == (
        order_id, "pay-short", "order", "PROCESSED")
    assert body["function"] == {"functionKind": "COMMAND", "contextName": body["contextName"],
                                "processorName": "order", "name": "pay_order"}
    assert body["waitCommandId"] == body["commandId"] and body["id"] and body["signalTime"] > 0
    pay(api, order_id)
    assert_error(pay(api, order_id), 400, "ORDER_ALREADY_PAID")
    body = {"username": "alice", "display_name": "Alice"}
    assert post(api, "customer/register_customer", body).status_code == 200
    assert_error(post(api, "customer/register_customer", body), 400, "USERNAME_TAKEN")


def test_a_username_is_unique_within_its_tenant_only(api):
    # Another tenant's names neither collide with nor show through this tenant's (issue 26, item 8).
    body = {"username": "alice", "display_name": "Alice"}
    assert post(api, "customer/register_customer", body, tenant="acme").status_code == 200
    assert post(api, "customer/register_customer", body, tenant="globex").status_code == 200
    assert_error(post(api, "customer/register_customer", body, tenant="globex"), 400, "USERNAME_TAKEN")


@pytest.mark.parametrize(("error", "status", "code"), [
    (EventVersionConflict("order", "x", 2), 409, "EventVersionConflict"),
    (DuplicateAggregateId("order", "x"), 400, "DuplicateAggregateId"),
    (DuplicateRequestId("order", "x", "r"), 400, "DuplicateRequestId"),
    (RecoverableStoreError("primary stepped down"), 503, "StoreUnavailable"),
])
def test_store_errors_are_mapped(api, monkeypatch, error, status, code):
    def refuse(stream):
        raise error

    monkeypatch.setattr(get_runtime().event_store, "append", refuse)
    response = post(api, "order/place_order", ORDER)
    assert_error(response, status, code)
    if status == 503:
        assert response["Retry-After"] == "1"


def test_delete_and_recover(api):
    order_id = place(api)
    deleted = api.delete(f"/api/order/{order_id}", **headers(tenant="t1", stage="SNAPSHOT"))
    assert deleted.status_code == 200
    assert (deleted.json()["aggregateVersion"], deleted.json()["events"]) == (2, ["aggregate_deleted"])
    assert get(api, f"order/{order_id}/snapshot", tenant="t1").json()["deleted"] is True
    assert_error(get(api, f"order/{order_id}/state", tenant="t1"), 410, "IllegalAccessDeletedAggregate")
    assert post(api, "order/snapshot/count", {}, tenant="t1").json() == 0
    assert post(api, "order/snapshot/count", {"operator": "DELETED", "value": "DELETED"}, tenant="t1").json() == 1
    assert_error(pay(api, order_id), 410, "IllegalAccessDeletedAggregate")
    assert_error(api.delete(f"/api/order/{order_id}", **headers(tenant="t1")), 410, "IllegalAccessDeletedAggregate")
    recovered = api.put(f"/api/order/{order_id}/recover", **headers(tenant="t1", stage="SNAPSHOT"))
    assert recovered.status_code == 200 and recovered.json()["events"] == ["aggregate_recovered"]
    assert get(api, f"order/{order_id}/state", tenant="t1").json()["status"] == "PLACED"
    assert_error(api.put(f"/api/order/{order_id}/recover", **headers(tenant="t1")), 400, "AggregateNotDeleted")
    response = api.put(f"/api/order/{order_id}/recover", {"why": "because"}, format="json", **headers(tenant="t1"))
    assert_error(response, 400, "CommandValidation", ["why"])


def test_unknown_aggregates_commands_and_routes_answer_json_404(api):
    assert_error(post(api, "invoice/issue_invoice", {}), 404, "NotFound")
    assert_error(post(api, "invoice/snapshot/list", {}), 404, "NotFound")
    assert_error(post(api, "order/refund_order", {}), 404, "NotFound")
    assert_error(post(api, "order/some-id/refund_order", {}), 404, "NotFound")
    assert_error(post(api, "order/some-id/register_customer", {}), 404, "NotFound")
    body = assert_error(post(api, "order/refund_order", {}), 404, "NotFound")
    assert body["errorMsg"] == "'refund_order' is not a command of aggregate 'order'."
    for path in ("", "order", "order/x/y/z/w/v", "order/x//state", "order/x/event/a/b", "order/x/event/-1/2",
                 "order/x%0Ay/event/-1/2", "order/x/event/%0A/2"):  # line breaks too (found by fuzzing)
        assert_error(get(api, path), 404, "NotFound")


def test_a_command_on_the_wrong_route_is_told_the_right_one(api):
    body = assert_error(post(api, "order/pay_order", {"amount": "1"}), 404, "NotFound")
    assert body["errorMsg"] == "'pay_order' acts on an existing order: POST order/{id}/pay_order."
    body = assert_error(post(api, "order/o-1/place_order", {}), 404, "NotFound")
    assert body["errorMsg"] == "'place_order' creates a new order: POST order/place_order (no aggregate id in the path)."


def test_commands_on_unknown_ids_answer_404(api):
    assert_error(pay(api, "no-such-order"), 404, "NotFound")
    assert_error(api.delete("/api/order/no-such-order"), 404, "NotFound")


def test_wrong_methods_answer_405(api):
    assert_error(get(api, "order/snapshot/paged"), 405, "MethodNotAllowed")
    assert_error(post(api, "order/x/state", {}), 405, "MethodNotAllowed")
    assert_error(api.post("/api/order/x/recover", {}, format="json"), 405, "MethodNotAllowed")
    assert_error(api.patch("/api/order/place_order", {}, format="json"), 405, "MethodNotAllowed")


def test_a_path_id_is_validated(api):
    long_id = "x" * 129
    for response in (get(api, f"order/{long_id}/state"), get(api, f"order/{long_id}/snapshot"),
                     get(api, f"order/{long_id}/event/1/2"), pay(api, long_id)):
        assert_error(response, 400, "IllegalArgument", ["id"])


# --- reads by id ---------------------------------------------------------------------------------------------


def test_state_and_snapshot_by_id(api):
    order_id = place(api)
    state = get(api, f"order/{order_id}/state", tenant="t1")
    # Decimals as JSON numbers (typed values): the "3.50" sent is the number 3.5.
    assert state.status_code == 200 and state.json()["items"] == [{"sku": "A-1", "quantity": 2, "unit_price": 3.5}]
    snapshot = get(api, f"order/{order_id}/snapshot", tenant="t1").json()
    assert (snapshot["aggregateId"], snapshot["version"], snapshot["tenantId"]) == (order_id, 1, "t1")
    assert snapshot["state"] == state.json()
    assert_error(get(api, "order/nothing/state", tenant="t1"), 404, "NotFound")
    assert_error(get(api, "order/nothing/snapshot", tenant="t1"), 404, "NotFound")


def test_event_range(api):
    order_id = place(api)
    pay(api, order_id)
    post(api, f"order/{order_id}/ship_order", {"tracking_number": "T-1"}, tenant="t1")
    everything = get(api, f"order/{order_id}/event/1/{2**31 - 1}", tenant="t1").json()
    assert [s["version"] for s in everything] == [1, 2, 3]
    assert [e["name"] for s in everything for e in s["body"]] == ["order_placed", "order_paid", "order_shipped"]
    assert everything[0]["aggregateId"] == order_id and "id" in everything[0] and "_id" not in everything[0]
    assert [s["version"] for s in get(api, f"order/{order_id}/event/2/2", tenant="t1").json()] == [2]
    assert get(api, f"order/{order_id}/event/7/9", tenant="t1").json() == []
    assert_error(get(api, "order/nothing/event/1/2", tenant="t1"), 404, "NotFound")
    # A tail below the head is an empty range, as the schema allows it (no version lies in it).
    assert get(api, f"order/{order_id}/event/3/2", tenant="t1").json() == []
    assert_error(get(api, "order/nothing/event/3/2", tenant="t1"), 404, "NotFound")
    assert_error(get(api, f"order/{order_id}/event/0/2", tenant="t1"), 400, "IllegalArgument", ["head"])
    assert_error(get(api, f"order/{order_id}/event/1/{10**30}", tenant="t1"), 400, "IllegalArgument", ["tail"])


def test_an_event_range_is_bounded_by_the_query_limit(wow):
    """A range read loads at most QUERY_MAX_LIMIT + 1 streams, however wide the range asked for."""
    with override_settings(WOW={**wow, "QUERY_MAX_LIMIT": 2}):
        api = APIClient()
        order_id = place(api)
        pay(api, order_id)
        post(api, f"order/{order_id}/ship_order", {"tracking_number": "T-1"}, tenant="t1")
        loaded = []
        store = get_runtime().event_store
        load = store.load
        here = threading.get_ident()

        def recording(key, head, tail):
            if threading.get_ident() == here:  # the requests' loads; a snapshot lane may load in its own thread
                loaded.append((head, tail))
            return load(key, head, tail)

        store.load = recording
        response = get(api, f"order/{order_id}/event/1/{2**31 - 1}", tenant="t1")
        assert_error(response, 400, "IllegalArgument", ["tail"])
        assert "more than 2 event streams" in response.json()["errorMsg"] and "1/2" in response.json()["errorMsg"]
        assert [s["version"] for s in get(api, f"order/{order_id}/event/2/{2**31 - 1}", tenant="t1").json()] == [2, 3]
        assert [s["version"] for s in get(api, f"order/{order_id}/event/1/2", tenant="t1").json()] == [1, 2]
        assert loaded == [(1, 3), (2, 4), (1, 2)]


# --- queries ---------------------------------------------------------------------------------------------------


@pytest.fixture
def orders(api):
    """Three orders of t1 (one paid), one of t2."""
    ids = [place(api, body={**ORDER, "customer_id": f"c-{n}"}) for n in range(3)]
    pay(api, ids[1])
    other = place(api, tenant="t2")
    return SimpleNamespace(t1=ids, t2=other)


def test_snapshot_queries(api, orders):
    single = post(api, "order/snapshot/single", {"condition": {"field": "state.status", "operator": "EQ",
                                                               "value": "PAID"}}, tenant="t1")
    assert single.status_code == 200 and single.json()["aggregateId"] == orders.t1[1]
    listed = post(api, "order/snapshot/list", {"sort": [{"field": "state.customer_id", "direction": "DESC"}],
                                               "projection": {"include": ["state.customer_id"]}, "limit": 2},
                  tenant="t1")
    assert listed.json() == [{"aggregateId": orders.t1[2], "state": {"customer_id": "c-2"}},
                             {"aggregateId": orders.t1[1], "state": {"customer_id": "c-1"}}]
    paged = post(api, "order/snapshot/paged", {"sort": [{"field": "state.customer_id"}],
                                               "pagination": {"index": 2, "size": 2}}, tenant="t1").json()
    assert paged["total"] == 3 and [s["aggregateId"] for s in paged["list"]] == [orders.t1[2]]
    assert post(api, "order/snapshot/count", {"field": "state.status", "operator": "EQ", "value": "PLACED"},
                tenant="t1").json() == 2
    assert post(api, "order/snapshot/count", None, tenant="t2").json() == 1
    # A list query's body sent to count: told that count takes the condition itself.
    wrapped = assert_error(post(api, "order/snapshot/count", {"condition": {"operator": "ALL"}}, tenant="t1"),
                           400, "IllegalArgument")
    assert wrapped["bindingErrors"][0]["name"] == "condition.condition"
    assert "count takes a bare condition" in wrapped["bindingErrors"][0]["msg"]
    missing = post(api, "order/snapshot/single", {"condition": {"operator": "ID", "value": orders.t2}}, tenant="t1")
    assert_error(missing, 404, "NotFound")


def test_the_state_at_a_version_and_at_a_time(api):
    # Wow's loadVersioned and loadTimeBased: GET {id}/state/{version} and {id}/state/time/{createTime}.
    order_id = place(api, stage="PROCESSED")
    pay(api, order_id)
    post(api, f"order/{order_id}/ship_order", {"tracking_number": "T-1"}, tenant="t1")
    statuses = [get(api, f"order/{order_id}/state/{v}", tenant="t1").json()["status"] for v in (1, 2, 3, 99)]
    assert statuses == ["PLACED", "PAID", "SHIPPED", "SHIPPED"]
    times = [s["createTime"] for s in get(api, f"order/{order_id}/event/1/3", tenant="t1").json()]
    for time_ms in times:  # at each stream's time: the last version created by then (equal times: the later)
        expected = ["PLACED", "PAID", "SHIPPED"][max(v for v, t in enumerate(times) if t <= time_ms)]
        assert get(api, f"order/{order_id}/state/time/{time_ms}", tenant="t1").json()["status"] == expected
    assert_error(get(api, f"order/{order_id}/state/time/{times[0] - 1}", tenant="t1"), 404, "NotFound")
    assert_error(get(api, f"order/{order_id}/state/0", tenant="t1"), 400, "IllegalArgument", ["version"])
    assert_error(get(api, f"order/{order_id}/state/1", tenant="t2"), 404, "NotFound")  # another tenant's
    assert_error(get(api, f"order/{order_id}/state/time/{times[-1]}", tenant="t2"), 404, "NotFound")


def test_state_queries_answer_the_states_only(api, orders):
    # Wow's listState, pagedState and singleState (issue 24, item 1): the snapshot queries, states only.
    by_customer = {"sort": [{"field": "state.customer_id", "direction": "DESC"}]}
    listed = post(api, "order/snapshot/list/state", {**by_customer, "limit": 2}, tenant="t1")
    assert listed.status_code == 200, listed.content
    assert [(s["customer_id"], s["status"]) for s in listed.json()] == [("c-2", "PLACED"), ("c-1", "PAID")]
    assert "aggregateId" not in listed.json()[0] and set(listed.json()[0]) >= {"customer_id", "items", "total_amount"}
    projected = post(api, "order/snapshot/list/state", {**by_customer, "projection": {"include": ["state.status"]}},
                     tenant="t1").json()
    assert projected == [{"status": "PLACED"}, {"status": "PAID"}, {"status": "PLACED"}]
    paged = post(api, "order/snapshot/paged/state", {**by_customer, "pagination": {"index": 2, "size": 2}},
                 tenant="t1").json()
    assert paged["total"] == 3 and [s["customer_id"] for s in paged["list"]] == ["c-0"]
    single = post(api, "order/snapshot/single/state", {"condition": {"operator": "ID", "value": orders.t1[1]}},
                  tenant="t1").json()
    assert (single["customer_id"], single["status"]) == ("c-1", "PAID")
    # Another tenant's aggregate is not found; the query rules hold as on the snapshot routes.
    assert_error(post(api, "order/snapshot/single/state", {"condition": {"operator": "ID", "value": orders.t2}},
                      tenant="t1"), 404, "NotFound")
    assert [s["customer_id"] for s in post(api, "order/snapshot/list/state", {}, tenant="t2").json()] == ["c-1"]
    assert_error(post(api, "order/snapshot/list/state", {"limit": 1001}), 400, "IllegalArgument", ["limit"])
    assert_error(post(api, "order/snapshot/count/state", {}), 404, "NotFound")
    assert_error(post(api, "order/event/list/state", {}), 404, "NotFound")


def test_event_queries(api, orders):
    listed = post(api, "order/event/list", {"condition": {"operator": "AGGREGATE_ID", "value": orders.t1[1]},
                                            "sort": [{"field": "version"}]}, tenant="t1").json()
    assert [(s["version"], s["body"][0]["name"]) for s in listed] == [(1, "order_placed"), (2, "order_paid")]
    paged = post(api, "order/event/paged", {"pagination": {"index": 1, "size": 3}}, tenant="t1").json()
    assert paged["total"] == 4 and len(paged["list"]) == 3
    assert post(api, "order/event/count", {}, tenant="t2").json() == 1
    assert post(api, "order/event/count", {"field": "body.name", "operator": "EQ", "value": "order_paid"},
                tenant="t1").json() == 1


def test_queries_never_see_another_tenant(api, orders):
    escape = {"operator": "OR", "children": [{"operator": "TENANT_ID", "value": "t2"}, {"operator": "ALL"}]}
    for path in ("order/snapshot/list", "order/event/list"):
        found = post(api, path, {"condition": escape, "limit": 100}, tenant="t1").json()
        assert found and {item["tenantId"] for item in found} == {"t1"}
    assert post(api, "order/snapshot/count", {"operator": "ID", "value": orders.t2}, tenant="t1").json() == 0
    assert post(api, "order/event/count", {"operator": "AGGREGATE_ID", "value": orders.t2}, tenant="t1").json() == 0


def test_one_tenant_cannot_read_or_command_anothers_aggregate(api):
    order_id = place(api, tenant="t1", request_id="shared-request")
    for response in (get(api, f"order/{order_id}/state", tenant="t2"),
                     get(api, f"order/{order_id}/snapshot", tenant="t2"),
                     get(api, f"order/{order_id}/event/1/9", tenant="t2"),
                     pay(api, order_id, tenant="t2"),
                     api.delete(f"/api/order/{order_id}", **headers(tenant="t2"))):
        assert_error(response, 404, "NotFound")
    # A request id another tenant used answers neither with nor about that tenant's command:
    # the same request id creates t2's own order.
    own = post(api, "order/place_order", ORDER, tenant="t2", request_id="shared-request")
    assert own.status_code == 200 and not own.json()["duplicate"]
    assert own.json()["aggregateId"] != order_id and own.json()["tenantId"] == "t2"
    assert post(api, "order/place_order", ORDER, tenant="t2", request_id="shared-request").json()["duplicate"]
    paid = pay(api, order_id, tenant="t1", request_id="pay-1")
    assert paid.status_code == 200
    assert_error(pay(api, order_id, tenant="t2", request_id="pay-1"), 404, "NotFound")
    assert versions(order_id) == [1, 2]


def test_a_tenant_header_is_validated(api):
    assert_error(get(api, "order/x/state", tenant="t" * 129), 400, "IllegalArgument", ["Command-Tenant-Id"])
    assert_error(post(api, "order/snapshot/count", {}, tenant="bad\ttenant"), 400, "IllegalArgument")


# --- query safety -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "names"), [
    ({"condition": {"operator": "RAW", "value": {"state.status": "PAID"}}}, ["condition.operator"]),
    ({"condition": {"field": "state.status", "operator": "EQ", "value": {"$gt": ""}}}, ["condition.value"]),
    ({"condition": {"field": "state.tags", "operator": "IN", "value": [{"$where": "sleep(1000)"}]}},
     ["condition.value[0]"]),
    ({"condition": {"field": "$where", "operator": "EQ", "value": 1}}, ["condition.field"]),
    ({"condition": {"field": "state..status", "operator": "EQ", "value": 1}}, ["condition.field"]),
    ({"condition": {"field": "a", "operator": "$where", "value": "1"}}, ["condition.operator"]),
    ({"sort": [{"field": "$natural"}]}, ["sort[0].field"]),
    ({"projection": {"include": ["state.$"]}}, ["projection.include[0]"]),
    ({"pagination": {"index": 1, "size": 201}}, ["pagination.size"]),
    ({"pagination": {"index": "1"}}, ["pagination.index"]),
    ({"pagination": {"index": 10**15, "size": 200}}, ["pagination.index"]),
    ({"condition": {"operator": "MATCH", "value": "x"}, "pagination": {"size": True}}, ["pagination.size"]),
])
def test_unsafe_or_invalid_queries_are_refused_before_any_read(api, wow, monkeypatch, body, names):
    reads = []
    if wow["STORAGE"] == "mongo":
        store = get_runtime().snapshot_store
        monkeypatch.setattr(store, "collection", lambda name: reads.append(name))
    response = post(api, "order/snapshot/paged", body)
    assert_error(response, 400, "IllegalArgument", names)
    assert reads == []


def test_nesting_depth_and_list_limit_are_capped(api):
    condition = {"operator": "ALL"}
    for _ in range(16):
        condition = {"operator": "AND", "children": [condition]}
    body = assert_error(post(api, "order/snapshot/count", condition), 400, "IllegalArgument")
    assert "deeper than 16" in body["errorMsg"]
    with override_settings(WOW={**stores_settings(), "QUERY_MAX_DEPTH": 40}):
        assert post(api, "order/snapshot/count", condition).json() == 0
    assert_error(post(api, "order/snapshot/list", {"limit": 1001}), 400, "IllegalArgument", ["limit"])


def stores_settings() -> dict:
    from django.conf import settings

    return dict(settings.WOW)


def test_page_size_cap_follows_the_setting(api):
    with override_settings(WOW={**stores_settings(), "QUERY_MAX_PAGE_SIZE": 5, "QUERY_MAX_LIMIT": 3}):
        assert_error(post(api, "order/snapshot/paged", {"pagination": {"size": 6}}), 400, "IllegalArgument",
                     ["pagination.size"])
        assert post(api, "order/snapshot/paged", {"pagination": {"size": 5}}).json() == {"total": 0, "list": []}
        assert_error(post(api, "order/event/list", {"limit": 4}), 400, "IllegalArgument", ["limit"])


def test_raw_needs_the_setting_and_never_runs_code(api, wow):
    raw = {"condition": {"operator": "RAW", "value": {"state.status": {"$in": ["PLACED"]}}}}
    assert_error(post(api, "order/snapshot/list", raw, tenant="t1"), 400, "IllegalArgument")
    with override_settings(WOW={**stores_settings(), "QUERY_ALLOW_RAW": True}):
        place(api, tenant="t1")  # inside: changing WOW gives the in-memory backend fresh stores
        allowed = post(api, "order/snapshot/list", raw, tenant="t1")
        if wow["STORAGE"] == "mongo":
            assert allowed.status_code == 200 and len(allowed.json()) == 1
        else:  # the evaluator has no MongoDB to hand a raw filter to
            assert_error(allowed, 400, "IllegalArgument")
        for code in ({"$where": "true"}, {"$expr": {"$eq": [1, 1]}}, {"a": {"$function": {}}},
                     {"$and": [{"b": {"$accumulator": {}}}]}):
            body = {"condition": {"operator": "RAW", "value": code}}
            assert_error(post(api, "order/snapshot/list", body, tenant="t1"), 400, "IllegalArgument")


def test_text_operators_match_literally(api):
    place(api, body={**ORDER, "customer_id": "a.b*c (x)"})
    place(api, body={**ORDER, "customer_id": "aXbbc x"})
    for text, count in ((".*", 0), ("b*c (", 1), ("A.B", 0)):
        condition = {"field": "state.customer_id", "operator": "CONTAINS", "value": text}
        assert post(api, "order/snapshot/count", condition, tenant="t1").json() == count, text
    ignore_case = {"field": "state.customer_id", "operator": "STARTS_WITH", "value": "A.B",
                   "options": {"ignoreCase": True}}
    assert post(api, "order/snapshot/count", ignore_case, tenant="t1").json() == 1


def test_match_full_text_search(api):
    place(api, body={**ORDER, "customer_id": "gift shop"})
    place(api, body={**ORDER, "customer_id": "bakery"})
    found = post(api, "order/snapshot/list", {"condition": {"operator": "MATCH", "value": "GIFT"}}, tenant="t1")
    assert [s["state"]["customer_id"] for s in found.json()] == ["gift shop"]


# --- what clients can send: never a 500 -----------------------------------------------------------------------

BAD_BODIES = [
    (b'{"condition": ', 400, "IllegalArgument"),
    (b"[" * 50_000, 400, "IllegalArgument"),
    (b'{"limit": NaN}', 400, "IllegalArgument"),
    (b'{"limit": 1e999}', 400, "IllegalArgument"),
    (b'{"limit": ' + b"9" * 5000 + b"}", 400, "IllegalArgument"),
    (b'{"limit": 99999999999999999999}', 400, "IllegalArgument"),
    (b'{"limit": "\\udc00"}', 400, "IllegalArgument"),
    (b'{"\\ud800": 1}', 400, "IllegalArgument"),
    (b'\xff\xfe{"limit": 1}', 400, "IllegalArgument"),
    (b'"just a string"', 400, None),
    (b"[]", 400, None),
    (b"123", 400, None),
    (b'{"limit": 3.5}', 400, None),
    (b'{"limit": -1}', 400, None),
    (b'{"condition": {"field": "state.\xe5\x90\x8d", "operator": "EQ", "value": 1}}', 400, "IllegalArgument"),
    (b'{"condition": {"field": "state.name", "operator": "EQ", "value": "\xf0\x9f\x98\x80 \xe5\x90\x8d"}}', 200, None),
    (b'{"condition": {"field": "state.name", "operator": "GT", "value": 1.7976931348623157e308}}', 200, None),
    (b'{"condition": {"field": "state.name", "operator": "EQ", "value": 9223372036854775807}}', 200, None),
    (b'{"condition": {"field": "state.name", "operator": "CONTAINS", "value": "\\u0000"}}', 400, "IllegalArgument"),
    (b'{"condition": {"operator": "TODAY", "field": "t", "options": {"zoneId": "Mars/Base"}}}', 400, None),
    (b'{"condition": {"operator": "TODAY", "field": "t", "options": {"datePattern": "QQQ"}}}', 400, None),
    (b'{"condition": {"operator": "RECENT_DAYS", "field": "t", "value": 10000000}}', 400, None),
    (b"null", 200, None),
]


@pytest.mark.parametrize(("raw", "status", "code"), BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bodies_a_client_can_send(api, raw, status, code):
    for path in ("order/snapshot/list", "order/event/list"):
        response = api.post(f"/api/{path}", data=raw, content_type="application/json")
        assert response.status_code == status, (path, response.content)
        if status >= 400:
            body = response.json()
            assert set(body) == {"errorCode", "errorMsg", "bindingErrors"}
            if code:
                assert body["errorCode"] == code


@pytest.mark.parametrize("raw", [row[0] for row in BAD_BODIES if row[1] == 400][:9])
def test_bad_json_to_commands(api, raw):
    order_id = place(api, tenant="(0)")
    for path in ("order/place_order", f"order/{order_id}/pay_order"):
        assert_error(api.post(f"/api/{path}", data=raw, content_type="application/json"), 400, "IllegalArgument")


@pytest.mark.parametrize("body", [
    {"customer_id": 5, "items": "many"},
    {"customer_id": "c", "items": [{"sku": "A", "quantity": 10**18, "unit_price": 1e308}]},
    {"customer_id": "c", "items": [{"sku": "A", "quantity": 1, "unit_price": "1" * 5000}]},
    {"customer_id": "c", "items": [{"sku": "A", "quantity": True, "unit_price": None}]},
    {"customer_id": {"$gt": ""}, "items": []},
    {"customer_id": "c", "items": [{}] * 101},
])
def test_wrong_types_in_command_bodies(api, body):
    assert_error(post(api, "order/place_order", body), 400, "CommandValidation")


def test_unicode_round_trips(api):
    body = {**ORDER, "customer_id": "客户 😀 ünïcödé"}
    order_id = place(api, body=body)
    assert get(api, f"order/{order_id}/state", tenant="t1").json()["customer_id"] == "客户 😀 ünïcödé"
    found = post(api, "order/snapshot/count", {"field": "state.customer_id", "operator": "EQ",
                                               "value": "客户 😀 ünïcödé"}, tenant="t1")
    assert found.json() == 1


def test_non_json_and_oversized_bodies(api):
    form = api.post("/api/order/snapshot/list", data="limit=1", content_type="application/x-www-form-urlencoded")
    assert_error(form, 415, "UnsupportedMediaType")
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100):
        big = api.post("/api/order/snapshot/list", data=json.dumps({"condition": {"operator": "IDS",
                       "value": ["x" * 50] * 5}}), content_type="application/json")
        assert_error(big, 413, "PayloadTooLarge")
    assert_error(api.post("/api/order/snapshot/list", data=b"{}", content_type="application/json",
                          HTTP_ACCEPT="image/png"), 406, "NotAcceptable")


def test_a_request_django_refuses_before_the_api_is_a_json_400_on_api_routes(api):
    """A Host header Django does not allow (found by the schema fuzzing): the sample's handler400
    (wow_django.http.handlers.bad_request) answers the API's JSON error on the API's routes, Django's page
    elsewhere."""
    response = api.post("/api/customer/event/paged", data=b"{}", content_type="application/json",
                        HTTP_HOST="oJ4{}fk[}V~^a")
    body = assert_error(response, 400, "BadRequest")
    assert "DisallowedHost" in body["errorMsg"]
    elsewhere = api.get("/admin/login/", HTTP_HOST="oJ4{}fk[}V~^a")
    assert elsewhere.status_code == 400 and elsewhere["Content-Type"].startswith("text/html")


def test_a_browser_gets_the_browsable_api_and_clients_get_json(api):
    """The aggregate endpoints offer DRF's browsable API to what asks for text/html (a browser); JSON stays
    what every other client gets."""
    order_id = place(api)
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    page = get(api, f"order/{order_id}/state", tenant="t1", HTTP_ACCEPT=browser)
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    assert b"PLACED" in page.content and b"Django REST framework" in page.content
    listed = api.post("/api/order/snapshot/list", data=b"{}", content_type="application/json",
                      HTTP_COMMAND_TENANT_ID="t1", HTTP_ACCEPT=browser)
    assert listed.status_code == 200 and listed["Content-Type"].startswith("text/html")
    missing = get(api, "order/nobody/state", tenant="t1", HTTP_ACCEPT=browser)
    assert missing.status_code == 404 and b"NotFound" in missing.content  # errors too, with their status
    for accept in (None, "*/*", "application/json"):
        extra = {"HTTP_ACCEPT": accept} if accept else {}
        response = get(api, f"order/{order_id}/state", tenant="t1", **extra)
        assert response["Content-Type"] == "application/json" and response.json()["status"] == "PLACED"


# --- authentication, permissions, operator, tenant resolver -------------------------------------------------


def test_api_settings_override_drf_defaults(api, wow):
    policy = {"API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
              "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    with override_settings(WOW={**stores_settings(), **policy}):
        response = post(api, "order/snapshot/count", {})
        assert_error(response, 401, "NotAuthenticated")
        assert response["WWW-Authenticate"].startswith("Basic")
        assert_error(post(api, "order/place_order", ORDER), 401, "NotAuthenticated")
        api.force_authenticate(User(pk=7, username="alice"))
        assert post(api, "order/snapshot/count", {}).status_code == 200


def test_without_an_authenticate_header_unauthenticated_is_403(api):
    with override_settings(WOW={**stores_settings(),
                                "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}):
        # DRF's default authentication starts with SessionAuthentication, which has no challenge.
        assert_error(post(api, "order/snapshot/count", {}), 403, "NotAuthenticated")


def test_an_aggregate_can_have_its_own_policy(api, monkeypatch):
    monkeypatch.setattr(Order, "api_permission_classes", ["rest_framework.permissions.IsAuthenticated"])
    assert_error(post(api, "order/snapshot/count", {}), 403, "NotAuthenticated")
    assert post(api, "customer/snapshot/count", {}).status_code == 200
    from rest_framework.permissions import AllowAny

    monkeypatch.setattr(Customer, "api_permission_classes", [AllowAny])
    with override_settings(WOW={**stores_settings(),
                                "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"]}):
        assert post(api, "customer/snapshot/count", {}).status_code == 200
        assert_error(post(api, "order/snapshot/count", {}), 403, "NotAuthenticated")


def test_commands_only_for_authenticated_users(api):
    with override_settings(WOW={**stores_settings(),
                                "API_PERMISSION_CLASSES": ["wow_django.http.permissions.IsAuthenticatedForCommands"]}):
        assert post(api, "order/snapshot/count", {}).status_code == 200
        assert get(api, "order/x/state").status_code == 404
        assert_error(post(api, "order/place_order", ORDER), 403, "NotAuthenticated")
        assert_error(api.delete("/api/order/x"), 403, "NotAuthenticated")
        api.force_authenticate(User(pk=3, username="bob"))
        assert post(api, "order/place_order", ORDER).status_code == 200


def test_permission_denied_by_a_custom_class(api, monkeypatch):
    from rest_framework.permissions import BasePermission

    class NoShipping(BasePermission):
        message = "Shipping is closed today."

        def has_permission(self, request, view):
            return getattr(view.command, "command_name", "") != "ship_order"

    monkeypatch.setattr(Order, "api_permission_classes", [NoShipping])
    api.force_authenticate(User(pk=5, username="erin"))  # DRF answers anonymous refusals with NotAuthenticated
    order_id = place(api)
    assert pay(api, order_id).status_code == 200
    body = assert_error(post(api, f"order/{order_id}/ship_order", {"tracking_number": "T"}, tenant="t1"), 403,
                        "PermissionDenied")
    assert body["errorMsg"] == "Shipping is closed today."


def test_operator_and_owner_come_from_the_user(api):
    api.force_authenticate(User(pk=42, username="carol"))
    order_id = place(api)
    snapshot = get(api, f"order/{order_id}/snapshot", tenant="t1").json()
    assert (snapshot["ownerId"], snapshot["firstOperator"], snapshot["operator"]) == ("42", "42", "42")
    stream = get(api, f"order/{order_id}/event/1/1", tenant="t1").json()[0]
    assert stream["ownerId"] == "42" and stream["header"]["command_operator"] == "42"
    api.force_authenticate(User(pk=43, username="dave"))
    pay(api, order_id)
    snapshot = get(api, f"order/{order_id}/snapshot", tenant="t1").json()
    assert (snapshot["ownerId"], snapshot["operator"]) == ("42", "43")


OWNER_POLICY = {"API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated",
                                           "wow_django.http.permissions.IsOwnerOrPermitted"]}


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_the_owner_policy_refuses_commands_on_another_users_aggregate(every_backend):
    from django.contrib.auth.models import Permission

    def user(name, **extra):
        return User.objects.create_user(name, f"{name}@example.com", "pw", **extra)

    alice, bob, staff, root = user("alice"), user("bob"), user("staff", is_staff=True), user("root", is_superuser=True)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="wow_django",
                                                      codename="act_for_any_owner"))
    api = APIClient()
    with override_settings(WOW={**every_backend, **OWNER_POLICY}):
        api.force_authenticate(alice)
        order_id = place(api)  # alice owns it
        api.force_authenticate(bob)
        body = assert_error(pay(api, order_id), 403, "IllegalAccessOwnerAggregate")
        assert order_id in body["errorMsg"] and "wow_django.act_for_any_owner" in body["errorMsg"]
        assert_error(api.delete(f"/api/order/{order_id}", HTTP_COMMAND_TENANT_ID="t1"), 403, "IllegalAccessOwnerAggregate")
        assert versions(order_id) == [1]  # nothing stored
        # Creating is anyone's; an id this tenant does not have answers 404, not 403 (nothing shows through).
        assert place(api)
        assert_error(pay(api, "no-such-order"), 404, "NotFound")
        assert_error(pay(api, order_id, tenant="t2"), 404, "NotFound")
        # Reads stay open to the tenant.
        assert get(api, f"order/{order_id}/state", tenant="t1").status_code == 200
        # The owner, a user with the permission and a superuser pass.
        api.force_authenticate(alice)
        assert pay(api, order_id).status_code == 200
        api.force_authenticate(User.objects.get(pk=staff.pk))  # permissions are cached per instance
        assert post(api, f"order/{order_id}/ship_order", {"tracking_number": "T-1"}, tenant="t1").status_code == 200
        api.force_authenticate(root)
        assert api.delete(f"/api/order/{order_id}", HTTP_COMMAND_TENANT_ID="t1").status_code == 200
        assert versions(order_id) == [1, 2, 3, 4]
        api.force_authenticate(None)
        assert_error(pay(api, order_id), 403, "NotAuthenticated")


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_the_owner_policy_holds_when_a_queued_command_runs(every_backend, monkeypatch):
    # Bob queues (SENT) a payment for the order Alice is about to create: its id derives from her request id,
    # so the policy's first look finds no aggregate; the gateway refuses it when it runs, after her create.
    from wow_django.tasks import process_command

    held: list[dict] = []
    monkeypatch.setattr(process_command, "delay", held.append)
    alice = User.objects.create_user("alice", "alice@example.com", "pw")
    bob = User.objects.create_user("bob", "bob@example.com", "pw")
    api = APIClient()
    with override_settings(WOW={**every_backend, **OWNER_POLICY}):
        order_id = derived_aggregate_id("order", "t1", "alice-order-1")
        api.force_authenticate(bob)
        response = post(api, f"order/{order_id}/pay_order", {"amount": "7.00", "payment_id": "p-1"}, tenant="t1",
                        stage="SENT", request_id="bob-pays")
        assert response.status_code == 202 and response.json()["stage"] == "SENT"
        api.force_authenticate(alice)
        assert place(api, request_id="alice-order-1") == order_id
        [message] = held
        assert message["owner_only"] is True and message["owner_id"] == str(bob.pk)
        process_command.run(message)
        assert versions(order_id) == [1]
        status = get(api, f"order/request/bob-pays/status?aggregateId={order_id}", tenant="t1").json()
        assert status["errorCode"] == "IllegalAccessOwnerAggregate" and "belongs to another user" in status["errorMsg"]


def test_the_gateway_applies_the_owner_rule_only_when_asked(wow):
    gateway = get_runtime().gateway
    placed = gateway.send(PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A-1", quantity=1,
                                                                            unit_price=Decimal("7.00"))]),
                          owner_id="u-1")
    with pytest.raises(NotAggregateOwner):
        gateway.send(PayOrder(amount=Decimal("7.00"), payment_id="p"), aggregate_id=placed.aggregate_id,
                     owner_id="u-2", owner_only=True)
    assert versions(placed.aggregate_id) == [1]
    gateway.send(PayOrder(amount=Decimal("7.00"), payment_id="p"), aggregate_id=placed.aggregate_id,
                 owner_id="u-2")  # trusted code, not asked: passes
    assert versions(placed.aggregate_id) == [1, 2]


def test_a_create_takes_the_clients_aggregate_id_from_its_header(api):
    response = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                        HTTP_COMMAND_AGGREGATE_ID="order-chosen-1")
    assert response.status_code == 200 and response.json()["aggregateId"] == "order-chosen-1"
    assert versions("order-chosen-1") == [1]
    again = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                     HTTP_COMMAND_AGGREGATE_ID="order-chosen-1")
    body = assert_error(again, 400, "DuplicateAggregateId")
    assert body["aggregateId"] == "order-chosen-1" and versions("order-chosen-1") == [1]
    assert_error(api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_AGGREGATE_ID="tab\there"),
                 400, "CommandValidation", ["Command-Aggregate-Id"])
    # On a command to an existing aggregate the path names it; a header naming another one is refused.
    paid = api.post("/api/order/order-chosen-1/pay_order", {"amount": "7.00", "payment_id": "p"}, format="json",
                    HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_AGGREGATE_ID="order-other")
    assert_error(paid, 400, "CommandValidation", ["Command-Aggregate-Id"])
    paid = api.post("/api/order/order-chosen-1/pay_order", {"amount": "7.00", "payment_id": "p"}, format="json",
                    HTTP_COMMAND_TENANT_ID="t1", HTTP_COMMAND_AGGREGATE_ID="order-chosen-1")
    assert paid.status_code == 200 and versions("order-chosen-1") == [1, 2]


@pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)
def test_the_owner_header_is_honoured_only_with_the_permission(every_backend):
    from django.contrib.auth.models import Permission

    alice = User.objects.create_user("alice", "alice@example.com", "pw")
    staff = User.objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="wow_django",
                                                      codename="act_for_any_owner"))
    api = APIClient()
    with override_settings(WOW=every_backend):
        api.force_authenticate(alice)
        refused = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                           HTTP_COMMAND_OWNER_ID="someone-else")
        assert_error(refused, 403, "PermissionDenied")
        assert "act_for_any_owner" in refused.json()["errorMsg"]
        assert post(api, "order/snapshot/count", {}, tenant="t1").json() == 0  # nothing stored
        own = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                       HTTP_COMMAND_WAIT_STAGE="SNAPSHOT", HTTP_COMMAND_OWNER_ID=str(alice.pk))
        assert own.status_code == 200
        assert get(api, f"order/{own.json()['aggregateId']}/snapshot", tenant="t1").json()["ownerId"] == str(alice.pk)
        api.force_authenticate(User.objects.get(pk=staff.pk))
        for_alice = api.post("/api/order/place_order", ORDER, format="json", HTTP_COMMAND_TENANT_ID="t1",
                             HTTP_COMMAND_WAIT_STAGE="SNAPSHOT", HTTP_COMMAND_OWNER_ID=str(alice.pk))
        assert for_alice.status_code == 200
        snapshot = get(api, f"order/{for_alice.json()['aggregateId']}/snapshot", tenant="t1").json()
        assert (snapshot["ownerId"], snapshot["operator"]) == (str(alice.pk), str(staff.pk))


def test_an_aggregate_without_an_owner_takes_commands_from_anyone(api):
    with override_settings(WOW={**stores_settings(),
                                "API_PERMISSION_CLASSES": ["wow_django.http.permissions.IsOwnerOrPermitted"]}):
        order_id = place(api)  # anonymous: no owner
        api.force_authenticate(User(pk=8, username="gina"))
        assert pay(api, order_id).status_code == 200


class TenantUser(SimpleNamespace):
    is_authenticated = True

    def get_username(self):
        return self.username


class ProfileTenantResolver(UserTenantResolver):
    attribute = "profile.tenant"


def test_the_tenant_from_the_user(api):
    resolver = {"TENANT_RESOLVER": "wow_django.http.tenancy.UserTenantResolver"}
    with override_settings(WOW={**stores_settings(), **resolver}):
        assert_error(post(api, "order/place_order", ORDER), 403, "NotAuthenticated")
        api.force_authenticate(TenantUser(pk=1, username="u", tenant_id="acme"))
        order_id = place(api, tenant=None)
        assert get(api, f"order/{order_id}/snapshot").json()["tenantId"] == "acme"
        assert get(api, f"order/{order_id}/snapshot", tenant="acme").status_code == 200
        assert_error(get(api, f"order/{order_id}/snapshot", tenant="other"), 403, "PermissionDenied")
        api.force_authenticate(TenantUser(pk=2, username="v", tenant_id="globex"))
        assert_error(get(api, f"order/{order_id}/snapshot"), 404, "NotFound")
        assert post(api, "order/snapshot/count", {}).json() == 0
        api.force_authenticate(TenantUser(pk=3, username="w", tenant_id=None))
        assert_error(post(api, "order/snapshot/count", {}), 403, "PermissionDenied")
    nested = {"TENANT_RESOLVER": f"{__name__}.ProfileTenantResolver"}
    with override_settings(WOW={**stores_settings(), **nested}):
        api.force_authenticate(TenantUser(pk=4, username="x", profile=SimpleNamespace(tenant="initech")))
        order_id = place(api, tenant=None)
        assert get(api, f"order/{order_id}/snapshot").json()["tenantId"] == "initech"


# --- URLs and error mapping ----------------------------------------------------------------------------------


def test_routes_have_names():
    assert reverse("wow:order-snapshot-paged") == "/api/order/snapshot/paged"
    assert reverse("wow:order-event-count") == "/api/order/event/count"
    assert reverse("wow:order-place_order") == "/api/order/place_order"
    assert reverse("wow:order-pay_order", kwargs={"id": "o-1"}) == "/api/order/o-1/pay_order"
    assert reverse("wow:order-delete", kwargs={"id": "o-1"}) == "/api/order/o-1"
    assert reverse("wow:order-recover", kwargs={"id": "o-1"}) == "/api/order/o-1/recover"
    assert reverse("wow:customer-state", kwargs={"id": "c"}) == "/api/customer/c/state"
    assert reverse("wow:customer-snapshot", kwargs={"id": "c"}) == "/api/customer/c/snapshot"
    assert reverse("wow:customer-event-range", kwargs={"id": "c", "head": 1, "tail": 3}) == "/api/customer/c/event/1/3"


def test_commands_named_like_route_segments_are_refused():
    class State:
        command_name = "state"

    fake = SimpleNamespace(aggregate_name="thing", allow_delete=True,
                           handlers={"state": CommandHandler(State, "state", False, False)})
    with pytest.raises(ImproperlyConfigured, match="Command 'state' of aggregate 'thing'"):
        aggregate_urlpatterns(fake)


def test_aggregates_without_delete_have_no_delete_routes(monkeypatch):
    monkeypatch.setattr(Order, "allow_delete", False)
    names = {p.name for p in aggregate_urlpatterns(Order)}
    assert "order-delete" not in names and "order-recover" not in names and "order-pay_order" in names


@pytest.mark.parametrize(("error", "status", "code"), [
    (QueryValidationError("condition.field", "bad"), 400, "IllegalArgument"),
    (CommandValidationError("bad", [{"name": "x", "msg": "y"}]), 400, "CommandValidation"),
    (InvalidRequest("id", "bad"), 400, "IllegalArgument"),
    (UnknownAggregate("no"), 404, "NotFound"),
    (UnknownCommand("no"), 404, "NotFound"),
    (AggregateNotFound("no"), 404, "NotFound"),
    (ResourceNotFound("no"), 404, "NotFound"),
    (DomainError("ORDER_CANCELLED", "no"), 400, "ORDER_CANCELLED"),
    (AggregateIsDeleted("no"), 410, "IllegalAccessDeletedAggregate"),
    (DuplicateAggregateId("order", "x"), 400, "DuplicateAggregateId"),
    (EventVersionConflict("order", "x", 3), 409, "EventVersionConflict"),
    (DuplicateRequestId("order", "x", "r"), 400, "DuplicateRequestId"),
    (KeyAlreadyPrepared("username", "alice"), 400, "KeyAlreadyPrepared"),
    # change_key from a key not held with the old value: refused as a taken key is (Wow: 400)
    (KeyNotHeld("username", "alice", "alicia"), 400, "KeyNotHeld"),
    (RecoverableStoreError("down"), 503, "StoreUnavailable"),
    (OperationalError("broker down"), 503, "BrokerUnavailable"),
    (Http404("gone"), 404, "NotFound"),
    (DjangoPermissionDenied("no"), 403, "PermissionDenied"),
    (drf.ValidationError({"a": ["bad"], "b": {"c": ["worse"]}}), 400, "IllegalArgument"),
    (drf.Throttled(wait=3), 429, "TooManyRequests"),
])
def test_error_mapping(error, status, code):
    response = error_response(error)
    assert response.status_code == status
    assert response.data["errorCode"] == code and response.data["errorMsg"]
    if isinstance(error, drf.ValidationError):
        assert response.data["bindingErrors"] == [{"name": "a", "msg": "bad"}, {"name": "b.c", "msg": "worse"}]
    if isinstance(error, drf.Throttled):
        assert response["Retry-After"] == "3"


@pytest.mark.parametrize("error", [ValueError("bug"), UnacknowledgedWriteError("w=0"), KeyError("x")])
def test_server_faults_are_not_dressed_as_client_errors(error):
    assert error_response(error) is None


def test_every_wow_django_view_answers_through_the_one_exception_handler():
    from django.urls import URLPattern, URLResolver

    from wow_django.http import bus_urls, urls
    from wow_django.http.errors import exception_handler

    def views(patterns):
        for entry in patterns:
            if isinstance(entry, URLResolver):
                yield from views(entry.url_patterns)
            elif isinstance(entry, URLPattern):
                yield entry.callback.view_class

    found = list(views(urls.build_urlpatterns())) + list(views(bus_urls.urlpatterns))
    assert len({cls.__module__ for cls in found}) == 2  # aggregate views and bus views
    assert all(cls().get_exception_handler() is exception_handler for cls in found)


@pytest.mark.parametrize(("error", "status", "code"), [
    (EventNotFound("e-1"), 404, "NotFound"),
    (TraceNotFound("t-1"), 404, "NotFound"),
    (ConsumerNotExpected("e-1", "c-1"), 403, "ConsumerNotExpected"),
    (RepushRefused("RepushTooEarly", "wait"), 409, "RepushTooEarly"),
    (EnvelopeValidationError.from_errors("envelope", [{"name": "topic", "msg": "is required"}]), 400,
     "BusValidation"),
    (TransportUnavailable("broker down"), 503, "BusTransportUnavailable"),
    (BusError("rollup did not settle"), 503, "BusError"),
])
def test_bus_errors_map_in_the_same_table(error, status, code):
    response = error_response(error)
    assert response.status_code == status and response.data["errorCode"] == code
    assert (response.get("Retry-After") == "1") is (status == 503)

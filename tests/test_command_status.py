"""What became of a command, by its request id (issue 13): the Python API and ``GET …/request/{id}/status``.

On every backend (in-memory, mongomock://, the django backend on SQLite). Commands sent with wait stage
SENT run through the ``queued_commands`` fixture (in-line, as a worker would, *before* the gateway answers:
the fastest worker there is); a real Celery worker is in tests/test_celery_worker.py.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from sample_project.orders.aggregates import CancelOrder, OrderLine, PayOrder, PlaceOrder
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.exceptions import AggregateNotFound, UnknownAggregate
from wow_django.persistence.records import AggregateId


def headers(tenant: str) -> dict:
    return {"HTTP_COMMAND_TENANT_ID": tenant}


pytestmark = pytest.mark.usefixtures("queued_commands")


def place(tenant="t1", request_id=None, wait="SNAPSHOT"):
    return get_runtime().gateway.send(
        PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A-1", quantity=1, unit_price=Decimal("5.00"))]),
        tenant_id=tenant, request_id=request_id or uuid.uuid4().hex, wait=wait)


def test_a_queued_command_that_is_processed_reports_its_stage_and_version(every_backend):
    gateway = get_runtime().gateway
    sent = place(wait="SENT", request_id="r-ok")
    assert sent.stage is WaitStage.SENT
    # The worker ran before the gateway answered SENT: the SENT record must not hide its outcome.
    status = gateway.status("order", "r-ok", tenant_id="t1")
    assert status.succeeded and status.aggregate_version == 1 and status.events == ("order_placed",)
    assert status.stage is WaitStage.PROJECTED  # the worker waits for the projections before it records
    assert status.command_id == sent.command_id and status.aggregate_id == sent.aggregate_id


def test_a_queued_command_refused_later_reports_the_error(every_backend):
    gateway = get_runtime().gateway
    order_id = place().aggregate_id
    gateway.send(CancelOrder(reason="changed my mind"), aggregate_id=order_id, tenant_id="t1")
    gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                 request_id="r-pay", wait="SENT")
    status = gateway.status("order", "r-pay", tenant_id="t1")
    assert status.stage is WaitStage.PROCESSED and not status.succeeded
    assert status.error_code not in ("Ok", "") and status.error_msg
    assert status.aggregate_version is None
    key = AggregateId("order", order_id, "order-service", "t1")
    assert [s.version for s in get_runtime().event_store.load(key)] == [1, 2]  # the payment appended nothing


def test_a_queued_command_on_a_missing_aggregate_reports_not_found(every_backend):
    gateway = get_runtime().gateway
    gateway.send(PayOrder(amount=Decimal("1.00"), payment_id="p-1"), aggregate_id="nothing-here", tenant_id="t1",
                 request_id="r-missing", wait="SENT")
    status = gateway.status("order", "r-missing", tenant_id="t1")
    assert (status.stage, status.error_code) == (WaitStage.PROCESSED, AggregateNotFound.error_code)


def test_commands_that_stored_events_are_found_whatever_their_wait_stage(every_backend):
    gateway = get_runtime().gateway
    placed = place(request_id="r-create", wait="PROCESSED")
    found = gateway.status("order", "r-create", tenant_id="t1")  # a create: its id comes from the request id
    assert (found.aggregate_id, found.aggregate_version, found.command_id) == (placed.aggregate_id, 1,
                                                                                placed.command_id)
    gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=placed.aggregate_id,
                 tenant_id="t1", request_id="r-pay-sync", wait="SNAPSHOT")
    assert gateway.status("order", "r-pay-sync", tenant_id="t1") is None  # which aggregate? not said
    paid = gateway.status("order", "r-pay-sync", tenant_id="t1", aggregate_id=placed.aggregate_id)
    assert paid.succeeded and paid.aggregate_version == 2 and paid.events == ("order_paid",)
    assert paid.stage is WaitStage.SNAPSHOT  # stored, and its snapshot has caught up


def test_another_tenant_and_unknown_requests_find_nothing(every_backend):
    gateway = get_runtime().gateway
    place(wait="SENT", request_id="r-mine")
    place(request_id="r-mine-sync")
    assert gateway.status("order", "r-mine", tenant_id="t2") is None
    assert gateway.status("order", "r-mine-sync", tenant_id="t2") is None
    assert gateway.status("order", "r-never-sent", tenant_id="t1") is None
    with pytest.raises(UnknownAggregate):
        gateway.status("nope", "r-mine", tenant_id="t1")


def test_the_status_over_http(every_backend):
    api = APIClient()
    place(wait="SENT", request_id="r-http")
    response = api.get("/api/order/request/r-http/status", **headers(tenant="t1"))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["requestId"], body["stage"], body["errorCode"], body["aggregateVersion"]) == (
        "r-http", "PROJECTED", "Ok", 1)
    assert api.get("/api/order/request/r-http/status", **headers(tenant="t2")).status_code == 404
    assert api.get("/api/order/request/r-unknown/status", **headers(tenant="t1")).json()["errorCode"] == "NotFound"
    get_runtime().gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=body["aggregateId"],
                               tenant_id="t1", request_id="r-pay-http")
    path = "/api/order/request/r-pay-http/status"
    assert api.get(path, **headers(tenant="t1")).status_code == 404
    paid = api.get(f"{path}?aggregateId={body['aggregateId']}", **headers(tenant="t1"))
    assert paid.status_code == 200 and paid.json()["aggregateVersion"] == 2
    bad = api.get(f"{path}?aggregateId={'x' * 200}", **headers(tenant="t1"))
    assert bad.status_code == 400 and "aggregateId" in bad.content.decode()


def test_tenants_and_request_ids_that_share_characters_do_not_share_a_status(every_backend):
    """'t 1' + 'x' and 't' + '1 x' (ids may hold spaces): two requests, two statuses."""
    gateway = get_runtime().gateway
    place(tenant="t 1", wait="SENT", request_id="x")
    assert gateway.status("order", "1 x", tenant_id="t") is None
    assert gateway.status("order", "x", tenant_id="t 1").succeeded


def test_without_a_tenant_the_lookup_uses_the_default_tenant_as_send_does(every_backend):
    from sample_project.orders.aggregates import OrderLine, PlaceOrder

    gateway = get_runtime().gateway
    gateway.send(PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A-1", quantity=1, unit_price=Decimal("1"))]),
                 request_id="r-default", wait="SENT")
    assert gateway.status("order", "r-default").succeeded
    assert gateway.status("order", "r-default", tenant_id="t1") is None


def test_a_kept_refusal_survives_a_queued_request_that_reuses_its_id(every_backend):
    """A queued command reusing a refused request's id with another body is refused as DuplicateRequestId without
    replacing the kept refusal: the first request sent again still gets its refusal, not a second run."""
    from wow_django.exceptions import DomainError

    gateway = get_runtime().gateway
    order_id = place().aggregate_id  # total 5.00
    with pytest.raises(DomainError) as first:
        gateway.send(PayOrder(amount=Decimal("1.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                     request_id="r-kept")
    gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                 request_id="r-kept", wait="SENT")  # the worker refuses it: RequestIdReused
    with pytest.raises(DomainError) as again:
        gateway.send(PayOrder(amount=Decimal("1.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                     request_id="r-kept")
    assert again.value.error_code == first.value.error_code == "AMOUNT_MISMATCH"
    assert again.value.command_result.duplicate
    status = gateway.status("order", "r-kept", tenant_id="t1")
    assert status.error_code == "AMOUNT_MISMATCH"
    key = AggregateId("order", order_id, "order-service", "t1")
    assert [s.version for s in get_runtime().event_store.load(key)] == [1]


def test_events_stored_under_a_refused_request_id_win_over_the_kept_refusal(every_backend):
    """Two copies of one request raced: one was refused while the other, on a changed state, stored its events.
    The stored result is the request's answer (and its status), not the refusal."""
    from wow_django.application.command_status import CommandStatusBook
    from wow_django.application.gateway import REFUSAL, STATUS_STORE_NAME

    gateway = get_runtime().gateway
    order_id = place().aggregate_id
    paid = gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                        request_id="r-race")
    # What the refused copy kept, written after the other copy's append (as in the race).
    book = CommandStatusBook(get_runtime().prepare_key(STATUS_STORE_NAME), gateway._status_book().ttl)
    book.record({**paid.to_json(), "aggregateVersion": None, "errorCode": "AMOUNT_MISMATCH", "errorMsg": "raced",
                 REFUSAL: True, "commandDigest": "from-the-refused-copy"})
    again = gateway.send(PayOrder(amount=Decimal("5.00"), payment_id="p-1"), aggregate_id=order_id, tenant_id="t1",
                         request_id="r-race")
    assert again.duplicate and again.succeeded and again.aggregate_version == 2
    assert gateway.status("order", "r-race", tenant_id="t1", aggregate_id=order_id).succeeded


def test_a_queued_repeat_of_a_refused_request_leaves_the_kept_refusal_as_it_was(every_backend):
    from wow_django.exceptions import DomainError

    gateway = get_runtime().gateway
    order_id = place().aggregate_id
    short = PayOrder(amount=Decimal("1.00"), payment_id="p-1")
    with pytest.raises(DomainError):
        gateway.send(short, aggregate_id=order_id, tenant_id="t1", request_id="r-queued-again")
    kept = gateway._status_book().get("order", "t1", "r-queued-again")
    gateway.send(short, aggregate_id=order_id, tenant_id="t1", request_id="r-queued-again", wait="SENT")
    assert gateway._status_book().get("order", "t1", "r-queued-again") == kept  # not rewritten by the worker
    with pytest.raises(DomainError) as again:
        gateway.send(short, aggregate_id=order_id, tenant_id="t1", request_id="r-queued-again")
    assert again.value.command_result.duplicate and again.value.error_code == "AMOUNT_MISMATCH"

"""The sample scenario of seed 004 §7: order.purchased → member-service and message-service, children in the trace."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.test import override_settings

from sample_project.orders import integration
from sample_project.orders.aggregates import OrderLine, PayOrder, PlaceOrder
from sample_project.orders.demo_bus import run_bus_demo
from sample_project.orders.models import Member, Notice, PointsEntry
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.backends.mongo.client import disconnect
from wow_django.bus import get_bus
from wow_django.bus.consumer import ConsumerContext
from wow_django.bus.envelope import Envelope
from wow_django.persistence.bus import EventQuery
from wow_django.persistence.records import AggregateId
from wow_django.testing.bus import delete_amqp_entities, unique_exchange

from .support import fresh_wow

# The downstream services' rows are in Django's database, written by consumer threads.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sample_bus(bus_store):
    settings = fresh_wow("mongo", SERVICE_NAME="order-service", BUS_EXCHANGE=unique_exchange(), BUS_STORE=bus_store)
    with override_settings(WOW=settings):
        yield settings
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"],
                             (integration.MEMBER_SERVICE, integration.MESSAGE_SERVICE))
    disconnect(settings["MONGO_URI"])


def pay_an_order(amount="25.50", quantity=2):
    gateway = get_runtime().gateway
    placed = gateway.send(PlaceOrder(customer_id="user-A", items=[OrderLine(sku="SKU-1", quantity=quantity,
                                                                            unit_price=Decimal(amount))]),
                          operator="user-A")
    paid = gateway.send(PayOrder(amount=Decimal(amount) * quantity, payment_id="pay-1"),
                        aggregate_id=placed.aggregate_id, operator="user-A", wait=WaitStage.PROJECTED)
    assert paid.succeeded, paid.error_msg
    return placed, paid


def test_the_demo_settles_every_event_and_prints_statuses_and_a_trace(sample_bus):
    out = StringIO()
    run_bus_demo(out, orders=3)
    text = out.getvalue()
    assert "Bus demo: 3 paid orders published order.purchased" in text
    assert text.count("order.purchased    CONSUMED  2/2 consumed") == 3
    assert text.count("points.added       CONSUMED  1/1 consumed") == 3
    assert text.count("notification.sent  CONSUMED  1/1 consumed") == 6
    tree = text.split("Trace tree of ", 1)[1].splitlines()
    assert tree[1].lstrip().startswith("order.purchased [CONSUMED 2/2 consumed] order-service/pay_order evt-")
    assert any(line.lstrip().startswith(("├── points.added", "└── points.added")) for line in tree)
    assert any("│   └── notification.sent" in line or "    └── notification.sent" in line for line in tree)
    bus = get_bus()
    assert bus.list_events(status="CONSUMED", size=50)["total"] == 12
    assert PointsEntry.objects.count() == 3
    assert Notice.objects.count() == 6
    assert Member.objects.count() == 3


def test_paying_publishes_order_purchased_translated_at_the_edge(sample_bus):
    integration.configure_topic_consumers()
    placed, paid = pay_an_order()
    bus = get_bus()
    [event] = bus.list_events(topic=integration.PURCHASED)["list"]
    # The payment's event stream (v2) is when it occurred, to the millisecond, in UTC.
    payment = get_runtime().event_store.load(AggregateId("order", placed.aggregate_id))[1]
    assert (payment.version, payment.command_id) == (2, paid.command_id)
    seconds, millis = divmod(payment.create_time, 1000)
    occurred_at = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{millis:03d}Z"
    assert event["payload"] == {
        "orderId": placed.aggregate_id, "userId": "user-A", "amount": "51.00", "currency": "CNY",
        "paymentId": "pay-1", "occurredAt": occurred_at, "channel": "app",
    }
    assert event["occurredAt"] == occurred_at
    assert event["traceId"] == f"trace-{paid.command_id}" and event["parentEventId"] is None
    assert event["initiator"] == {"service": "order-service", "operation": "pay_order", "userId": "user-A",
                                  "clientRequestId": paid.request_id}
    assert (event["partitionKey"], event["sequence"], event["status"]) == (placed.aggregate_id, 2, "SENT")
    assert event["consumers"] == [integration.MEMBER_SERVICE, integration.MESSAGE_SERVICE]


def test_without_topic_consumers_paying_still_succeeds_and_nothing_is_published(sample_bus, caplog):
    with caplog.at_level(logging.ERROR, logger="wow_django.bus"):
        pay_an_order()
    assert get_bus().store.find_events(EventQuery(), skip=0, limit=1) == (0, [])
    assert any("'order.purchased' has no enabled consumer" in r.getMessage() for r in caplog.records)


def test_the_member_service_adds_points_once_per_event(sample_bus):
    integration.configure_topic_consumers()
    pay_an_order(amount="19.99", quantity=3)
    bus = get_bus()
    total, [document] = bus.store.find_events(EventQuery(topic=integration.PURCHASED), skip=0, limit=10)
    assert total == 1
    event = Envelope.from_document(document)
    for attempt in (1, 2):  # a redelivery runs the handler again
        ctx = ConsumerContext(bus, integration.MEMBER_SERVICE, event, attempt=attempt, redelivered=attempt > 1,
                              operation="add_points")
        integration.add_points(event, ctx)
    assert integration.member_points("user-A") == 59
    children = bus.list_events(topic=integration.POINTS_ADDED)["list"]
    assert len(children) == 1 and children[0]["payload"]["points"] == 59
    assert children[0]["parentEventId"] == event.event_id and children[0]["traceId"] == event.trace_id

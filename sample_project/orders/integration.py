"""Integration events of the order service and the two downstream services (seed 004 §7).

**At the edge** an event processor translates the domain event ``order_paid``
into the integration event ``order.purchased``: a public payload (orderId,
userId, amount, currency, channel) rather than the domain event, the order id
as partition key and the aggregate version as sequence. Its eventId is derived
from the domain event's id, so translating the same domain event again keeps
one bus record.

**Downstream**, in this process for the sample (each would be its own service
with its own database in production):

- ``member-service`` adds points for ``order.purchased`` (one point per whole
  currency unit; a ledger entry keyed by the consumer's idempotency key, so a
  redelivery adds nothing) and emits ``points.added``; for
  ``notification.sent`` it remembers when the member was last notified.
- ``message-service`` sends a notice for ``order.purchased`` and for
  ``points.added`` (a notice keyed by the idempotency key) and emits
  ``notification.sent`` for each.

Children carry the parent's traceId and parentEventId (``ctx.send``). Every
topic has a consumer, so no child is dropped and every event settles; the
configuration is :data:`TOPIC_CONSUMERS`, written by :func:`configure_topic_consumers`::

    order.purchased   → member-service, message-service
    points.added      → message-service
    notification.sent → member-service
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import ROUND_DOWN, Decimal

from pymongo import errors as pymongo_errors

from sample_project.orders.aggregates import Order, OrderPaid
from wow_django.application.runtime import get_runtime
from wow_django.backends.mongo import get_connection
from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.bus import consumer, get_bus
from wow_django.bus.envelope import iso, utcnow
from wow_django.domain import event_processor

PURCHASED = "order.purchased"
POINTS_ADDED = "points.added"
NOTIFICATION_SENT = "notification.sent"
MEMBER_SERVICE = "member-service"
MESSAGE_SERVICE = "message-service"

TOPIC_CONSUMERS = (
    (PURCHASED, MEMBER_SERVICE),
    (PURCHASED, MESSAGE_SERVICE),
    (POINTS_ADDED, MESSAGE_SERVICE),
    (NOTIFICATION_SENT, MEMBER_SERVICE),
)
MEMBER_DATABASE = "member_service"
MESSAGE_DATABASE = "message_service"


def configure_topic_consumers(bus=None) -> None:
    """Enable the sample's topic → consumer pairs (idempotent)."""
    bus = bus or get_bus()
    for topic, consumer_id in TOPIC_CONSUMERS:
        bus.set_topic_consumer(topic, consumer_id, enabled=True, updated_by="sample_project",
                               description="sample scenario of seed 004 §7")


# --- order service: domain → integration ------------------------------------------------


@event_processor(Order, events=[OrderPaid])
def publish_purchase(message) -> None:
    """``order_paid`` → ``order.purchased``."""
    # The order as of this event, not as of now.
    order = get_runtime().gateway.repository.load(Order, message.aggregate_id.id, tail_version=message.version)
    state = order.state if order is not None else None
    event: OrderPaid = message.event
    header = message.header or {}
    initiator = {"operation": header.get("command") or "pay_order", "clientRequestId": message.request_id}
    if header.get("operator"):
        initiator["userId"] = header["operator"]
    get_bus().send(
        PURCHASED,
        {
            "orderId": message.aggregate_id.id,
            "userId": state.customer_id if state else "",
            "amount": str(event.amount),
            "currency": state.currency if state else "",
            "paymentId": event.payment_id,
            "occurredAt": iso(datetime.fromtimestamp(message.create_time / 1000, UTC)),
            "channel": header.get("channel") or "app",
        },
        event_id=f"evt-{message.event_id}",
        trace_id=header.get("traceId") or f"trace-{message.command_id}",
        initiator=initiator,
        occurred_at=datetime.fromtimestamp(message.create_time / 1000, UTC),
        partition_key=message.aggregate_id.id,
        sequence=message.version,
    )


# --- member-service and message-service ------------------------------------------------


def _collection(database: str, name: str):
    connection = get_connection()
    return connection, connection.database(database)[name]


def _insert_once(database: str, name: str, document: dict) -> bool:
    """Insert ``document`` unless its ``_id`` exists (a redelivered event): the effect happens once."""
    connection, collection = _collection(database, name)
    try:
        with recoverable_errors(f"writing {name}"), connection.guard(collection):
            collection.insert_one(dict(document))
    except pymongo_errors.DuplicateKeyError:
        return False
    return True


def points_ledger():
    return _collection(MEMBER_DATABASE, "points_ledger")


def member_points(user_id: str) -> int:
    connection, ledger = points_ledger()
    with recoverable_errors("reading points"), connection.guard(ledger):
        return sum(entry["points"] for entry in ledger.find({"memberId": user_id}, {"points": 1}))


def notices():
    return _collection(MESSAGE_DATABASE, "notices")


def members():
    return _collection(MEMBER_DATABASE, "members")


@consumer(MEMBER_SERVICE, topics=[PURCHASED])
def add_points(event, ctx) -> None:
    payload = event.payload
    user_id = payload["userId"]
    points = int(Decimal(payload["amount"]).to_integral_value(rounding=ROUND_DOWN))
    _insert_once(MEMBER_DATABASE, "points_ledger", {
        "_id": ctx.idempotency_key, "memberId": user_id, "points": points, "orderId": payload["orderId"],
        "sourceEventId": event.event_id, "at": utcnow(),
    })
    ctx.send(POINTS_ADDED, {"userId": user_id, "points": points, "balance": member_points(user_id),
                            "orderId": payload["orderId"], "sourceEventId": event.event_id},
             operation="addPoints")


def _send_notice(event, ctx, template: str, text: str) -> None:
    payload = event.payload
    channel = payload.get("channel") or "app"
    _insert_once(MESSAGE_DATABASE, "notices", {
        "_id": ctx.idempotency_key, "userId": payload["userId"], "channel": channel, "templateId": template,
        "text": text, "sourceEventId": event.event_id, "at": utcnow(),
    })
    ctx.send(NOTIFICATION_SENT, {"userId": payload["userId"], "channel": channel, "templateId": template,
                                 "noticeId": ctx.idempotency_key, "sourceEventId": event.event_id},
             operation="sendNotice")


@consumer(MESSAGE_SERVICE, topics=[PURCHASED])
def notify_purchase(event, ctx) -> None:
    p = event.payload
    _send_notice(event, ctx, "order-purchased", f"Thank you! Order {p['orderId']} is paid: {p['amount']} {p['currency']}.")


@consumer(MESSAGE_SERVICE, topics=[POINTS_ADDED])
def notify_points(event, ctx) -> None:
    p = event.payload
    _send_notice(event, ctx, "points-added", f"You earned {p['points']} points; your balance is {p['balance']}.")


@consumer(MEMBER_SERVICE, topics=[NOTIFICATION_SENT])
def remember_notification(event, ctx) -> None:
    connection, collection = members()
    for attempt in range(2):
        try:
            with recoverable_errors("updating a member"), connection.guard(collection):
                # $max: applying the same (or an older) notification again changes nothing.
                collection.update_one({"_id": event.payload["userId"]},
                                      {"$max": {"lastNotifiedAt": event.occurred_at}}, upsert=True)
            return
        except pymongo_errors.DuplicateKeyError:
            if attempt:  # two first upserts of one member raced; the retry updates
                raise

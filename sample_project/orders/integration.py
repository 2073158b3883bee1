"""Integration events of the order service and the two downstream services (seed 004 §7).

**At the edge** an event processor translates the domain event ``order_paid``
into the integration event ``order.purchased``: a public payload (orderId,
userId, amount, currency, channel) rather than the domain event, the order id
as partition key and the aggregate version as sequence. The processor is the
**bus relay**: it runs on follower ``order-purchased-relay`` (DESIGN G), which
reads the order streams from its durable checkpoint, so a process killed after
the append and before the publish loses nothing — the follower hands the
stream again when it runs next. Its eventId is derived from the domain
event's id, so translating the same domain event again (at-least-once, a
rewind) keeps one bus record.

**Downstream**, in this project for the sample (each would be its own service
with its own database in production; here their rows live in the project's
database, :mod:`sample_project.orders.models`, so every process sees them):

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

from django.db import IntegrityError, models, transaction
from django.db.models import Sum

from sample_project.orders.aggregates import Order, OrderPaid
from sample_project.orders.models import Member, Notice, PointsEntry
from wow_django.application.runtime import get_runtime
from wow_django.bus import consumer, get_bus
from wow_django.bus.envelope import aggregate_keys, iso
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


def configure_topic_consumers(bus=None) -> None:
    """Enable the sample's topic → consumer pairs (idempotent)."""
    bus = bus or get_bus()
    for topic, consumer_id in TOPIC_CONSUMERS:
        bus.set_topic_consumer(topic, consumer_id, enabled=True, updated_by="sample_project",
                               description="sample scenario of seed 004 §7")


# --- order service: domain → integration ------------------------------------------------


@event_processor(Order, events=[OrderPaid], name="order-purchased-relay")
def publish_purchase(message) -> None:
    """``order_paid`` → ``order.purchased``."""
    # The order as of this event, not as of now.
    key = message.aggregate_id
    order = get_runtime().gateway.repository.load(Order, key.id, tenant_id=key.tenant_id, tail_version=message.version)
    state = order.state if order is not None else None
    event: OrderPaid = message.event
    header = message.header or {}
    initiator = {"operation": header.get("command") or "pay_order", "clientRequestId": message.request_id}
    operator = header.get("command_operator") or header.get("operator")  # Wow's key; wow_django's before
    if operator:
        initiator["userId"] = operator
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
        keys=aggregate_keys(message.aggregate_id.aggregate_name, message.aggregate_id.id),  # the console links both
    )


# --- member-service and message-service ------------------------------------------------


def _insert_once(model: type[models.Model], **fields) -> bool:
    """Insert a row keyed by the consumer's idempotency key unless it exists (a redelivered event):
    the effect happens once, whichever process consumes the event."""
    try:
        with transaction.atomic():
            model.objects.create(**fields)
    except IntegrityError:
        if not model.objects.filter(pk=fields[model._meta.pk.attname]).exists():
            raise
        return False
    return True


def member_points(user_id: str) -> int:
    return PointsEntry.objects.filter(member_id=user_id).aggregate(total=Sum("points"))["total"] or 0


@consumer(MEMBER_SERVICE, topics=[PURCHASED])
def add_points(event, ctx) -> None:
    payload = event.payload
    user_id = payload["userId"]
    points = int(Decimal(payload["amount"]).to_integral_value(rounding=ROUND_DOWN))
    _insert_once(PointsEntry, key=ctx.idempotency_key, member_id=user_id, points=points,
                 order_id=payload["orderId"], source_event_id=event.event_id, at=datetime.now(UTC))
    ctx.send(POINTS_ADDED, {"userId": user_id, "points": points, "balance": member_points(user_id),
                            "orderId": payload["orderId"], "sourceEventId": event.event_id},
             operation="addPoints")


def _send_notice(event, ctx, template: str, text: str) -> None:
    payload = event.payload
    channel = payload.get("channel") or "app"
    _insert_once(Notice, key=ctx.idempotency_key, user_id=payload["userId"], channel=channel,
                 template_id=template, text=text, source_event_id=event.event_id, at=datetime.now(UTC))
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
    user_id, at = event.payload["userId"], event.occurred_at
    if at.tzinfo is None:  # the bus keeps UTC times naive, as BSON does
        at = at.replace(tzinfo=UTC)
    # Only ever forward: the same (or an older) notification applied again changes nothing.
    if Member.objects.filter(pk=user_id, last_notified_at__lt=at).update(last_notified_at=at):
        return
    if not _insert_once(Member, user_id=user_id, last_notified_at=at):
        Member.objects.filter(pk=user_id, last_notified_at__lt=at).update(last_notified_at=at)  # a racing first one

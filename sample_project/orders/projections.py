"""The sample's projection: the ``OrderSummary`` read model, kept by follower ``order-summaries``.

It runs on a follower (DESIGN G): every order stream in commit order, at least
once, from a durable checkpoint, in whichever process runs followers
(``WOW['FOLLOWERS_RUN']``). A command sent with ``Command-Wait-Stage: PROJECTED``
is answered once this projection has passed its events. Replay it after a
fix with ``manage.py wow_followers rewind order-summaries --to-position 0 --yes``
(each row keeps the version it was built from, so a replay rebuilds nothing
twice; delete the rows first to rebuild them from scratch).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django.db import transaction

from sample_project.orders.aggregates import Order, OrderCancelled, OrderPaid, OrderPlaced, OrderShipped
from sample_project.orders.models import OrderSummary
from wow_django.domain import projection

STATUS = {OrderPlaced: "PLACED", OrderPaid: "PAID", OrderShipped: "SHIPPED", OrderCancelled: "CANCELLED"}


@projection(Order, name="order-summaries")
def summarise_order(message) -> None:
    """Apply one order event to its summary row, unless the row has it already."""
    event = message.event
    order_id = message.aggregate_id.id
    at = datetime.fromtimestamp(message.create_time / 1000, UTC)
    with transaction.atomic():
        row = OrderSummary.objects.select_for_update().filter(order_id=order_id).first()
        if isinstance(event, OrderPlaced):
            if row is not None:
                return  # handed again: the row was built from this stream or a later one
            OrderSummary.objects.create(
                order_id=order_id, tenant_id=message.aggregate_id.tenant_id, customer_id=event.customer_id,
                status=STATUS[OrderPlaced], total_amount=event.total_amount, currency=event.currency,
                version=message.version, sequence=message.sequence, updated_at=at)
            return
        if row is None or (row.version, row.sequence) >= (message.version, message.sequence):
            return  # not placed here (created before this projection existed), or already applied
        row.status = STATUS.get(type(event), row.status)
        if isinstance(event, OrderPaid):
            row.paid_amount = Decimal(event.amount)
        row.version, row.sequence = message.version, message.sequence
        row.updated_at = at
        row.save(update_fields=["status", "paid_amount", "version", "sequence", "updated_at"])

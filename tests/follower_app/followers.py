"""Followers of the SIGKILL test (tests/test_follower_kill.py), run by ``manage.py wow_follow`` processes.

``kill-probe`` takes every order stream, slowly (10 ms each, so a kill lands
mid-batch), and records each call in ``kill_calls`` (every call, a row each)
and its effect in ``kill_applied`` (one row per position: the idempotent
part, an insert that a second call leaves alone). ``kill-relay`` is a bus
relay like the sample's: ``order_paid`` → ``order.purchased``, with an
eventId derived from the domain event's id.
"""

from __future__ import annotations

import time

from django.db import connection

from sample_project.orders.aggregates import Order, OrderPaid
from wow_django.application.followers import follower
from wow_django.bus import get_bus
from wow_django.domain import event_processor

TABLES = (
    "CREATE TABLE IF NOT EXISTS kill_calls (position integer NOT NULL, at timestamptz NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS kill_applied (position integer PRIMARY KEY, stream_id text NOT NULL)",
)


def create_tables() -> None:
    with connection.cursor() as cursor:
        for sql in TABLES:
            cursor.execute(sql)


@follower("kill-probe", aggregates={"order"})
def probe(item) -> None:
    time.sleep(0.01)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO kill_calls (position) VALUES (%s)", [item.position])
        cursor.execute("INSERT INTO kill_applied (position, stream_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                       [item.position, item.stream.id])


@event_processor(Order, events=[OrderPaid], name="kill-relay")
def relay(message) -> None:
    time.sleep(0.01)
    get_bus().send("order.purchased", {"orderId": message.aggregate_id.id, "amount": str(message.event.amount)},
                   event_id=f"kill-{message.event_id}", partition_key=message.aggregate_id.id,
                   sequence=message.version)

"""The bus scenario of seed 004 §7, end to end.

``run_bus_demo(stdout)`` configures the topic consumers, places and pays a few
orders through the command gateway (the event processor publishes
``order.purchased``), runs ``member-service`` and ``message-service`` as
consumer workers in threads of this process until every event of those
purchases has settled, then writes each purchase's events with their status
("2/2 consumed") and the trace tree of the first purchase.

The commands have fixed request ids and the purchases fixed trace ids: run
again, nothing is placed, paid or published twice, and the same traces are
shown. On a broker (``amqp://``, ``redis://``) other consumer processes
(``manage.py wow_consume``) may take some of the events; every event settles
all the same.
"""

from __future__ import annotations

import time
from decimal import Decimal

from sample_project.orders.aggregates import OrderLine, PayOrder, PlaceOrder
from sample_project.orders.integration import MEMBER_SERVICE, MESSAGE_SERVICE, configure_topic_consumers
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.bus import ConsumerWorker, EventStatus, get_bus, run_in_thread
from wow_django.bus.trace import build_tree, render_tree

SETTLED = {EventStatus.CONSUMED.value, EventStatus.PARTIAL.value, EventStatus.FAILED.value}
# order.purchased, points.added, and a notification.sent for each of them.
EVENTS_PER_PURCHASE = 4


def _label(event: dict) -> str:
    summary = event.get("consumption") or {}
    initiator = event.get("initiator") or {}
    return (f"{event['topic']} [{event['status']} {summary.get('text', '')}] "
            f"{initiator.get('service')}/{initiator.get('operation')} {event['eventId']}")


def _settled(bus, trace_ids: list[str]) -> dict[str, dict] | None:
    traces = {}
    for trace_id in trace_ids:
        try:
            trace = bus.trace(trace_id)
        except Exception:
            return None
        if trace["total"] < EVENTS_PER_PURCHASE:
            return None
        unsettled = [e for e in trace["timeline"] if e["status"] not in SETTLED]
        for event in unsettled:
            bus.rollup(event["eventId"])  # idempotent; settles even when no Celery worker runs the rollup queue
        if unsettled:
            return None
        traces[trace_id] = trace
    return traces


def run_bus_demo(stdout, *, orders: int = 3, timeout: float = 60.0, also_settle: list[str] = ()) -> None:
    """``also_settle``: trace ids of other purchases to wait for (not shown), e.g. those of ``wow_demo``'s orders."""
    bus = get_bus()
    configure_topic_consumers(bus)
    gateway = get_runtime().gateway
    workers = [ConsumerWorker(MEMBER_SERVICE, bus=bus), ConsumerWorker(MESSAGE_SERVICE, bus=bus)]
    threads = [run_in_thread(worker) for worker in workers]
    trace_ids: list[str] = []
    try:
        for n in range(orders):
            items = [OrderLine(sku=f"SKU-{n + 1}", quantity=n + 1, unit_price=Decimal("49.90"))]
            placed = gateway.send(PlaceOrder(customer_id=f"user-{'ABC'[n % 3]}", items=items),
                                  request_id=f"demo-bus-order-{n + 1}", operator=f"user-{'ABC'[n % 3]}")
            total = Decimal("49.90") * (n + 1)
            trace_id = f"trace-demo-bus-{n + 1}"
            paid = gateway.send(PayOrder(amount=total, payment_id=f"pay-{n + 1}"), aggregate_id=placed.aggregate_id,
                                request_id=f"demo-bus-pay-{n + 1}", operator=f"user-{'ABC'[n % 3]}",
                                header={"traceId": trace_id}, wait=WaitStage.PROJECTED)
            if not paid.succeeded:
                stdout.write(f"order {placed.aggregate_id}: {paid.error_code} {paid.error_msg}\n")
                continue
            trace_ids.append(trace_id)
        deadline = time.monotonic() + timeout
        awaited = [*trace_ids, *also_settle]
        traces = _settled(bus, awaited)
        while traces is None and time.monotonic() < deadline:
            time.sleep(0.05)
            traces = _settled(bus, awaited)
        if traces is not None:
            traces = {trace_id: traces[trace_id] for trace_id in trace_ids}
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(10)
    if traces is None:
        stdout.write(f"The events did not settle within {timeout:g}s.\n")
        traces = {}
        for trace_id in trace_ids:
            try:
                traces[trace_id] = bus.trace(trace_id)
            except Exception as exc:
                stdout.write(f"  {trace_id}: {exc}\n")
    stdout.write(f"Bus demo: {len(trace_ids)} paid orders published order.purchased "
                 f"(consumers {MEMBER_SERVICE}, {MESSAGE_SERVICE}).\n")
    for trace_id, trace in traces.items():
        stdout.write(f"\n{trace_id}\n")
        for event in trace["timeline"]:
            summary = event.get("consumption") or {}
            stdout.write(f"  {event['topic']:<18} {event['status']:<9} {summary.get('text', ''):<13} "
                         f"{event['eventId']}\n")
    if traces:
        first = next(iter(traces.values()))
        stdout.write(f"\nTrace tree of {first['traceId']}:\n")
        for line in render_tree(build_tree(first["timeline"]), _label):
            stdout.write(f"  {line}\n")

"""Snapshots in motion: strategies, Celery mode with coalescing, the rebuild command."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from io import StringIO

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from sample_project.orders.aggregates import ChangeDisplayName, Customer, OrderLine, PlaceOrder, RegisterCustomer
from wow_django.application.gateway import WaitStage
from wow_django.application.repository import AggregateRepository
from wow_django.application.runtime import get_runtime
from wow_django.application.snapshotting import rebuild_snapshots, refresh_snapshot, should_snapshot
from wow_django.domain.aggregate import Aggregate
from wow_django.persistence.records import AggregateId
from wow_django.tasks import _snapshot_key

from .support import fresh_wow


def snapshot_version(name, aggregate_id):
    snapshot = get_runtime().snapshot_store.load(AggregateId(name, aggregate_id))
    return snapshot.version if snapshot else None


def renamed(customer, n, wait=WaitStage.SNAPSHOT):
    return get_runtime().gateway.send(ChangeDisplayName(display_name=f"name {n}"), aggregate_id=customer, wait=wait)


def register(username="snap"):
    return get_runtime().gateway.send(RegisterCustomer(username=username, display_name="start"),
                              wait=WaitStage.SNAPSHOT).aggregate_id


class Probe(Aggregate, abstract=True):
    """Only the attributes the strategies read."""

    def __init__(self, version, snapshot_version=0, snapshot_time=0):
        self.version, self.snapshot_version, self.snapshot_time = version, snapshot_version, snapshot_time


@pytest.mark.parametrize(
    "strategy, probe, expected",
    [
        ("all", Probe(3, 2), True),
        ("none", Probe(30, 0), False),
        ("version_offset", Probe(5, 0), True),
        ("version_offset", Probe(4, 0), False),
        ("version_offset", Probe(9, 5), False),
        ("version_offset", Probe(10, 5), True),
        ("time_offset", Probe(2, 1, 0), True),  # no snapshot yet
        ("time_offset", Probe(2, 1, 100_000), False),  # 50 s old, offset 60 s
        ("time_offset", Probe(2, 1, 80_000), True),  # 70 s old
    ],
)
def test_strategies(strategy, probe, expected):
    assert should_snapshot(strategy, probe, version_offset=5, time_offset_s=60, now=150_000) is expected


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown snapshot strategy"):
        should_snapshot("sometimes", Probe(1), version_offset=1, time_offset_s=1)


@pytest.mark.parametrize("storage", ["in_memory", "mongo"])
def test_every_version_strategy(storage):
    with override_settings(WOW=fresh_wow(storage, SNAPSHOT_STRATEGY="all")):
        customer = register()
        assert snapshot_version("customer", customer) == 1
        renamed(customer, 1)
        assert snapshot_version("customer", customer) == 2


@pytest.mark.parametrize("storage", ["in_memory", "mongo"])
def test_every_n_versions_strategy(storage):
    with override_settings(WOW=fresh_wow(storage, SNAPSHOT_STRATEGY="version_offset", SNAPSHOT_VERSION_OFFSET=3)):
        customer = register()
        assert snapshot_version("customer", customer) is None  # 1 - 0 < 3
        seen = []
        for n in range(2, 9):
            renamed(customer, n)
            seen.append(snapshot_version("customer", customer))
        assert seen == [None, 3, 3, 3, 6, 6, 6]


def test_time_strategy_snapshots_when_the_snapshot_is_old(monkeypatch):
    import wow_django.application.snapshotting as snapshots

    clock = [1_000_000]
    monkeypatch.setattr(snapshots, "now_ms", lambda: clock[0])
    with override_settings(WOW=fresh_wow("in_memory", SNAPSHOT_STRATEGY="time_offset", SNAPSHOT_TIME_OFFSET_S=60)):
        customer = register()
        assert snapshot_version("customer", customer) == 1  # there was none
        first = get_runtime().snapshot_store.load(AggregateId("customer", customer)).snapshot_time
        clock[0] = first + 30_000
        renamed(customer, 2)
        assert snapshot_version("customer", customer) == 1
        clock[0] = first + 61_000
        renamed(customer, 3)
        assert snapshot_version("customer", customer) == 3


def test_no_snapshot_strategy():
    with override_settings(WOW=fresh_wow("in_memory", SNAPSHOT_STRATEGY="none")):
        customer = register()
        renamed(customer, 2)
        assert snapshot_version("customer", customer) is None


def test_celery_mode_queues_one_task_per_aggregate_until_it_runs(monkeypatch):
    """Repeated requests for one aggregate coalesce while a task is pending."""
    from wow_django import tasks

    queued = []
    monkeypatch.setattr(tasks.save_snapshot, "delay", lambda name, id: queued.append((name, id)))
    cache.clear()
    with override_settings(WOW=fresh_wow("mongo", SNAPSHOT_MODE="celery")):
        customer = register()
        for n in range(2, 6):
            renamed(customer, n)
        assert queued == [("customer", customer)]
        assert snapshot_version("customer", customer) is None
        tasks.save_snapshot("customer", customer)  # the worker runs it
        assert snapshot_version("customer", customer) == 5
        renamed(customer, 6)
        assert queued == [("customer", customer)] * 2
        assert tasks.save_snapshot("customer", customer) == 6
        assert tasks.save_snapshot("customer", customer) == 6  # idempotent
        assert tasks.save_snapshot("customer", "nobody") is None
    cache.clear()


def test_celery_mode_eager_saves_inline_through_the_task():
    cache.clear()
    with override_settings(WOW=fresh_wow("in_memory", SNAPSHOT_MODE="celery")):
        customer = register()
        renamed(customer, 2)
        assert snapshot_version("customer", customer) == 2
        assert cache.get(_snapshot_key("customer", customer)) is None


def run_rebuild(*args):
    out = StringIO()
    call_command("wow_rebuild_snapshots", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("storage", ["in_memory", "mongo"])
def test_rebuild_replays_every_aggregate_and_is_safe_to_rerun(storage):
    with override_settings(WOW=fresh_wow(storage, SNAPSHOT_STRATEGY="none")):
        customers = [register(f"user{n}") for n in range(7)]
        for customer in customers[:3]:
            renamed(customer, 2)
        get_runtime().gateway.send(PlaceOrder(customer_id=customers[0],
                                      items=[OrderLine(sku="A", quantity=1, unit_price=Decimal("1"))]))
        assert all(snapshot_version("customer", c) is None for c in customers)
        out = run_rebuild("customer")
        assert "customer: 7 snapshot(s) rebuilt" in out
        assert "[##############################] 7/7" in out
        assert [snapshot_version("customer", c) for c in customers] == [2, 2, 2, 1, 1, 1, 1]
        state = get_runtime().snapshot_store.load(AggregateId("customer", customers[0])).state
        assert state == {"username": "user0", "display_name": "name 2"}
        assert "customer: 7 snapshot(s) rebuilt" in run_rebuild("customer")  # rerun: same result
        assert [snapshot_version("customer", c) for c in customers] == [2, 2, 2, 1, 1, 1, 1]
        everything = run_rebuild()
        assert "order: 1 snapshot(s) rebuilt" in everything and "customer: 7" in everything


def test_rebuild_refuses_unknown_aggregates():
    with override_settings(WOW=fresh_wow("in_memory")):
        with pytest.raises(CommandError, match="Unknown aggregate\\(s\\): invoice"):
            run_rebuild("invoice")


@pytest.mark.parametrize("storage", ["in_memory", "mongo"])
def test_rebuild_never_lowers_a_newer_snapshot(storage):
    """A command and its snapshot land while the rebuild replays the aggregate: the newer snapshot stays."""
    with override_settings(WOW=fresh_wow(storage, SNAPSHOT_STRATEGY="none")):
        busy, quiet = register("busy"), register("quiet")
        renamed(busy, 2)
        runtime = get_runtime()
        replayed: dict[str, int] = {}

        class LiveTraffic(AggregateRepository):
            """The rebuild's repository: live traffic gets in between its replay of ``busy`` and the save."""

            def load(self, cls, aggregate_id, **kwargs):
                aggregate = super().load(cls, aggregate_id, **kwargs)
                replayed[aggregate_id] = aggregate.version
                if aggregate_id == busy:
                    renamed(busy, 3)
                    assert refresh_snapshot(runtime.gateway.repository, Customer, busy) == 3
                return aggregate

        repository = LiveTraffic(runtime.event_store, runtime.snapshot_store, "order-service")
        assert rebuild_snapshots(repository, Customer) == 2
        assert replayed == {busy: 2, quiet: 1}  # the rebuild saved its v2 of busy after v3 was stored
        snapshot = runtime.snapshot_store.load(AggregateId("customer", busy))
        assert (snapshot.version, snapshot.state["display_name"]) == (3, "name 3")
        assert snapshot_version("customer", quiet) == 1  # nothing newer there: the rebuild's snapshot


def test_a_snapshot_that_no_longer_fits_its_state_is_replaced_by_the_events(every_backend):
    # The django backend reads the snapshot and the events after it in one statement: a snapshot whose state
    # the class refuses must still lead to the whole history, not to the tail after it.
    customer = register("fits")
    renamed(customer, 2)
    runtime = get_runtime()
    stored = runtime.snapshot_store.load(AggregateId("customer", customer))
    assert stored.version == 2
    runtime.snapshot_store.save(dataclasses.replace(stored, state={"display_name": ["not", "text"]}))
    loaded = runtime.gateway.repository.load(Customer, customer, tenant_id=stored.aggregate_id.tenant_id)
    assert loaded.version == 2 and loaded.snapshot_version == 0
    assert (loaded.state.username, loaded.state.display_name) == ("fits", "name 2")


def test_the_state_at_a_time_stops_before_a_gap_in_the_versions():
    # Two writers' clocks: version 3 stamped before version 2. At a time between them, version 3 is "created"
    # but version 2 is not: the state stops at version 1 rather than apply 3 over 1.
    from wow_django.backends.memory.stores import InMemoryEventStore
    from wow_django.testing.event_store import make_stream

    store = InMemoryEventStore()
    key = AggregateId("customer", "c-1", "order-service")
    body = {"username": "x", "display_name": "one"}
    first = make_stream(key, 1, create_time=100)
    store.append(dataclasses.replace(first, body=(dataclasses.replace(
        first.body[0], name="customer_registered", body=body),)))
    for version, created in ((2, 300), (3, 200)):
        stream = make_stream(key, version, create_time=created)
        store.append(dataclasses.replace(stream, body=(dataclasses.replace(
            stream.body[0], name="display_name_changed", body={"display_name": f"v{version}"}),)))
    repository = AggregateRepository(store, None, "order-service")
    at = repository.load_at_time(Customer, "c-1", tenant_id=key.tenant_id, create_time=250)
    assert (at.version, at.state.display_name) == (1, "one")
    at = repository.load_at_time(Customer, "c-1", tenant_id=key.tenant_id, create_time=300)
    assert (at.version, at.state.display_name) == (3, "v3")
    assert repository.load_at_time(Customer, "c-1", tenant_id=key.tenant_id, create_time=99) is None


def test_a_repeated_request_waits_for_the_first_requests_inline_snapshot():
    """SNAPSHOT_MODE "inline": the same request sent again with wait SNAPSHOT (what the server-sent stream does
    for its next stage) is answered SNAPSHOT only once the first request's snapshot is saved."""
    import threading

    gate = threading.Event()
    with override_settings(WOW=fresh_wow("in_memory", SNAPSHOT_MODE="inline")):
        gateway = get_runtime().gateway
        save = gateway.dispatcher.save_snapshot

        def slow_save(snapshot):
            gate.wait(10)
            save(snapshot)

        gateway.dispatcher.save_snapshot = slow_save
        try:
            first = gateway.send(RegisterCustomer(username="slow", display_name="start"), request_id="inline-1")
            assert first.stage is WaitStage.PROCESSED
            held = gateway.send(RegisterCustomer(username="slow", display_name="start"), request_id="inline-1",
                                wait=WaitStage.SNAPSHOT, timeout=0.3)
            assert held.duplicate and (held.stage, held.error_code) == (WaitStage.PROCESSED, "RequestTimeout")
            assert snapshot_version("customer", first.aggregate_id) is None
            gate.set()
            done = gateway.send(RegisterCustomer(username="slow", display_name="start"), request_id="inline-1",
                                wait=WaitStage.SNAPSHOT, timeout=5)
            assert done.duplicate and done.stage is WaitStage.SNAPSHOT and done.succeeded
            assert snapshot_version("customer", first.aggregate_id) == 1
        finally:
            gate.set()
            gateway.dispatcher.save_snapshot = save

"""The command gateway on both local backends, through the sample order service."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest

from sample_project.orders.aggregates import (
    CancelOrder,
    ChangeDisplayName,
    OrderLine,
    PayOrder,
    PlaceOrder,
    RegisterCustomer,
    ShipOrder,
    username_key,
)
from wow_django.application.following import wait_caught_up
from wow_django.application.gateway import CommandGateway, WaitStage, derived_aggregate_id
from wow_django.application.runtime import get_runtime
from wow_django.domain import DeleteAggregate, RecoverAggregate, projection
from wow_django.exceptions import (
    AggregateIsDeleted,
    AggregateNotFound,
    CommandValidationError,
    DomainError,
    DuplicateAggregateId,
    EventVersionConflict,
    RecoverableStoreError,
    UnknownAggregate,
    UnknownCommand,
)
from wow_django.persistence.records import DEFAULT_TENANT_ID, AggregateId

from .support import RivalReads


def place(gateway=None, amount="9.99", quantity=2, **kwargs):
    gateway = gateway or get_runtime().gateway
    items = [OrderLine(sku="SKU-1", quantity=quantity, unit_price=Decimal(amount))]
    return gateway.send(PlaceOrder(customer_id="c-1", items=items), **kwargs)


def versions(aggregate_id, name="order", tenant=DEFAULT_TENANT_ID):
    return [s.version for s in get_runtime().event_store.load(AggregateId(name, aggregate_id, tenant_id=tenant))]


def test_place_pay_ship(wow):
    gateway = get_runtime().gateway
    placed = place()
    assert placed.aggregate_version == 1 and placed.events == ("order_placed",)
    assert placed.stage is WaitStage.PROCESSED and placed.succeeded
    paid = gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p-1"), aggregate_id=placed.aggregate_id)
    shipped = gateway.send(ShipOrder(tracking_number="T-1"), aggregate_id=placed.aggregate_id,
                           wait=WaitStage.SNAPSHOT)
    assert (paid.aggregate_version, shipped.aggregate_version) == (2, 3)
    snapshot = get_runtime().snapshot_store.load(AggregateId("order", placed.aggregate_id))
    assert snapshot.version == 3
    assert snapshot.state["status"] == "SHIPPED" and snapshot.state["total_amount"] == Decimal("19.98")


def test_json_commands_are_validated_with_field_errors_and_nothing_appended(wow):
    placed = place()
    with pytest.raises(CommandValidationError) as caught:
        get_runtime().gateway.send_json("order", "pay_order", {"amount": "-1", "payment_idx": "p"},
                                aggregate_id=placed.aggregate_id)
    names = {e["name"] for e in caught.value.binding_errors}
    assert names == {"amount", "payment_id", "payment_idx"}
    assert versions(placed.aggregate_id) == [1]


def test_unknown_command_and_aggregate(wow):
    gateway = get_runtime().gateway
    with pytest.raises(UnknownCommand, match="no command named 'refund_order'"):
        gateway.send_json("order", "refund_order", {}, aggregate_id="x")
    with pytest.raises(UnknownAggregate, match="no aggregate named 'invoice'"):
        gateway.send_json("invoice", "pay_order", {}, aggregate_id="x")
    with pytest.raises(UnknownCommand, match="'register_customer' is not a command of aggregate 'order'"):
        gateway.send_json("order", "register_customer", {"username": "abc", "display_name": "A"})


def test_command_for_a_missing_aggregate(wow):
    with pytest.raises(AggregateNotFound, match="order 'nope' does not exist"):
        get_runtime().gateway.send(PayOrder(amount=Decimal("1"), payment_id="p"), aggregate_id="nope")
    assert versions("nope") == []


def test_aggregate_id_is_required_for_non_create_commands(wow):
    with pytest.raises(CommandValidationError, match="aggregate id is required"):
        get_runtime().gateway.send(PayOrder(amount=Decimal("1"), payment_id="p"))


def test_domain_rules_refuse_and_append_nothing(wow):
    gateway = get_runtime().gateway
    order = place().aggregate_id
    with pytest.raises(DomainError) as caught:
        gateway.send(PayOrder(amount=Decimal("1.00"), payment_id="p"), aggregate_id=order)
    assert caught.value.error_code == "AMOUNT_MISMATCH"
    with pytest.raises(DomainError, match="must be paid before it ships"):
        gateway.send(ShipOrder(tracking_number="T"), aggregate_id=order)
    gateway.send(CancelOrder(reason="changed my mind"), aggregate_id=order)
    with pytest.raises(DomainError) as caught:
        gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p"), aggregate_id=order)
    assert caught.value.error_code == "ORDER_CANCELLED"
    assert versions(order) == [1, 2]


def test_create_twice_with_one_id_is_a_conflict(wow):
    first = place(aggregate_id="order-fixed")
    with pytest.raises(DuplicateAggregateId, match="already exists"):
        place(aggregate_id="order-fixed")
    assert versions(first.aggregate_id) == [1]


def test_repeated_request_returns_the_first_result_and_appends_nothing(wow):
    gateway = get_runtime().gateway
    first = place(request_id="client-req-1")
    again = place(request_id="client-req-1")
    assert again.duplicate and not first.duplicate
    assert again.aggregate_id == first.aggregate_id == derived_aggregate_id("order", "(0)", "client-req-1")
    assert again.aggregate_version == 1 and again.events == ("order_placed",)
    pay = PayOrder(amount=Decimal("19.98"), payment_id="p-1")
    paid = gateway.send(pay, aggregate_id=first.aggregate_id, request_id="client-req-2")
    repeat = gateway.send(pay, aggregate_id=first.aggregate_id, request_id="client-req-2")
    assert repeat.duplicate and repeat.aggregate_version == paid.aggregate_version == 2
    assert versions(first.aggregate_id) == [1, 2]


def test_a_request_id_repeats_one_request_and_names_no_new_one(wow):
    """The same request id with the same command and body: the first result, its command id included. With
    another body or another command: refused (RequestIdReused), nothing appended."""
    from wow_django.exceptions import RequestIdReused

    gateway = get_runtime().gateway
    first = place(request_id="idem-1")
    again = place(request_id="idem-1")
    assert again.duplicate and again.command_id == first.command_id and again.aggregate_version == 1
    with pytest.raises(RequestIdReused, match="a different 'place_order' body"):
        place(request_id="idem-1", amount="1.00")  # same key, another amount
    order = first.aggregate_id
    paid = gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p-1"), aggregate_id=order, request_id="idem-2")
    repeat = gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p-1"), aggregate_id=order,
                          request_id="idem-2")
    assert repeat.duplicate and repeat.command_id == paid.command_id
    with pytest.raises(RequestIdReused, match="command 'pay_order'"):
        gateway.send(CancelOrder(reason="changed my mind"), aggregate_id=order, request_id="idem-2")
    assert versions(order) == [1, 2]


def test_tenants_cannot_reach_each_others_aggregates(wow):
    gateway = get_runtime().gateway
    order = place(tenant_id="tenant-a").aggregate_id
    with pytest.raises(AggregateNotFound):
        gateway.send(CancelOrder(reason="x"), aggregate_id=order, tenant_id="tenant-b")
    gateway.send(CancelOrder(reason="x"), aggregate_id=order, tenant_id="tenant-a")
    store = get_runtime().event_store
    assert store.last(AggregateId("order", order, "order-service", "tenant-b")) is None
    stream = store.last(store.locate("order", order))
    assert stream.aggregate_id.tenant_id == "tenant-a" and stream.version == 2


def test_owner_and_operator_are_recorded(wow):
    order = place(owner_id="user-9", operator="alice", wait=WaitStage.SNAPSHOT).aggregate_id
    get_runtime().gateway.send(CancelOrder(reason="x"), aggregate_id=order, operator="bob", wait=WaitStage.SNAPSHOT)
    snapshot = get_runtime().snapshot_store.load(AggregateId("order", order))
    assert (snapshot.owner_id, snapshot.first_operator, snapshot.operator) == ("user-9", "alice", "bob")


def test_soft_delete_and_recover(wow):
    gateway = get_runtime().gateway
    order = place().aggregate_id
    gateway.send(DeleteAggregate(), aggregate="order", aggregate_id=order, wait=WaitStage.SNAPSHOT)
    assert get_runtime().snapshot_store.load(AggregateId("order", order)).deleted
    with pytest.raises(AggregateIsDeleted, match="recover it before sending 'cancel_order'"):
        gateway.send(CancelOrder(reason="x"), aggregate_id=order)
    with pytest.raises(AggregateIsDeleted, match="already deleted"):
        gateway.send(DeleteAggregate(), aggregate="order", aggregate_id=order)
    gateway.send(RecoverAggregate(), aggregate="order", aggregate_id=order, wait=WaitStage.SNAPSHOT)
    assert not get_runtime().snapshot_store.load(AggregateId("order", order)).deleted
    with pytest.raises(DomainError, match="not deleted"):
        gateway.send(RecoverAggregate(), aggregate="order", aggregate_id=order)
    gateway.send(CancelOrder(reason="x"), aggregate_id=order)
    assert versions(order) == [1, 2, 3, 4]
    with pytest.raises(UnknownCommand, match="needs the aggregate"):
        gateway.send(DeleteAggregate(), aggregate_id=order)


def test_unique_username_through_prepare_key(wow):
    gateway = get_runtime().gateway
    alice = gateway.send(RegisterCustomer(username=" Alice ", display_name="Alice A"))
    with pytest.raises(DomainError) as caught:
        gateway.send(RegisterCustomer(username="alice", display_name="Impostor"))
    assert caught.value.error_code == "USERNAME_TAKEN"
    assert get_runtime().prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "alice")).value == alice.aggregate_id
    gateway.send(ChangeDisplayName(display_name="Alice B"), aggregate_id=alice.aggregate_id)


def test_prepared_username_is_released_when_the_append_fails(wow):
    gateway = get_runtime().gateway
    gateway.send(RegisterCustomer(username="bob", display_name="Bob"), aggregate_id="customer-1")
    # Same aggregate id again: the handler reserves 'carol', then the append
    # fails (the id exists): the reservation must be released.
    with pytest.raises(DuplicateAggregateId):
        gateway.send(RegisterCustomer(username="carol", display_name="Carol"), aggregate_id="customer-1")
    assert get_runtime().prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "carol")) is None
    gateway.send(RegisterCustomer(username="carol", display_name="Carol"))


def test_wait_projected_waits_for_projections_and_reports_failures(wow):
    seen: list[tuple[str, int]] = []

    @projection("order")
    def record(message):
        time.sleep(0.05)
        seen.append((message.name, message.version))

    @projection("order", events=["order_cancelled"])
    def explode(message):
        raise RuntimeError("read model is down")

    result = place(wait=WaitStage.PROJECTED)
    assert result.stage is WaitStage.PROJECTED and result.succeeded
    assert seen == [("order_placed", 1)]
    cancelled = get_runtime().gateway.send(CancelOrder(reason="x"), aggregate_id=result.aggregate_id,
                                   wait=WaitStage.PROJECTED)
    assert cancelled.error_code == "DispatchFailed" and "read model is down" in cancelled.error_msg
    assert cancelled.aggregate_version == 2  # appended all the same
    assert seen[-1] == ("order_cancelled", 2)


def test_wait_projected_times_out_while_the_projection_runs(wow):
    """The command's own projection blocks: the snapshot step is done, the projection is not."""
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    @projection("order")
    def blocked(message):
        started.set()
        release.wait(10)
        finished.set()

    try:
        began = time.monotonic()
        result = place(wait=WaitStage.PROJECTED, timeout=0.2)
        waited = time.monotonic() - began
        assert started.is_set() and not finished.is_set()
        assert result.error_code == "RequestTimeout" and not result.succeeded
        assert result.error_msg == ("appended, but PROJECTED did not finish within 0.2s (waiting for the projection "
                                    "follower(s) projection-order-blocked; is a follower running? see manage.py "
                                    "wow_followers)")
        assert result.stage is WaitStage.SNAPSHOT  # the last stage reached
        assert (result.aggregate_version, result.events) == (1, ("order_placed",))
        assert 0.2 <= waited < 5  # the timeout given, not the gateway's 30 s default
        assert versions(result.aggregate_id) == [1]  # appended all the same
        assert get_runtime().snapshot_store.load(AggregateId("order", result.aggregate_id)).version == 1
    finally:
        release.set()
    assert finished.wait(10)


def test_an_earlier_stream_held_by_a_projection_holds_the_later_ones_behind_it(wow):
    """A projection sees each aggregate's streams in order: while it is stuck on an earlier command's stream,
    a later command is stored and snapshotted (the snapshot lane is its own), but PROJECTED waits."""
    started, release = threading.Event(), threading.Event()
    projected: list[int] = []

    @projection("order")
    def blocked(message):
        if message.version == 1:
            started.set()
            release.wait(10)
        projected.append(message.version)

    gateway = get_runtime().gateway
    try:
        placed = place()  # PROCESSED: returns once appended; its projection then holds the follower
        assert started.wait(10)
        paid = gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p-1"), aggregate_id=placed.aggregate_id,
                            wait=WaitStage.PROJECTED, timeout=0.2)
        assert (paid.error_code, paid.stage) == ("RequestTimeout", WaitStage.SNAPSHOT)
        assert paid.error_msg.startswith("appended, but PROJECTED did not finish within 0.2s")
        assert (paid.aggregate_version, paid.events) == (2, ("order_paid",))
        assert versions(placed.aggregate_id) == [1, 2]
        assert get_runtime().snapshot_store.load(AggregateId("order", placed.aggregate_id)).version == 2
        assert projected == []
    finally:
        release.set()
    assert wait_caught_up(timeout=10)
    assert projected == [1, 2]


def test_projections_see_each_aggregate_in_version_order(wow):
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    @projection("customer")
    def record(message):
        with lock:
            seen.setdefault(message.aggregate_id.id, []).append(message.version)

    gateway = get_runtime().gateway
    customers = [gateway.send(RegisterCustomer(username=f"user{n}", display_name="x")).aggregate_id
                 for n in range(4)]

    def worker(customer, n):
        for i in range(10):
            gateway.send(ChangeDisplayName(display_name=f"{n}-{i}"), aggregate_id=customer)

    threads = [threading.Thread(target=worker, args=(c, n)) for c in customers for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wait_caught_up(timeout=20)
    for customer in customers:
        assert seen[customer] == list(range(1, 22))
        assert seen[customer] == versions(customer, "customer")


def test_eight_threads_fifty_commands_each_on_one_aggregate(wow):
    """Every accepted command applied exactly once; version equals their count."""
    gateway = get_runtime().gateway
    customer = gateway.send(RegisterCustomer(username="racer", display_name="start")).aggregate_id
    accepted: list[str] = []
    refused: list[Exception] = []
    lock = threading.Lock()

    def worker(n):
        for i in range(50):
            try:
                result = gateway.send(ChangeDisplayName(display_name=f"t{n}-{i}"), aggregate_id=customer,
                                      request_id=f"t{n}-{i}")
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                with lock:
                    refused.append(exc)
            else:
                with lock:
                    accepted.append(result.request_id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused == []
    streams = get_runtime().event_store.load(AggregateId("customer", customer))
    assert len(accepted) == 400
    assert [s.version for s in streams] == list(range(1, 402))
    assert sorted(s.request_id for s in streams[1:]) == sorted(accepted)


class FlakyStore:
    """Wraps an event store; the first ``fail`` appends raise ``error``."""

    def __init__(self, inner, error, fail):
        self.inner, self.error, self.fail = inner, error, fail
        self.appends = 0

    def append(self, stream):
        self.appends += 1
        if self.appends <= self.fail:
            raise self.error(stream)
        return self.inner.append(stream)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def conflict(stream):
    return EventVersionConflict(stream.aggregate_name, stream.aggregate_id.id, stream.version)


def transient(stream):
    return RecoverableStoreError("primary stepped down; retry")


@pytest.mark.parametrize("error", [conflict, transient])
def test_conflicts_and_transient_errors_are_retried_with_backoff(wow_memory, error):
    store = FlakyStore(get_runtime().event_store, error, fail=3)
    gateway = CommandGateway(store, get_runtime().snapshot_store, context_name="order-service", prepare_keys=get_runtime().prepare_key, retry_limit=5,
                             retry_backoff_ms=1)
    result = place(gateway)
    assert result.aggregate_version == 1 and store.appends == 4
    gateway.close()


def test_retries_stop_at_the_limit(wow_memory):
    store = FlakyStore(get_runtime().event_store, conflict, fail=100)
    gateway = CommandGateway(store, get_runtime().snapshot_store, context_name="order-service", prepare_keys=get_runtime().prepare_key, retry_limit=2,
                             retry_backoff_ms=0)
    with pytest.raises(EventVersionConflict):
        place(gateway)
    assert store.appends == 3
    gateway.close()


def test_bad_wait_stage_and_ids_are_validation_errors(wow):
    with pytest.raises(CommandValidationError, match="wait stage 'EVENTUALLY'"):
        place(wait="EVENTUALLY")
    with pytest.raises(CommandValidationError, match="request_id must be a printable string"):
        place(request_id="x" * 200)
    with pytest.raises(CommandValidationError, match="aggregate_id must be"):
        place(aggregate_id="bad\nid")


def test_the_repository_reads_an_aggregate_only_under_its_tenant(wow):
    from sample_project.orders.aggregates import Order
    from wow_django.application.snapshotting import refresh_snapshot

    gateway = get_runtime().gateway
    order = place(tenant_id="t-owner", wait=WaitStage.PROCESSED).aggregate_id
    repository = gateway.repository
    assert repository.load(Order, order, tenant_id="t-other") is None
    assert repository.load(Order, order, tenant_id="t-other", use_snapshot=False) is None
    assert repository.load(Order, order, tenant_id="t-owner").tenant_id == "t-owner"
    assert repository.locate(Order, order) == AggregateId("order", order, "order-service", "t-owner")
    # Another tenant's command on it is refused as not found, and appends nothing.
    with pytest.raises(AggregateNotFound):
        gateway.send(PayOrder(amount=Decimal("19.98"), payment_id="p-1"), aggregate_id=order, tenant_id="t-other")
    assert versions(order, tenant="t-owner") == [1]
    # Code that serves every tenant (the snapshot task) finds the owner's tenant first.
    gateway.send(CancelOrder(reason="x"), aggregate_id=order, tenant_id="t-owner", wait=WaitStage.PROCESSED)
    assert refresh_snapshot(repository, Order, order) == 2
    assert get_runtime().snapshot_store.load(AggregateId("order", order, "order-service", "t-owner")).version == 2


def test_load_uses_the_snapshot_and_later_events(wow):
    gateway = get_runtime().gateway
    order = place(wait=WaitStage.SNAPSHOT).aggregate_id
    repository = gateway.repository
    from sample_project.orders.aggregates import Order

    loaded = repository.load(Order, order, tenant_id=DEFAULT_TENANT_ID)
    assert (loaded.version, loaded.snapshot_version) == (1, 1)
    # An event appended behind the snapshot's back is applied on top of it.
    other = CommandGateway(get_runtime().event_store, None, context_name="order-service", prepare_keys=get_runtime().prepare_key)
    other.send(CancelOrder(reason="late"), aggregate_id=order)
    other.close()
    loaded = repository.load(Order, order, tenant_id=DEFAULT_TENANT_ID)
    assert (loaded.version, loaded.snapshot_version, loaded.state.status) == (2, 1, "CANCELLED")


def test_one_request_id_in_two_tenants_makes_two_aggregates(wow):
    first = place(request_id="shared", tenant_id="tenant-a")
    second = place(request_id="shared", tenant_id="tenant-b")
    assert not second.duplicate and second.aggregate_id != first.aggregate_id
    assert place(request_id="shared", tenant_id="tenant-b").duplicate
    # An explicit id of another tenant's aggregate with a used request id reveals nothing.
    with pytest.raises(AggregateNotFound):
        get_runtime().gateway.send(CancelOrder(reason="x"), aggregate_id=first.aggregate_id, request_id="shared",
                           tenant_id="tenant-b")


class LandsThenFails:
    """Wraps an event store: the first ``fail`` appends are stored, then raise a transient error."""

    def __init__(self, inner, fail=1, unreadable=0):
        self.inner, self.fail, self.unreadable = inner, fail, unreadable
        self.appends = 0

    def append(self, stream):
        self.inner.append(stream)
        self.appends += 1
        if self.appends <= self.fail:
            raise RecoverableStoreError("write concern timed out; the write may have applied")

    def get_by_request_id(self, aggregate_id, request_id):
        if self.unreadable > 0:
            self.unreadable -= 1
            raise RecoverableStoreError("no primary")
        return self.inner.get_by_request_id(aggregate_id, request_id)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("request_id", [None, "reg-1"])
@pytest.mark.parametrize("unreadable", [0, 1])
def test_a_write_that_landed_before_a_transient_error_is_a_success(wow_memory, request_id, unreadable):
    store = LandsThenFails(get_runtime().event_store, unreadable=unreadable)
    gateway = CommandGateway(store, get_runtime().snapshot_store, context_name="order-service", prepare_keys=get_runtime().prepare_key, retry_backoff_ms=0)
    result = gateway.send(RegisterCustomer(username="ada", display_name="Ada"), request_id=request_id)
    assert result.succeeded and not result.duplicate and result.aggregate_version == 1
    assert store.appends == 1  # never written twice
    # The reservation belongs to the stored customer: a second 'ada' is refused.
    assert get_runtime().prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "ada")).value == result.aggregate_id
    with pytest.raises(DomainError, match="taken"):
        gateway.send(RegisterCustomer(username="ada", display_name="Other"))
    gateway.close()


def test_a_reservation_is_released_when_no_attempt_was_written(wow_memory):
    store = FlakyStore(get_runtime().event_store, transient, fail=100)
    gateway = CommandGateway(store, get_runtime().snapshot_store, context_name="order-service", prepare_keys=get_runtime().prepare_key, retry_limit=2,
                             retry_backoff_ms=0)
    with pytest.raises(RecoverableStoreError):
        gateway.send(RegisterCustomer(username="grace", display_name="Grace"))
    assert get_runtime().prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "grace")) is None
    gateway.close()
    place_again = CommandGateway(get_runtime().event_store, get_runtime().snapshot_store, context_name="order-service", prepare_keys=get_runtime().prepare_key)
    assert place_again.send(RegisterCustomer(username="grace", display_name="Grace")).succeeded
    place_again.close()


def test_a_reservation_held_by_another_aggregate_is_never_released(wow_memory):
    gateway = get_runtime().gateway
    gateway.send(RegisterCustomer(username="linus", display_name="L"), aggregate_id="cust-1")
    # Same aggregate id and username again: the key is held by cust-1, the
    # create fails, and the failure must not release cust-1's username.
    with pytest.raises(DuplicateAggregateId):
        gateway.send(RegisterCustomer(username="linus", display_name="L2"), aggregate_id="cust-1")
    assert get_runtime().prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "linus")).value == "cust-1"


def test_two_gateways_on_one_store_conflict_and_retry(wow):
    """Two gateways stand for two processes: their commands really conflict and are retried."""
    barrier, conflicts = threading.Barrier(2, timeout=10), []
    views = [RivalReads(get_runtime().event_store, barrier, conflicts) for _ in range(2)]
    gateways = [CommandGateway(view, None, context_name="order-service", prepare_keys=get_runtime().prepare_key,
                               retry_limit=30, retry_backoff_ms=0.2)
                for view in views]
    customer = gateways[0].send(RegisterCustomer(username="shared", display_name="s")).aggregate_id
    for view in views:
        view.armed = True  # the first command of each gateway reads version 1, then appends version 2

    def worker(n):
        gateway = gateways[n % 2]
        for i in range(25):
            gateway.send(ChangeDisplayName(display_name=f"{n}-{i}"), aggregate_id=customer)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for gateway in gateways:
        gateway.close()
    assert versions(customer, "customer") == list(range(1, 152))
    assert 2 in conflicts, "the two gateways' first commands did not conflict: the retry path was not exercised"


@pytest.mark.parametrize("expect_version", [False, True])
def test_a_copy_of_a_request_refused_in_the_state_its_twin_made_answers_the_twins_result(every_backend, expect_version):
    """Issue 26, item 4: two copies of one request (same request id) in two processes. The copy that looked
    the request id up just before its twin appended loads the state the twin made and is refused there
    (ORDER_ALREADY_PAID, or CommandExpectVersionConflict with Command-Aggregate-Version): it must answer the
    twin's result as a duplicate, not the refusal."""
    first, second = (CommandGateway(get_runtime().event_store, None, context_name="order-service",
                                    prepare_keys=get_runtime().prepare_key) for _ in range(2))
    order = place(first, amount="5.00", quantity=1).aggregate_id
    pay = PayOrder(amount=Decimal("5.00"), payment_id="pay-1")
    options = {"aggregate_id": order, "request_id": "pay-req-1"}
    if expect_version:
        options["expected_version"] = 1
    twin: list = []
    lookup = second._find_stored

    def looked_up_then_twin_appends(message):
        found = lookup(message)
        if not twin:  # the other process's copy lands right after this lookup saw nothing
            twin.append(first.send(pay, **options))
        return found

    second._find_stored = looked_up_then_twin_appends
    answer = second.send(pay, **options)
    assert twin[0].succeeded and not twin[0].duplicate
    assert answer.succeeded and answer.duplicate, answer
    assert (answer.aggregate_version, answer.command_id) == (twin[0].aggregate_version, twin[0].command_id)
    assert versions(order) == [1, 2]
    # A refusal that is the request's own still stands.
    with pytest.raises(DomainError, match="already paid") as refused:
        second.send(pay, aggregate_id=order, request_id="pay-req-2")
    assert refused.value.error_code == "ORDER_ALREADY_PAID"
    for gateway in (first, second):
        gateway.close()


def test_a_queued_message_holding_a_nul_is_refused_and_recorded(wow):
    """What the Python API refuses at send, a message queued from elsewhere is refused at processing too."""
    from wow_django.application.gateway import CommandMessage

    gateway = get_runtime().gateway
    message = CommandMessage(aggregate_name="customer", command_name="register_customer",
                             body={"username": "nul", "display_name": "a\x00"}, aggregate_id="cust-nul",
                             request_id="req-nul", command_id="cmd-nul", request_id_given=True,
                             tenant_id=DEFAULT_TENANT_ID, owner_id="", operator="", header={})
    with pytest.raises(CommandValidationError) as caught:
        gateway.process_message(message)
    assert caught.value.binding_errors[0]["name"] == "display_name"
    status = gateway.status("customer", "req-nul", tenant_id=DEFAULT_TENANT_ID)
    assert status.error_code == "CommandValidation"


@pytest.mark.parametrize("lookup_fails", [False, True])
def test_a_refusal_is_kept_only_when_it_is_the_requests_own_and_the_request_named_its_id(wow, lookup_fails):
    """A business rule's refusal is kept under the request id (the same request again gets it back as a repeat)
    only when the client named that id and the gateway could tell no copy of the request had stored events:
    when the lookup after the refusal fails (the outcome is unknown), or when the id was generated, nothing is
    kept, and the request sent again runs again (a fresh refusal, not a repeat)."""
    gateway = get_runtime().gateway
    order_id = place(amount="5.00", quantity=1).aggregate_id
    wrong = PayOrder(amount=Decimal("1.00"), payment_id="p-1")
    lookup, calls = gateway._find_stored, []

    def second_lookup_fails(message):
        calls.append(message.request_id)
        if lookup_fails and len(calls) == 2:  # the one after the refusal: did a copy of this request land?
            raise RecoverableStoreError("no primary")
        return lookup(message)

    gateway._find_stored = second_lookup_fails
    with pytest.raises(DomainError) as first:
        gateway.send(wrong, aggregate_id=order_id, request_id="pay-kept")
    assert first.value.error_code == "AMOUNT_MISMATCH" and len(calls) == 2
    kept = gateway.status("order", "pay-kept", tenant_id=DEFAULT_TENANT_ID, aggregate_id=order_id)
    assert (None if kept is None else kept.error_code) == (None if lookup_fails else "AMOUNT_MISMATCH")
    gateway._find_stored = lookup
    with pytest.raises(DomainError) as again:
        gateway.send(wrong, aggregate_id=order_id, request_id="pay-kept")
    assert again.value.error_code == "AMOUNT_MISMATCH"
    assert again.value.command_result.duplicate is (not lookup_fails)

    # A request id the gateway made up: nothing is kept under it.
    with pytest.raises(DomainError) as generated:
        gateway.send(wrong, aggregate_id=order_id)
    made_up = generated.value.command_result.request_id
    assert made_up and gateway.status("order", made_up, tenant_id=DEFAULT_TENANT_ID, aggregate_id=order_id) is None
    assert versions(order_id) == [1]


def test_a_long_expected_version_is_shown_cut_to_forty_characters():
    """The refusal names the value as given, its repr cut to 40 characters and an ellipsis (a header over HTTP
    may be long: the message stays short); one of 40 characters whole."""
    from wow_django.application.gateway import check_expected_version

    with pytest.raises(CommandValidationError) as long:
        check_expected_version("9" * 100)
    assert str(long.value).endswith(", got '" + "9" * 39 + "…")
    with pytest.raises(CommandValidationError) as forty:
        check_expected_version("9" * 38)  # its repr: 40 characters with the quotes
    assert str(forty.value).endswith(", got '" + "9" * 38 + "'")
    with pytest.raises(CommandValidationError) as short:
        check_expected_version(-1, "Command-Aggregate-Version")
    assert str(short.value).startswith("Command-Aggregate-Version must be a whole number")
    assert str(short.value).endswith(", got -1")


def test_the_retry_backoff_doubles_with_jitter_and_is_capped(wow_memory, monkeypatch):
    """Each retry waits retry_backoff_ms × 2^attempt (attempts past 10 count as 10) × a jitter drawn from
    [0.5, 1.5), at most 2 s: rivals spread out instead of retrying in step, and no command waits long. The
    gateway's clock and dice are stand-ins here (nothing else in the process sleeps less for it)."""
    import types

    import wow_django.application.gateway as gateway_module

    slept: list[float] = []
    drawn: list[tuple[float, float]] = []
    end = {"which": 0}

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return (low, high)[end["which"]]

    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in ("monotonic", "time", "perf_counter")},
                                  sleep=slept.append)
    monkeypatch.setattr(gateway_module, "time", clock)
    monkeypatch.setattr(gateway_module, "random", types.SimpleNamespace(uniform=uniform))
    gateway = CommandGateway(get_runtime().event_store, None, context_name="order-service", retry_backoff_ms=1)
    for which, factor in ((0, 0.5), (1, 1.5)):
        end["which"] = which
        slept.clear()
        for attempt in (0, 1, 3, 10, 11, 40):
            gateway._backoff(attempt)
        assert slept == pytest.approx([factor * 2 ** min(a, 10) / 1000 for a in (0, 1, 3, 10, 11, 40)])
    assert set(drawn) == {(0.5, 1.5)}
    gateway.close()
    slower = CommandGateway(get_runtime().event_store, None, context_name="order-service", retry_backoff_ms=10)
    end["which"] = 0
    slower._backoff(10)
    assert slept[-1] == 2.0  # 10 ms × 1024 × 0.5: capped at 2 s
    slower.close()

"""Projections and event processors on followers (DESIGN G): naming, where they run, PROJECTED, poison,
replay, the process's follower threads, the Celery task and the beat schedule."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.test import override_settings

from sample_project.orders.aggregates import CancelOrder, OrderLine, PayOrder, PlaceOrder
from wow_django.application.followers import declared_followers, follower, projection_followers
from wow_django.application.following import run_until_caught_up, wait_caught_up
from wow_django.application.gateway import WaitFunction, WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus
from wow_django.domain import event_processor, projection
from wow_django.exceptions import CommandValidationError, DeclarationError, RecoverableStoreError
from wow_django.persistence.bus import EventQuery

from .support import fresh_wow, wait_for

ITEMS = [OrderLine(sku="SKU-1", quantity=2, unit_price=Decimal("5.00"))]


def place(**kwargs):
    return get_runtime().gateway.send(PlaceOrder(customer_id="c-1", items=ITEMS), **kwargs)


@pytest.fixture
def memory():
    settings = fresh_wow("in_memory")
    with override_settings(WOW=settings):
        yield settings


@pytest.fixture
def elsewhere():
    """Followers do not run in this process (they would in wow_follow processes or from Celery beat)."""
    # Snapshots saved inline: the stages these tests read are the projections' alone.
    settings = fresh_wow("in_memory", FOLLOWERS_RUN="command", SNAPSHOT_MODE="inline")
    with override_settings(WOW=settings):
        yield settings


# --- declaring -------------------------------------------------------------------------------------


def test_each_handler_is_a_follower_named_after_it_or_as_given():
    @projection("order")
    def count_orders(message):
        pass

    @event_processor("order", events=["order_paid"], name="paid-relay")
    def relay(message):
        pass

    declared = declared_followers()
    assert declared["projection-order-count_orders"].kind == "projection"
    assert declared["projection-order-count_orders"].aggregates == frozenset({"order"})
    assert (declared["paid-relay"].kind, declared["paid-relay"].events) == ("processor", frozenset({"order_paid"}))
    assert declared["order-purchased-relay"].kind == "processor"  # the sample's bus relay
    assert projection_followers("order", ["order_paid"]) == ["projection-order-count_orders"]
    assert "paid-relay" not in projection_followers("order", ["order_paid"])  # processors are not waited for


def test_long_or_odd_function_names_make_valid_follower_names():
    handler = lambda message: None  # noqa: E731
    projection("order")(handler)
    name = next(n for n in declared_followers() if "lambda" in n)
    assert name == "projection-order-_lambda_"
    long_named = type(projection)(projection.__code__, {}, "x" * 80)
    projection("order")(long_named)
    long = [n for n in declared_followers() if n.startswith("projection-order-xxx")]
    assert len(long) == 1 and len(long[0]) <= 63


def test_two_handlers_cannot_share_a_follower_name():
    @projection("order", name="same")
    def one(message):
        pass

    with pytest.raises(DeclarationError, match="would both run as follower 'same'"):
        @projection("order", name="same")
        def two(message):
            pass

    projection("order", name="same")(one)  # the same function declared again (a module imported twice): fine
    with pytest.raises(DeclarationError, match="must start with a letter"):
        projection("order", name="bad name!")


def test_a_follower_and_a_projection_cannot_share_a_name():
    @projection("order", name="shared")
    def one(message):
        pass

    @follower("shared")
    def two(item):
        pass

    with pytest.raises(Exception, match="declared with @follower and names a projection"):
        declared_followers()


# --- running ---------------------------------------------------------------------------------------


def test_projections_run_on_this_processs_threads_by_default(memory):
    seen = []

    @projection("order")
    def record(message):
        seen.append((message.name, message.version, threading.current_thread().name))

    result = place(wait=WaitStage.PROJECTED)
    assert result.stage is WaitStage.PROJECTED and result.succeeded
    assert seen == [("order_placed", 1, "wow-follower-projection-order-record")]
    names = get_runtime().follower_threads.names()
    assert "projection-order-record" in names and "order-purchased-relay" in names


def test_a_stream_appended_while_no_follower_runs_is_projected_when_one_runs(elsewhere):
    """What a process killed right after its append used to lose: the stream waits for the follower."""
    seen = []

    @projection("order")
    def record(message):
        seen.append(message.version)

    placed = place()  # PROCESSED: nothing runs the projection in this process
    assert seen == []
    assert get_runtime().follower_threads.names() == []
    positions = run_until_caught_up(["projection-order-record"], budget_s=10)
    assert seen == [1]
    assert positions["projection-order-record"] == get_runtime().stream_feed.position_of("order", placed.aggregate_id, 1)


def test_projected_waits_for_followers_of_another_instance_and_says_what_it_waited_for(elsewhere):
    seen = []

    @projection("order")
    def record(message):
        seen.append(message.version)

    timed_out = place(wait=WaitStage.PROJECTED, timeout=0.2)
    assert (timed_out.error_code, timed_out.stage) == ("RequestTimeout", WaitStage.SNAPSHOT)
    assert "projection follower(s) " in timed_out.error_msg and "projection-order-record" in timed_out.error_msg
    assert "order-summaries" not in timed_out.error_msg  # the ORM projection is not in this (database-less) test

    # Another instance (here: a thread standing in for a wow_follow process) runs the followers.
    stop = threading.Event()
    runner = threading.Thread(target=lambda: [run_until_caught_up(budget_s=0.5) for _ in iter(stop.is_set, True)])
    runner.start()
    try:
        result = place(wait=WaitStage.PROJECTED, timeout=10)
        assert result.stage is WaitStage.PROJECTED and result.succeeded
        assert 1 in seen
    finally:
        stop.set()
        runner.join(10)


def test_a_failing_projection_stops_on_the_stream_and_projected_says_why_at_once(memory):
    broken: set[str] = set()

    @projection("order", events=["order_cancelled"])
    def fragile(message):
        if message.aggregate_id.id in broken:
            raise RuntimeError("read model is down")

    placed = place(wait=WaitStage.PROJECTED)
    broken.add(placed.aggregate_id)
    assert placed.succeeded
    cancelled = get_runtime().gateway.send(CancelOrder(reason="x"), aggregate_id=placed.aggregate_id,
                                           wait=WaitStage.PROJECTED, timeout=10)
    assert cancelled.error_code == "DispatchFailed" and cancelled.stage is WaitStage.PROJECTED
    assert "projection 'projection-order-fragile' is stopped on position" in cancelled.error_msg
    assert "read model is down" in cancelled.error_msg
    state = get_runtime().follower_store.get("projection-order-fragile")
    assert state.poison is not None and state.poison.aggregate == f"order/{placed.aggregate_id}"
    # A later cancel of another order is held behind the poison event: reported, not waited for.
    other = place(wait=WaitStage.PROJECTED, timeout=10)
    assert other.succeeded  # order_placed: the stopped projection does not take it, nothing to wait for
    held = get_runtime().gateway.send(CancelOrder(reason="y"), aggregate_id=other.aggregate_id,
                                      wait=WaitStage.PROJECTED, timeout=10)
    assert held.error_code == "DispatchFailed" and "read model is down" in held.error_msg
    # An operator skips it (audited); the follower goes on.
    get_runtime().follower_store.skip_poison("projection-order-fragile", by="ops", reason="known outage",
                                             now=state.poison.at)
    assert wait_caught_up(["projection-order-fragile"], timeout=10)
    assert get_runtime().gateway.send(CancelOrder(reason="y"), aggregate_id=other.aggregate_id,
                                      request_id=held.request_id, wait=WaitStage.PROJECTED, timeout=10).succeeded
    assert [entry["by"] for entry in get_runtime().follower_store.skipped("projection-order-fragile")] == ["ops"]


def test_a_duplicate_request_waits_for_the_first_requests_projection(elsewhere):
    seen = []

    @projection("order")
    def record(message):
        seen.append(message.version)

    first = place(request_id="dup-1")  # its process "died" before any follower ran
    again = place(request_id="dup-1", wait=WaitStage.PROJECTED, timeout=0.2)
    assert again.duplicate and (again.error_code, again.stage) == ("RequestTimeout", WaitStage.SNAPSHOT)
    run_until_caught_up(budget_s=10)
    again = place(request_id="dup-1", wait=WaitStage.PROJECTED, timeout=5)
    assert again.duplicate and again.stage is WaitStage.PROJECTED and again.aggregate_id == first.aggregate_id
    assert seen == [1]


def test_a_projected_wait_never_holds_another_command_of_the_aggregate_past_its_timeout(elsewhere):
    """No follower runs: a repeated request waits its 3 s for PROJECTED; another command of the same aggregate,
    sent meanwhile by another thread (a threaded or ASGI worker) with 0.3 s, is answered within its own
    timeout with the stage it reached (before: it waited for the repeat's whole wait, behind its lock)."""

    @projection("order")
    def record(message):
        pass

    first = place(request_id="held-1")
    repeat = threading.Thread(target=place, kwargs={"request_id": "held-1", "wait": WaitStage.PROJECTED,
                                                    "timeout": 3})
    repeat.start()
    try:
        time.sleep(0.3)  # the repeat is waiting
        started = time.monotonic()
        paid = get_runtime().gateway.send(PayOrder(amount=Decimal("10.00"), payment_id="p-1"),
                                          aggregate_id=first.aggregate_id, wait=WaitStage.PROJECTED, timeout=0.3)
        took = time.monotonic() - started
    finally:
        repeat.join(10)
    assert took < 1.5, f"held {took:.1f} s"
    assert (paid.aggregate_version, paid.stage, paid.error_code) == (2, WaitStage.SNAPSHOT, "RequestTimeout")


def test_projected_answers_the_stage_reached_when_the_followers_progress_cannot_be_read(elsewhere, monkeypatch):
    """The events are stored: a store error while reading the checkpoints is no 503 (a client would send the
    command again), it is the stage reached and why PROJECTED was not confirmed, within the timeout."""

    @projection("order")
    def record(message):
        pass

    store = get_runtime().follower_store

    def unreachable(name):
        raise RecoverableStoreError("follower store unreachable")

    monkeypatch.setattr(store, "get", unreachable)
    started = time.monotonic()
    placed = place(request_id="unread-1", wait=WaitStage.PROJECTED, timeout=0.5)
    assert time.monotonic() - started < 2
    assert (placed.aggregate_version, placed.stage, placed.error_code) == (1, WaitStage.SNAPSHOT, "RequestTimeout")
    assert "follower store unreachable" in placed.error_msg
    again = place(request_id="unread-1", wait=WaitStage.PROJECTED, timeout=0.2)  # a repeat: the same
    assert again.duplicate and (again.stage, again.error_code) == (WaitStage.SNAPSHOT, "RequestTimeout")


def _three_kinds(seen: dict) -> None:
    """A projection, an event processor and a @follower (a process manager: Wow's saga) of orders."""

    @projection("order")
    def project(message):
        seen.setdefault("projection", []).append(message.version)

    @event_processor("order")
    def relay(message):
        seen.setdefault("processor", []).append(message.version)

    @follower("order-saga", aggregates={"order"})
    def saga(item):
        seen.setdefault("saga", []).append(item.stream.version)


@pytest.mark.parametrize(("stage", "kind", "names"), [
    (WaitStage.EVENT_HANDLED, "processor", ["processor-order-relay"]),  # the sample's relay takes order_paid only
    (WaitStage.SAGA_HANDLED, "saga", ["order-saga", "order-activity"]),  # the sample's @follower takes orders too
])
def test_event_handled_and_saga_handled_wait_for_their_own_followers_only(elsewhere, stage, kind, names):
    name = names[0]
    seen: dict = {}
    _three_kinds(seen)
    timed_out = place(request_id=f"{kind}-1", wait=stage, timeout=0.2)
    # Not confirmed: the stage reached is PROCESSED (these stages come right after it, no snapshot wait).
    assert (timed_out.error_code, timed_out.stage, timed_out.aggregate_version) == ("RequestTimeout",
                                                                                     WaitStage.PROCESSED, 1)
    assert name in timed_out.error_msg and f"{stage.value} did not finish" in timed_out.error_msg
    for other in ("projection-order-project", "processor-order-relay", "order-saga", "order-activity"):
        assert (other in timed_out.error_msg) == (other in names)
    run_until_caught_up(names, budget_s=10)
    again = place(request_id=f"{kind}-1", wait=stage, timeout=5)
    assert again.duplicate and again.succeeded and again.stage is stage
    assert seen == {kind: [1]}  # the others never ran: they were not waited for
    # A new command waits for them the same way (not only a repeat).
    stop = threading.Event()
    runner = threading.Thread(target=lambda: [run_until_caught_up(names, budget_s=0.3)
                                              for _ in iter(stop.is_set, True)])
    runner.start()
    try:
        fresh = place(wait=stage, timeout=10)
    finally:
        stop.set()
        runner.join(10)
    assert fresh.stage is stage and fresh.succeeded and seen[kind] == [1, 1]


def test_a_wait_function_narrows_a_stage_to_the_followers_it_names(elsewhere):
    seen = []

    @projection("order")
    def record_a(message):
        seen.append("a")

    @projection("order")
    def record_b(message):
        seen.append("b")

    narrowed = place(request_id="fn-1", wait=WaitStage.PROJECTED, timeout=0.2,
                     wait_for=WaitFunction(processor="projection-order-record_a"))
    assert narrowed.error_code == "RequestTimeout" and "projection-order-record_a" in narrowed.error_msg
    assert "record_b" not in narrowed.error_msg
    run_until_caught_up(["projection-order-record_a"], budget_s=10)
    done = place(request_id="fn-1", wait=WaitStage.PROJECTED, timeout=5,
                 wait_for=WaitFunction(context=get_runtime().gateway.context_name,
                                       processor="projection-order-record_a"))
    assert done.stage is WaitStage.PROJECTED and done.succeeded and seen == ["a"]
    # By function name; and without narrowing, PROJECTED waits for both.
    by_function = place(request_id="fn-1", wait=WaitStage.PROJECTED, timeout=0.2,
                        wait_for=WaitFunction(function="record_b"))
    assert by_function.error_code == "RequestTimeout" and "projection-order-record_b" in by_function.error_msg
    assert "record_a" not in by_function.error_msg
    every = place(request_id="fn-1", wait=WaitStage.PROJECTED, timeout=0.2)
    assert every.error_code == "RequestTimeout" and "projection-order-record_b" in every.error_msg


@pytest.mark.parametrize(("stage", "wait_for", "field", "words"), [
    (WaitStage.PROJECTED, WaitFunction(processor="no-such"), "wait_for.processor", "must name a projection taking"),
    (WaitStage.EVENT_HANDLED, WaitFunction(processor="projection-order-project"), "wait_for.processor",
     "must name an event processor taking 'order' (order-purchased-relay, processor-order-relay)"),
    (WaitStage.SAGA_HANDLED, WaitFunction(function="project"), "wait_for.function",
     "must name a follower declared with @follower taking 'order' (order-activity, order-saga) whose function"),
    (WaitStage.SNAPSHOT, WaitFunction(processor="processor-order-relay"), "wait_for.processor",
     "narrows the stages PROJECTED, EVENT_HANDLED, SAGA_HANDLED only"),
    (WaitStage.PROJECTED, WaitFunction(context="billing"), "wait_for.context", "must be this service's context"),
    (WaitStage.PROJECTED, WaitFunction(processor="bad\x00name"), "wait_for.processor", "must be a printable"),
])
def test_a_wait_function_that_names_no_follower_is_refused_before_anything_is_stored(elsewhere, stage, wait_for,
                                                                                      field, words):
    _three_kinds({})
    with pytest.raises(CommandValidationError) as refused:
        place(request_id="refused-1", wait=stage, wait_for=wait_for)
    assert refused.value.binding_errors[0]["name"] == field and words in str(refused.value)
    assert get_runtime().gateway.status("order", "refused-1") is None  # nothing stored


def test_the_relay_keeps_one_bus_record_per_domain_event_through_a_replay(elsewhere):
    """The sample's bus relay (order_paid → order.purchased) handed every stream twice: one record each."""
    bus = get_bus()
    bus.set_topic_consumer("order.purchased", "member-service", enabled=True)
    paid = []
    for n in range(3):
        placed = place(request_id=f"relay-{n}")
        get_runtime().gateway.send(PayOrder(amount=Decimal("10.00"), payment_id=f"p-{n}"),
                                   aggregate_id=placed.aggregate_id)
        paid.append(placed.aggregate_id)
    query = EventQuery(topic="order.purchased")
    assert bus.store.find_events(query, skip=0, limit=10) == (0, [])  # nothing relayed yet
    run_until_caught_up(["order-purchased-relay"], budget_s=10)
    first = bus.store.find_events(query, skip=0, limit=10)[1]
    assert sorted(e["partitionKey"] for e in first) == sorted(paid)
    # Each is tied to its order (the console links the two): found by the aggregate's search keys.
    for order_id in paid:
        found = bus.store.find_events(EventQuery(keys=(f"aggregate=order/{order_id}",)), skip=0, limit=10)[1]
        assert [e["keys"] for e in found] == [{"aggregate": f"order/{order_id}", "aggregateId": order_id}]
        assert bus.store.find_events(EventQuery(keys=(f"aggregateId={order_id}",)), skip=0, limit=10)[0] == 1
    store = get_runtime().follower_store
    store.rewind("order-purchased-relay", 0, now=store.get("order-purchased-relay").updated_at)
    run_until_caught_up(["order-purchased-relay"], budget_s=10)
    total, again = bus.store.find_events(query, skip=0, limit=10)
    assert total == 3
    assert sorted(e["eventId"] for e in again) == sorted(e["eventId"] for e in first)


# --- the process's threads ------------------------------------------------------------------------


def test_follower_threads_follow_the_declarations_and_stop_with_the_runtime(memory):
    place()
    threads = get_runtime().follower_threads
    before = set(threads.names())

    @projection("order")
    def late(message):
        pass

    place()  # each command reconciles the threads with what is declared
    assert set(threads.names()) == before | {"projection-order-late"}
    running = {t.name for t in threading.enumerate()}
    assert "wow-follower-projection-order-late" in running
    get_runtime().close()
    assert threads.names() == []
    wait_for(lambda: not any(t.name.startswith("wow-follower-") and t.is_alive() for t in threading.enumerate()),
             timeout=10, what="the follower threads stopped")


def test_no_threads_where_followers_run_elsewhere(elsewhere):
    @projection("order")
    def record(message):
        pass

    place()
    assert get_runtime().follower_threads.names() == []
    assert not any(t.name == "wow-follower-projection-order-record" for t in threading.enumerate())


def test_followers_run_is_validated():
    from wow_django.conf import validate_user_settings

    assert [key for key, _ in validate_user_settings({"FOLLOWERS_RUN": "sometimes"})] == ["FOLLOWERS_RUN"]
    assert validate_user_settings({"FOLLOWERS_RUN": "celery"}) == []


# --- Celery -----------------------------------------------------------------------------------------


def test_beat_schedule_has_the_follow_task_only_where_celery_runs_the_followers(memory):
    from wow_django.tasks import beat_schedule

    assert set(beat_schedule()) == {"wow-bus-relay-pending", "wow-bus-resweep"}
    assert beat_schedule(resweep_every_s=60)["wow-bus-resweep"]["task"] == "wow_django.bus.resweep"
    with override_settings(WOW={**memory, "FOLLOWERS_RUN": "celery"}):
        schedule = beat_schedule(follow_every_s=3)
        assert schedule["wow-follow"]["task"] == "wow_django.follow"
        assert schedule["wow-follow"]["kwargs"] == {"budget_s": 3}
        assert schedule["wow-follow"]["options"] == {"expires": 3}


def test_the_follow_task_runs_the_followers_until_caught_up():
    from wow_django.tasks import follow

    with override_settings(WOW=fresh_wow("in_memory", FOLLOWERS_RUN="celery")):
        seen = []

        @projection("order")
        def record(message):
            seen.append(message.version)

        place()
        positions = follow.apply(kwargs={"names": ["projection-order-record"], "budget_s": 10}).get()
        assert seen == [1] and positions["projection-order-record"] >= 1
        with pytest.raises(ValueError, match="unknown follower"):
            follow.apply(kwargs={"names": ["nope"]}).get()


@pytest.mark.django_db(transaction=True)
def test_the_samples_read_model_projection_on_the_django_backend():
    from sample_project.orders.models import OrderSummary

    with override_settings(WOW=fresh_wow("django")):
        assert "order-summaries" in projection_followers("order", ["order_paid"])
        placed = place(wait=WaitStage.PROJECTED)
        assert placed.succeeded
        row = OrderSummary.objects.get(order_id=placed.aggregate_id)
        assert (row.status, row.total_amount, row.version) == ("PLACED", Decimal("10.00"), 1)
        paid = get_runtime().gateway.send(PayOrder(amount=Decimal("10.00"), payment_id="p"),
                                          aggregate_id=placed.aggregate_id, wait=WaitStage.PROJECTED)
        assert paid.succeeded
        row.refresh_from_db()
        assert (row.status, row.paid_amount, row.version) == ("PAID", Decimal("10.00"), 2)
        # Replayed from the start (a rewind): nothing changes, nothing is added.
        table = list(OrderSummary.objects.order_by("order_id").values_list("order_id", "status", "version"))
        assert (placed.aggregate_id, "PAID", 2) in table
        store = get_runtime().follower_store
        store.rewind("order-summaries", 0, now=store.get("order-summaries").updated_at)
        assert wait_caught_up(["order-summaries"], timeout=10)
        assert list(OrderSummary.objects.order_by("order_id").values_list("order_id", "status", "version")) == table

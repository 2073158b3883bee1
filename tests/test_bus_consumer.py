"""The consumer SDK on the in-process transport and each bus store: handling, inbox, retries, dead letters,
ordering, children in the trace, and the wow_consume command."""

from __future__ import annotations

import os
import signal
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from wow_django.backends.mongo.client import disconnect
from wow_django.bus import ConsumerWorker, consumer, get_bus, run_in_thread
from wow_django.bus.envelope import Envelope
from wow_django.bus.inbox import Inbox
from wow_django.bus.service import MAX_ERROR_LENGTH
from wow_django.log import describe_failure
from wow_django.testing.bus import ConsumerRecorder, delete_amqp_entities, unique_exchange, wait_for
from wow_django.testing.bus import RunningConsumers as Running
from wow_django.testing.bus import event_status as status

from .support import fresh_wow, in_thread

ALPHA, BETA = "t-alpha", "t-beta"
TOPIC = "shop.purchased"


@pytest.fixture
def recorder():
    """Consumers ALPHA and BETA on TOPIC, recording what they did (declarations end with the test)."""
    return ConsumerRecorder().declare(TOPIC, ALPHA, BETA)


def configure_consumers():
    bus = get_bus()
    for consumer_id in (ALPHA, BETA):
        bus.set_topic_consumer(TOPIC, consumer_id)
    return bus


@pytest.fixture
def bus_env(bus_store):
    settings = fresh_wow("mongo", SERVICE_NAME="shop", BUS_EXCHANGE=unique_exchange(), BUS_CONSUMER_BACKOFF_S=0.05,
                         BUS_STORE=bus_store)
    with override_settings(WOW=settings):
        configure_consumers()
        yield settings
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], (ALPHA, BETA, "t-gamma", "t-child"))
    disconnect(settings["MONGO_URI"])


def attempts(event_id, consumer_id):
    return [r for r in get_bus().store.consumption_rows([event_id]) if r["consumerId"] == consumer_id]


def test_both_consumers_handle_an_event_and_it_rolls_up_to_consumed(bus_env, recorder):
    with Running(ALPHA, BETA) as workers:
        get_bus().send(TOPIC, {"orderId": "o-1"}, event_id="evt-ok")
        wait_for(lambda: status("evt-ok") == "CONSUMED", what="CONSUMED")
    assert recorder.effects == {(ALPHA, "evt-ok"): 1, (BETA, "evt-ok"): 1}
    assert [(r["attemptNo"], r["success"], r["source"]) for r in attempts("evt-ok", ALPHA)] == [
        (0, None, "send"), (1, True, "sdk")]
    assert all(w.stats.handled == 1 for w in workers)
    assert Inbox(get_bus().store, ALPHA).state("evt-ok") == "done"


def test_retries_with_backoff_then_a_dead_letter_visible_as_failed(bus_env, recorder):
    recorder.fail = {ALPHA: -1, BETA: -1}
    with Running(ALPHA, BETA, max_attempts=3):
        get_bus().send(TOPIC, {}, event_id="evt-dead")
        wait_for(lambda: all(attempts("evt-dead", c)[-1].get("deadLettered") for c in (ALPHA, BETA)),
                 what="both dead-lettered")
        # the rollup runs once the burst that wrote the last row is over
        wait_for(lambda: status("evt-dead") == "FAILED", what="FAILED")
    rows = attempts("evt-dead", ALPHA)
    assert [(r["attemptNo"], r["success"], r["retrying"], r["deadLettered"]) for r in rows[1:]] == [
        (1, False, True, False), (2, False, True, False), (3, False, False, True)]
    # the exception's line, then its traceback down to the line that raised it
    head, _, trace = rows[-1]["error"].partition("\n\n")
    assert head == "RuntimeError: t-alpha is down"
    assert trace.startswith("Traceback (most recent call last):") and 'raise RuntimeError(f"{consumer_id} is down")' \
        in trace and trace.endswith("RuntimeError: t-alpha is down")
    event = get_bus().event_detail("evt-dead")["event"]
    assert event["lastError"] in {f"consumer {c}, attempt 3: RuntimeError: {c} is down" for c in (ALPHA, BETA)}
    gaps = [(b["consumedAt"] - a["consumedAt"]).total_seconds() for a, b in zip(rows[1:], rows[2:], strict=False)]
    assert gaps[0] >= 0.045 and gaps[1] >= 0.095  # 0.05 s, then doubled
    assert Inbox(get_bus().store, ALPHA).state("evt-dead") is None  # released: a re-push can claim it
    assert recorder.effects == {}


def test_a_transient_failure_is_retried_and_consumed(bus_env, recorder):
    recorder.fail = {BETA: 1}
    with Running(ALPHA, BETA):
        get_bus().send(TOPIC, {}, event_id="evt-flaky")
        wait_for(lambda: status("evt-flaky") == "CONSUMED", what="CONSUMED")
    assert [(r["attemptNo"], r["success"]) for r in attempts("evt-flaky", BETA)] == [(0, None), (1, False), (2, True)]
    assert recorder.effects[(BETA, "evt-flaky")] == 1


def test_one_failing_consumer_gives_partial_and_a_per_consumer_repush_completes_it(bus_env, recorder):
    recorder.fail = {BETA: 2}
    with Running(ALPHA, BETA, max_attempts=2):
        bus = get_bus()
        bus.send(TOPIC, {}, event_id="evt-partial")
        wait_for(lambda: status("evt-partial") == "PARTIAL", what="PARTIAL")
        bus.repush("evt-partial", requested_by="ops", consumer_id=BETA)
        wait_for(lambda: status("evt-partial") == "CONSUMED", what="CONSUMED")
    assert recorder.effects == {(ALPHA, "evt-partial"): 1, (BETA, "evt-partial"): 1}
    assert [c for c in recorder.calls if c[0] == ALPHA] == [(ALPHA, "evt-partial", 1)]  # not re-delivered to alpha
    event = bus.store.get_event("evt-partial")
    assert event["retryCount"] == 1


def test_the_same_message_delivered_twice_has_its_effect_once(bus_env, recorder):
    bus = get_bus()
    result = bus.send(TOPIC, {"n": 1}, event_id="evt-twice")
    message = bus.store.get_event("evt-twice")
    from wow_django.bus.envelope import Envelope

    wire = Envelope.from_document(message).to_json()
    bus.transport.publish(wire, topic=TOPIC, consumers=result.consumers)  # a duplicate delivery
    with Running(ALPHA, BETA) as workers:
        wait_for(lambda: sum(w.stats.received for w in workers) == 4, what="4 deliveries")
        wait_for(lambda: status("evt-twice") == "CONSUMED", what="CONSUMED")
    assert recorder.effects == {(ALPHA, "evt-twice"): 1, (BETA, "evt-twice"): 1}
    assert [w.stats.duplicates for w in workers] == [1, 1]
    assert len(attempts("evt-twice", ALPHA)) == 2  # the pending row and one success


def test_a_crash_after_the_handler_but_before_the_feedback_does_not_run_it_again(bus_env, recorder, monkeypatch):
    bus = get_bus()
    record = bus.record_feedback
    crashed = []

    def crash_once(event_id, consumer_id, success, *args, **kwargs):
        if consumer_id == ALPHA and success and not crashed:
            crashed.append(event_id)
            raise ConnectionError("store went away after the handler ran")
        return record(event_id, consumer_id, success, *args, **kwargs)

    monkeypatch.setattr(bus, "record_feedback", crash_once)
    with Running(ALPHA, BETA) as workers:
        bus.send(TOPIC, {}, event_id="evt-gap")
        wait_for(lambda: status("evt-gap") == "CONSUMED", what="CONSUMED")
    assert crashed == ["evt-gap"]
    assert recorder.effects[(ALPHA, "evt-gap")] == 1
    assert workers[0].stats.requeued == 1 and workers[0].stats.duplicates == 1
    [_, completed] = attempts("evt-gap", ALPHA)
    assert completed["success"] is True and "inbox" in completed["note"]


def test_a_crash_after_the_feedback_but_before_its_rollup_is_rolled_up_on_redelivery(bus_env, recorder, monkeypatch):
    """A consumer killed between writing its success and queueing the rollup: the message comes back
    (it was not acknowledged), and the duplicate delivery queues the rollup the crash lost."""
    bus = get_bus()
    bus.send(TOPIC, {}, event_id="evt-norollup")
    from wow_django.bus.envelope import Envelope

    event = Envelope.from_document(bus.store.get_event("evt-norollup"))
    with monkeypatch.context() as lost:
        lost.setattr(bus, "queue_rollup", lambda event_id: None)  # the process died before queueing it
        for consumer_id in (ALPHA, BETA):
            bus.record_feedback("evt-norollup", consumer_id, True)
    assert status("evt-norollup") == "SENT"
    worker = ConsumerWorker(ALPHA, bus=bus)
    assert worker.process(event, redelivered=True) == "ack"
    assert worker.stats.duplicates == 1 and recorder.calls == []
    assert status("evt-norollup") == "CONSUMED"


def test_a_block_of_feedback_queues_its_rollups_in_one_request(bus_env, monkeypatch):
    """batched_rollups(): this thread's rollup requests are queued together when the block ends (even by an
    exception); nested blocks join the outer one; other threads are not batched; ids the queue did not take
    are rolled up inline."""
    bus = get_bus()
    for n in range(3):
        bus.send(TOPIC, {}, event_id=f"evt-b{n}")
    requests = []

    def queue(event_ids):
        requests.append(list(event_ids))
        return [i for i in event_ids if i == "evt-b2"]  # the queue takes all but evt-b2

    monkeypatch.setattr(bus, "rollup_queue", queue)
    with bus.batched_rollups():
        for n in range(3):
            bus.record_feedback(f"evt-b{n}", ALPHA, True)
        with bus.batched_rollups():
            bus.record_feedback("evt-b0", BETA, True)
        other = threading.Thread(target=bus.record_feedback, args=("evt-b1", BETA, True))
        other.start()
        other.join()
        assert requests == [["evt-b1"]]  # the other thread's, at once
    assert requests == [["evt-b1"], ["evt-b0", "evt-b1", "evt-b2"]]  # each event once
    assert [status(f"evt-b{n}") for n in range(3)] == ["SENT", "SENT", "SENT"]  # b2 inline: beta still waits
    bus.record_feedback("evt-b2", BETA, True)
    assert status("evt-b2") == "CONSUMED"  # not taken by the queue: rolled up inline
    requests.clear()
    with pytest.raises(RuntimeError), bus.batched_rollups():
        bus.record_feedback("evt-b0", ALPHA, True)
        raise RuntimeError("the store went away")
    assert requests == [["evt-b0"]]  # the stored feedback's rollup is queued all the same


def test_messages_already_delivered_are_a_burst_acknowledged_after_its_rollups_are_queued(bus_env, recorder,
                                                                                           monkeypatch):
    """Events waiting in the queue are handled as one burst (up to the prefetch count): one request queues
    their rollups, and the messages are acknowledged after it."""
    bus = get_bus()
    for n in range(6):
        bus.send(TOPIC, {}, event_id=f"evt-burst{n}")
    worker = ConsumerWorker(ALPHA, bus=bus, prefetch=4)
    real = bus.queue_rollups
    requests = []

    def queue_rollups(event_ids):
        ids = list(event_ids)
        if ids:
            requests.append((ids, len(worker._handled)))  # handled, not yet acknowledged
        return real(ids)

    monkeypatch.setattr(bus, "queue_rollups", queue_rollups)
    in_thread(worker.run, max_messages=6, idle_timeout=2)
    assert [(len(ids), unacknowledged) for ids, unacknowledged in requests] == [(4, 4), (2, 2)]
    assert sorted(i for ids, _ in requests for i in ids) == [f"evt-burst{n}" for n in range(6)]
    assert worker.stats.handled == 6 and worker._handled == []
    with Running(BETA):
        wait_for(lambda: all(status(f"evt-burst{n}") == "CONSUMED" for n in range(6)), what="CONSUMED")
    assert in_thread(ConsumerWorker(ALPHA, bus=bus).run, idle_timeout=0.3).received == 0  # all acknowledged


def test_database_connections_are_checked_before_a_burst_and_after_each_message(bus_env, recorder, monkeypatch):
    """As Django does around a request: a connection that broke or outlived CONN_MAX_AGE is closed before
    the first message after a wait and after every message (the end of one is the start of the next)."""
    import importlib

    consumer_module = importlib.import_module("wow_django.bus.consumer")  # the package's name is a function
    bus = get_bus()
    for n in range(6):
        bus.send(TOPIC, {}, event_id=f"evt-conn{n}")
    worker = ConsumerWorker(ALPHA, bus=bus, prefetch=4)
    steps: list[str] = []
    real_process = worker.process
    monkeypatch.setattr(consumer_module, "release_database_connections", lambda: steps.append("check"))

    def process(event, **kwargs):
        steps.append("message")
        return real_process(event, **kwargs)

    monkeypatch.setattr(worker, "process", process)
    in_thread(worker.run, max_messages=6, idle_timeout=2)
    burst = lambda size: ["check"] + ["message", "check"] * size  # noqa: E731
    assert steps == burst(4) + burst(2)


def test_a_consumer_that_is_not_expected_skips_the_event(bus_env, recorder):
    bus = get_bus()
    bus.set_topic_consumer(TOPIC, BETA, enabled=False)
    with Running(ALPHA, BETA) as workers:
        # Beta's worker bound its queue to the topic, so the event reaches it anyway.
        bus.send(TOPIC, {}, event_id="evt-alpha-only")
        wait_for(lambda: status("evt-alpha-only") == "CONSUMED", what="CONSUMED")
        wait_for(lambda: workers[1].stats.skipped == 1, what="beta skipped")
    assert recorder.effects == {(ALPHA, "evt-alpha-only"): 1}
    assert attempts("evt-alpha-only", BETA) == []


def test_stale_sequences_are_dropped(bus_env):
    seen = []
    consumer("t-gamma", topics=["stock.changed"], drop_stale=True)(
        lambda event, ctx: seen.append(event.sequence))
    bus = get_bus()
    bus.set_topic_consumer("stock.changed", "t-gamma")
    for sequence in (1, 3, 2, 4):  # 2 arrives after 3: stale
        bus.send("stock.changed", {"qty": sequence}, event_id=f"evt-s{sequence}", partition_key="sku-1",
                 sequence=sequence)
    bus.send("stock.changed", {}, event_id="evt-other-sku", partition_key="sku-2", sequence=1)
    with Running("t-gamma") as [worker]:
        wait_for(lambda: worker.stats.received == 5, what="5 deliveries")
        wait_for(lambda: all(status(f"evt-s{n}") == "CONSUMED" for n in (1, 2, 3, 4)), what="CONSUMED")
    assert seen == [1, 3, 4, 1] and worker.stats.stale == 1
    [_, dropped] = attempts("evt-s2", "t-gamma")
    assert dropped["success"] is True and dropped["note"].startswith("stale: sequence 2")


def test_children_carry_the_trace_and_the_parent(bus_env):
    def parent_handler(event, ctx):
        ctx.send("shop.points", {"points": 5}, operation="addPoints")
        get_bus().send("shop.points", {"points": 1}, event_id=f"{event.event_id}-plain")  # context fills it

    consumer("t-child", topics=[TOPIC])(parent_handler)
    bus = get_bus()
    bus.set_topic_consumer(TOPIC, ALPHA, enabled=False)
    bus.set_topic_consumer(TOPIC, BETA, enabled=False)
    bus.set_topic_consumer(TOPIC, "t-child")
    bus.set_topic_consumer("shop.points", "t-other")
    with Running("t-child"):
        bus.send(TOPIC, {}, event_id="evt-parent", trace_id="trace-kids",
                 initiator={"userId": "user-A", "clientRequestId": "req-1"})
        wait_for(lambda: status("evt-parent") == "CONSUMED", what="CONSUMED")
    children = bus.trace("trace-kids")["tree"][0]["children"]
    assert len(children) == 2
    for child in children:
        assert child["traceId"] == "trace-kids" and child["parentEventId"] == "evt-parent"
        assert child["initiator"]["service"] == "t-child" and child["initiator"]["userId"] == "user-A"
        assert child["initiator"]["clientRequestId"] == "req-1"
    derived = next(c for c in children if c["initiator"]["operation"] == "addPoints")
    from wow_django.bus.consumer import ConsumerContext
    from wow_django.bus.envelope import Envelope

    parent = Envelope.from_document(bus.store.get_event("evt-parent"))
    ctx = ConsumerContext(bus, "t-child", parent, attempt=1, redelivered=False, operation="x")
    assert derived["eventId"] == ctx.child_event_id("shop.points", 1)  # the same on every redelivery
    assert ctx.idempotency_key == "t-child:evt-parent"


def test_an_invalid_message_is_rejected(bus_env, recorder):
    bus = get_bus()
    with Running(ALPHA) as [worker]:
        bus.transport.publish({"topic": TOPIC, "payload": {}}, topic=TOPIC, consumers=[ALPHA])
        bus.transport.publish({"eventId": "evt-bad", "topic": "not a topic"}, topic=TOPIC, consumers=[ALPHA])
        wait_for(lambda: worker.stats.invalid == 2, what="2 rejected")
    assert recorder.calls == []


def test_a_message_that_is_not_a_json_envelope_is_rejected_and_the_consumer_goes_on(bus_env, recorder):
    """A body that is not JSON, or of another content type, is an invalid message (rejected, counted), not an
    error that ends the consumer's loop; the next event is handled."""
    from kombu import Producer

    bus = configure_consumers()
    garbage = [  # (body, content type, content encoding, headers)
        (b"{not json", "application/json", "utf-8", {}),  # what the bus publishes, read by the consumer itself
        (b"\xff\xfe{}", "application/json", "utf-8", {}),  # not UTF-8
        ('{"eventId": "evt-utf16"}'.encode("utf-16"), "application/json", "utf-8", {}),  # UTF-16, not UTF-8
        (b"{not json", "application/json", "binary", {}),  # kombu's decoder
        ("hello", "text/plain", "utf-8", {}),
        (b"[]", "application/x-python-serialize", "binary", {}),  # a content type not accepted
        (b"not gzip", "application/json", "utf-8", {"compression": "application/x-gzip"}),  # kombu cannot build it
    ]
    with Running(ALPHA) as [worker]:
        with bus.transport.new_connection() as connection:
            producer = Producer(connection.channel())
            for body, content_type, encoding, headers in garbage:
                producer.publish(body, exchange=bus.transport.exchange, routing_key=TOPIC, content_type=content_type,
                                 content_encoding=encoding, headers=headers)
        wait_for(lambda: worker.stats.invalid == len(garbage), what="every message rejected")
        bus.send(TOPIC, {"n": 1}, event_id="evt-after-garbage")
        wait_for(lambda: (ALPHA, "evt-after-garbage", 1) in recorder.calls, what="the next event handled")
    assert worker.stats.received == len(garbage) + 1 and worker.stats.handled == 1 and worker.stats.errors == []


def test_a_field_of_a_newer_envelope_is_ignored_not_a_reason_to_drop_the_event(bus_env, recorder):
    bus = configure_consumers()
    with Running(ALPHA) as [worker]:
        bus.send(TOPIC, {"n": 1}, event_id="evt-newer")
        sent = bus.store.get_event("evt-newer")
        wire = {**Envelope.from_document(sent).to_json(), "aFieldOfTomorrow": {"x": 1}}
        bus.transport.publish(wire, topic=TOPIC, consumers=[ALPHA])  # as a newer producer sends it
        wait_for(lambda: (ALPHA, "evt-newer", 1) in recorder.calls, what="handled")
    assert worker.stats.invalid == 0


def test_an_unknown_consumer_id_is_a_clear_error(bus_env):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="no consumer 'nobody' is declared"):
        ConsumerWorker("nobody", bus=get_bus())
    with pytest.raises(CommandError, match="no consumer 'nobody'"):
        call_command("wow_consume", "nobody")
    with pytest.raises(CommandError, match="--idle-timeout must be greater than 0"):
        call_command("wow_consume", ALPHA, "--idle-timeout", "0")


@pytest.mark.django_db  # the command closes stale database connections around each message
def test_wow_consume_stops_gracefully_on_sigterm(bus_env, recorder):
    assert threading.current_thread() is threading.main_thread()
    bus = get_bus()
    bus.send(TOPIC, {}, event_id="evt-cmd")
    previous = signal.getsignal(signal.SIGTERM)

    def terminate_when_handled():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not recorder.effects:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_when_handled, daemon=True)
    killer.start()
    out = StringIO()
    call_command("wow_consume", ALPHA, "--idle-timeout", "30", stdout=out)
    killer.join(5)
    text = out.getvalue()
    assert f"Consuming {bus_env['BUS_EXCHANGE']}.{ALPHA} for {ALPHA} (topics: {TOPIC})" in text
    assert "SIGTERM: finishing the current message, then stopping." in text
    assert "Stopped t-alpha: 1 received, 1 handled" in text
    assert recorder.effects == {(ALPHA, "evt-cmd"): 1}
    assert [r["success"] for r in attempts("evt-cmd", ALPHA)] == [None, True]
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.django_db  # the command closes stale database connections around each message
def test_wow_consume_stops_after_max_messages(bus_env, recorder):
    bus = get_bus()
    for n in range(3):
        bus.send(TOPIC, {}, event_id=f"evt-m{n}")
    out = StringIO()
    call_command("wow_consume", BETA, "--max-messages", "2", "--idle-timeout", "20", stdout=out)
    assert "Stopped t-beta: 2 received, 2 handled" in out.getvalue()
    assert sorted(e for (c, e) in recorder.effects if c == BETA) == ["evt-m0", "evt-m1"]


def test_an_event_held_by_another_worker_is_requeued_and_one_without_a_handler_is_dead_lettered(bus_env, recorder):
    bus = get_bus()
    bus.send(TOPIC, {}, event_id="evt-held")
    from wow_django.bus.envelope import Envelope

    event = Envelope.from_document(bus.store.get_event("evt-held"))
    other = Inbox(bus.store, ALPHA).claim("evt-held")  # another worker of alpha is on it
    worker = ConsumerWorker(ALPHA, bus=get_bus())
    assert worker.process(event) == "requeue" and recorder.calls == []
    Inbox(bus.store, ALPHA).done("evt-held", other.token)
    assert worker.process(event) == "ack" and recorder.calls == []  # done by the other worker
    assert [r["success"] for r in attempts("evt-held", ALPHA)] == [None, True]

    bus.set_topic_consumer("shop.refunded", ALPHA)  # configured, but alpha has no handler for it
    bus.send("shop.refunded", {}, event_id="evt-nohandler")
    refund = Envelope.from_document(bus.store.get_event("evt-nohandler"))
    assert worker.process(refund) == "ack"
    [_, row] = attempts("evt-nohandler", ALPHA)
    assert row["deadLettered"] and "no handler for topic 'shop.refunded'" in row["error"]
    assert status("evt-nohandler") == "FAILED"


def test_the_relay_and_repush_celery_tasks(bus_env, recorder, monkeypatch):
    from wow_django.exceptions import RepushRefused, TransportUnavailable
    from wow_django.tasks import relay_pending, repush_event

    def down(*args, **kwargs):
        raise TransportUnavailable("down (test)")

    # Settings first: changing them discards the process's bus (and an in-memory store with its records).
    with override_settings(WOW={**bus_env, "BUS_RELAY_AFTER_S": 0.001}):
        bus = configure_consumers()
        publish = bus.transport.publish
        monkeypatch.setattr(bus.transport, "publish", down)
        bus.send(TOPIC, {}, event_id="evt-task")
        monkeypatch.setattr(bus.transport, "publish", publish)
        assert bus.store.get_event("evt-task")["status"] == "PENDING"
        time.sleep(0.01)
        # .run(): the task's body, without Celery caching a broker pool or result backend on the app
        assert relay_pending.run() == {"published": ["evt-task"], "failed": []}
        bus = get_bus()
        bus.record_feedback("evt-task", ALPHA, False, "x", dead_lettered=True)
        result = repush_event.run("evt-task", "scheduler", ALPHA)
        assert (result["retryCount"], result["requestedBy"], result["consumerId"]) == (1, "scheduler", ALPHA)
        with pytest.raises(RepushRefused):
            repush_event.run("evt-task", "scheduler", "t-gamma")  # not a consumer of it


def test_the_middleware_fills_the_bus_context_from_the_request(rf, django_user_model):
    from wow_django.bus.context import current_context
    from wow_django.http.bus_middleware import BusContextMiddleware

    seen = []
    middleware = BusContextMiddleware(lambda request: seen.append(current_context()) or "response")
    request = rf.get("/", HTTP_X_REQUEST_ID="req-7")
    request.user = django_user_model(username="alice")
    assert middleware(request) == "response"
    anonymous = rf.get("/", HTTP_X_REQUEST_ID="x" * 500)
    from django.contrib.auth.models import AnonymousUser

    anonymous.user = AnonymousUser()
    middleware(anonymous)
    assert (seen[0].user_id, seen[0].client_request_id) == ("alice", "req-7")
    assert (seen[1].user_id, seen[1].client_request_id) == (None, None)
    assert current_context().user_id is None


def test_a_requeued_message_goes_back_to_its_own_queue_only(bus_env, recorder, monkeypatch):
    bus = get_bus()
    bus.send(TOPIC, {"orderId": "o-9", "lines": [1, 2]}, event_id="evt-requeue")
    from wow_django.bus.envelope import Envelope

    wire = Envelope.from_document(bus.store.get_event("evt-requeue")).to_json()
    alpha = ConsumerWorker(ALPHA, bus=get_bus())
    verdicts = iter(["requeue"])
    delivered = []  # what alpha received, as it would put it on the wire
    process = alpha.process

    def process_once_requeued(event, **kw):
        delivered.append(event.to_json())
        return next(verdicts, None) or process(event, **kw)

    monkeypatch.setattr(alpha, "process", process_once_requeued)
    with Running(BETA) as [beta]:
        thread = run_in_thread(alpha)
        wait_for(lambda: alpha.stats.handled == 1 and beta.stats.handled == 1, what="both handled")
        alpha.stop()
        thread.join(10)
    assert alpha.stats.requeued == 1 and alpha.stats.received == 2
    assert beta.stats.received == 1  # the requeued copy did not reach beta
    assert recorder.effects == {(ALPHA, "evt-requeue"): 1, (BETA, "evt-requeue"): 1}
    assert delivered == [wire, wire]  # the requeued copy is the message as sent, unchanged


def test_a_dead_lettered_ordered_message_gives_its_sequence_back_so_a_repush_applies(bus_env):
    seen, failing = [], {"evt-q2"}
    consumer("t-delta", topics=["stock.counted"], drop_stale=True)(
        lambda event, ctx: (_ for _ in ()).throw(RuntimeError("count failed")) if event.event_id in failing
        else seen.append(event.sequence))
    bus = get_bus()
    bus.set_topic_consumer("stock.counted", "t-delta")
    bus.send("stock.counted", {}, event_id="evt-q1", partition_key="sku-9", sequence=1)
    bus.send("stock.counted", {}, event_id="evt-q2", partition_key="sku-9", sequence=2)
    with Running("t-delta") as [worker]:
        wait_for(lambda: status("evt-q2") == "FAILED", what="sequence 2 dead-lettered")
        assert bus.store.last_sequence("t-delta", "sku-9") == 1  # 2 was not applied: given back
        failing.clear()
        bus.repush("evt-q2", requested_by="ops", consumer_id="t-delta")
        wait_for(lambda: status("evt-q2") == "CONSUMED", what="the re-push applied")
    assert seen == [1, 2] and worker.stats.stale == 0
    assert bus.store.last_sequence("t-delta", "sku-9") == 2


def test_of_two_messages_of_one_partition_handled_at_once_the_older_is_dropped(bus_env):
    """Two workers hold sequences 5 and 4 at the same time: 4 must never be applied after 5."""
    started, release = threading.Event(), threading.Event()
    applied = []

    def handler(event, ctx):
        if event.sequence == 5:
            started.set()
            release.wait(10)  # 5 is being handled when 4 arrives at the other worker
        applied.append(event.sequence)

    consumer("t-eps", topics=["stock.moved"], drop_stale=True)(handler)
    try:
        bus = get_bus()
        bus.set_topic_consumer("stock.moved", "t-eps")
        with Running("t-eps", "t-eps") as workers:
            bus.send("stock.moved", {}, event_id="evt-m5", partition_key="sku-7", sequence=5)
            assert started.wait(10)
            bus.send("stock.moved", {}, event_id="evt-m4", partition_key="sku-7", sequence=4)
            wait_for(lambda: status("evt-m4") == "CONSUMED", what="4 settled")
            release.set()
            wait_for(lambda: status("evt-m5") == "CONSUMED", what="5 settled")
        assert applied == [5] and sum(w.stats.stale for w in workers) == 1
    finally:
        release.set()


def _nested(depth: int, message: str):
    if depth == 0:
        raise ValueError(message)
    _nested(depth - 1, message)


def _caught(call) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_failure_keeps_its_message_and_the_innermost_frames_within_the_limit():
    short = describe_failure(_caught(lambda: _nested(2, "bad sku")))
    head, _, trace = short.partition("\n\n")
    assert head == "ValueError: bad sku" and trace.startswith("Traceback (most recent call last):")
    assert "left out" not in trace and trace.count("in _nested") == 3

    deep = describe_failure(_caught(lambda: _nested(200, "deep")), limit=400)
    head, _, trace = deep.partition("\n\n")
    assert len(deep) <= 400 and head == "ValueError: deep"
    assert trace.startswith("Traceback (most recent call last): [") and "earlier lines left out]" in trace.splitlines()[0]
    assert trace.endswith('raise ValueError(message)\nValueError: deep')  # where it broke is kept

    long = describe_failure(_caught(lambda: _nested(0, "x" * 5000)))
    assert len(long) <= MAX_ERROR_LENGTH and long.startswith("ValueError: " + "x" * 900)
    assert long.partition("\n")[0].endswith("…")

    def chained():
        try:
            {}["sku"]
        except KeyError as exc:
            raise RuntimeError("cannot price") from exc

    text = describe_failure(_caught(chained))
    assert text.startswith("RuntimeError: cannot price\n\n") and "KeyError: 'sku'" in text  # the cause is kept
    assert describe_failure(_caught(lambda: _nested(0, ""))).startswith("ValueError\n\n")
    assert describe_failure(_caught(lambda: _nested(0, "tiny")), limit=30) == "ValueError: tiny"  # no room left
    for limit in range(60, 2000, 7):  # never past its limit, whatever the room left for the note
        assert len(describe_failure(_caught(lambda: _nested(30, "x" * 50)), limit=limit)) <= limit
    several = describe_failure(_caught(lambda: _nested(0, "first\n\nsecond")))
    assert several.startswith("ValueError: first  second\n\nTraceback")  # one first line, one blank line
    huge = describe_failure(_caught(lambda: _nested(3, "z" * 4000)))
    assert huge.count("in _nested") == 4  # a long message does not crowd the frames out

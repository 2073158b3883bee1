"""Faults and bad input with a real RabbitMQ (and a real Celery worker on Redis for the rollup).

Each test uses its own exchange and queues (deleted afterwards) and its own
bus store (embedded Mongo, or in memory). The broker outage is a TCP proxy in front of RabbitMQ that the
test takes down and brings back. ``.ci/run`` starts RabbitMQ and Redis;
``WOW_TEST_AMQP_URL`` and ``WOW_TEST_REDIS_URL`` override their addresses.
"""

from __future__ import annotations

import threading

import kombu.pools
import pytest
from amqp.exceptions import PreconditionFailed
from django.contrib.auth import get_user_model
from django.test import override_settings
from kombu import Connection, Exchange, Queue
from kombu.message import Message
from rest_framework.test import APIClient

from wow_django.backends.mongo.client import disconnect
from wow_django.bus import get_bus
from wow_django.bus.envelope import Envelope
from wow_django.bus.transport import BusTransport, queue_name
from wow_django.persistence.bus import EventQuery
from wow_django.testing.bus import (
    ConsumerRecorder,
    amqp_url,
    delete_amqp_entities,
    proxied_broker,
    queue_depth,
    take_messages,
    unique_exchange,
    wait_for,
)
from wow_django.testing.bus import RunningConsumers as Running
from wow_django.testing.bus import (
    event_status as status,
)

from .support import fresh_wow
from .workers import redis_url

pytestmark = pytest.mark.integration

ALPHA, BETA = "it-alpha", "it-beta"
TOPIC = "shop.purchased"
REDIS_URL = redis_url()
TOKENS = {ALPHA: "alpha-token-0123456789abcdef", BETA: "beta-token-0123456789abcdef"}


@pytest.fixture
def recorder():
    """Consumers ALPHA and BETA on TOPIC, recording what they did (declarations end with the test)."""
    return ConsumerRecorder().declare(TOPIC, ALPHA, BETA)


def rabbit_settings(url: str | None = None, **extra) -> dict:
    return fresh_wow("mongo", SERVICE_NAME="shop", BUS_EXCHANGE=unique_exchange("wow.it"),
                     BUS_TRANSPORT_URL=url or amqp_url(), BUS_CONSUMER_BACKOFF_S=0.05, BUS_PUBLISH_TIMEOUT_S=2.0,
                     BUS_CALLBACK_TOKENS=TOKENS, BUS_ROLLUP_QUEUE=unique_exchange("wow.it.rollup"), **extra)


@pytest.fixture
def rabbit(bus_store):
    settings = rabbit_settings(BUS_STORE=bus_store)
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        yield settings
    delete_amqp_entities(amqp_url(), settings["BUS_EXCHANGE"], (ALPHA, BETA))
    disconnect(settings["MONGO_URI"])


def test_durable_topic_exchange_durable_queues_persistent_confirmed_messages(rabbit):
    bus = get_bus()
    bus.send(TOPIC, {"orderId": "o-1"}, event_id="evt-durable")
    exchange = rabbit["BUS_EXCHANGE"]
    with Connection(amqp_url()) as connection:
        # Declaring with other properties fails when the existing entity is durable / a topic exchange.
        with pytest.raises(PreconditionFailed, match="inequivalent arg 'durable'"):
            Queue(queue_name(exchange, ALPHA), durable=False)(connection.channel()).declare()
        with pytest.raises(PreconditionFailed, match="inequivalent arg 'type'"):
            Exchange(exchange, type="direct", durable=True)(connection.channel()).declare()
    [publisher] = list(bus.transport._idle.queue)
    assert publisher.connection.transport_options["confirm_publish"] is True
    assert publisher.channel._confirm_selected  # the broker acknowledged the publish
    for consumer_id in (ALPHA, BETA):
        [message] = take_messages(amqp_url(), exchange, consumer_id)
        assert message.properties["delivery_mode"] == 2 and message.properties["message_id"] == "evt-durable"
        assert message.delivery_info["routing_key"] == TOPIC
        assert message.payload["eventId"] == "evt-durable"


@pytest.fixture
def proxied(bus_store):
    """``(proxy, settings)``: the bus talks to RabbitMQ through a TCP proxy the test can take down."""
    with proxied_broker(amqp_url()) as proxy:
        settings = rabbit_settings(proxy.url(), BUS_STORE=bus_store)
        try:
            yield proxy, settings
        finally:
            delete_amqp_entities(amqp_url(), settings["BUS_EXCHANGE"], (ALPHA, BETA))
            disconnect(settings["MONGO_URI"])


def test_broker_unreachable_during_send_leaves_pending_then_the_relay_delivers(recorder, proxied):
    proxy, settings = proxied
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        with Running(ALPHA, BETA) as workers:
            proxy.stop()  # the broker goes away
            result = bus.send(TOPIC, {"orderId": "o-down"}, event_id="evt-outage")
            assert result.stored and result.status == "PENDING" and "cannot connect" in result.error
            event = bus.store.get_event("evt-outage")
            assert event["status"] == "PENDING" and "cannot connect" in event["lastError"]
            assert bus.relay_pending(older_than_s=0).failed == ("evt-outage",)
            assert recorder.deliveries == {}
            proxy.start()  # back
            wait_for(lambda: bus.relay_pending(older_than_s=0).published == ("evt-outage",), timeout=20,
                     interval=0.2, what="relay published")
            wait_for(lambda: status("evt-outage") == "CONSUMED", timeout=30, what="CONSUMED")
        assert all(w.stats.errors for w in workers)  # they lost the broker and reconnected
        assert recorder.effects == {(ALPHA, "evt-outage"): 1, (BETA, "evt-outage"): 1}
        assert bus.store.get_event("evt-outage")["lastError"] is None


def test_a_send_to_a_broker_that_hangs_returns_pending_within_the_publish_timeout(recorder, proxied):
    """A broker that keeps the connection but answers nothing (no confirm): the send gives up (each wait on the
    broker bounded by BUS_PUBLISH_TIMEOUT_S, 2 s here; the failed connection dropped without a closing
    handshake, no second try on a fresh one) with the event stored PENDING, and the relay publishes it later."""
    proxy, settings = proxied
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        assert bus.send(TOPIC, {}, event_id="evt-before-hang").status == "SENT"  # a pooled publisher, connected
        proxy.hold()
        results: list = []
        sender = threading.Thread(target=lambda: results.append(bus.send(TOPIC, {}, event_id="evt-hung")))
        sender.start()
        sender.join(60)  # far past the 2 s bound: a send without one would still be waiting
        proxy.release()
        assert not sender.is_alive(), "the send did not give up on a broker that hangs"
        [result] = results
        assert result.stored and result.status == "PENDING" and result.error
        assert bus.store.get_event("evt-hung")["status"] == "PENDING"
        # Published by the relay before any consumer runs: what the proxy held and let through on release
        # (the publish that got no confirm) cannot be consumed first and make the relay's work moot.
        wait_for(lambda: "evt-hung" in bus.relay_pending(older_than_s=0).published, timeout=20, interval=0.2,
                 what="relay published")
        with Running(ALPHA, BETA):
            wait_for(lambda: status("evt-hung") == "CONSUMED", timeout=30, what="CONSUMED")


class SimulatedCrash(BaseException):
    """Stands for the process dying: nothing in the bus catches it."""


def test_a_crash_after_publish_before_sent_is_delivered_with_its_effect_once(rabbit, recorder, monkeypatch):
    bus = get_bus()
    mark_sent = bus.store.mark_sent

    def die(*args, **kwargs):
        raise SimulatedCrash()

    monkeypatch.setattr(bus.store, "mark_sent", die)
    with pytest.raises(SimulatedCrash):
        bus.send(TOPIC, {"orderId": "o-crash"}, event_id="evt-crash")
    assert status("evt-crash") == "PENDING"
    assert queue_depth(amqp_url(), rabbit["BUS_EXCHANGE"], ALPHA) == 1  # published before the crash
    monkeypatch.setattr(bus.store, "mark_sent", mark_sent)  # the restarted process
    assert bus.relay_pending(older_than_s=0).published == ("evt-crash",)
    assert status("evt-crash") == "SENT"
    assert queue_depth(amqp_url(), rabbit["BUS_EXCHANGE"], ALPHA) == 2  # delivered twice
    with Running(ALPHA, BETA) as workers:
        wait_for(lambda: sum(w.stats.received for w in workers) == 4, what="4 deliveries")
        wait_for(lambda: status("evt-crash") == "CONSUMED", what="CONSUMED")
    assert recorder.effects == {(ALPHA, "evt-crash"): 1, (BETA, "evt-crash"): 1}
    assert [w.stats.duplicates for w in workers] == [1, 1]


def test_the_same_message_delivered_twice_has_its_effect_once(rabbit, recorder):
    bus = get_bus()
    result = bus.send(TOPIC, {"n": 1}, event_id="evt-twice")
    wire = Envelope.from_document(bus.store.get_event("evt-twice")).to_json()
    bus.transport.publish(wire, topic=TOPIC, consumers=result.consumers)
    with Running(ALPHA, BETA) as workers:
        wait_for(lambda: sum(w.stats.received for w in workers) == 4, what="4 deliveries")
        wait_for(lambda: status("evt-twice") == "CONSUMED", what="CONSUMED")
    assert recorder.deliveries == {(ALPHA, "evt-twice"): 1, (BETA, "evt-twice"): 1}  # duplicates not handled
    assert recorder.effects == {(ALPHA, "evt-twice"): 1, (BETA, "evt-twice"): 1}


def test_one_consumer_failing_gives_partial_and_a_per_consumer_repush_gives_consumed(rabbit, recorder):
    recorder.failing = {BETA}
    bus = get_bus()
    with Running(ALPHA, BETA, max_attempts=2) as workers:
        bus.send(TOPIC, {"orderId": "o-p"}, event_id="evt-partial")
        wait_for(lambda: status("evt-partial") == "PARTIAL", what="PARTIAL")
        rows = [r for r in bus.store.consumption_rows(["evt-partial"]) if r["consumerId"] == BETA]
        assert rows[-1]["deadLettered"] and rows[-1]["error"].startswith(f"RuntimeError: {BETA} cannot handle it\n\nTraceback")
        recorder.failing = set()
        result = bus.repush("evt-partial", requested_by="ops", consumer_id=BETA)
        assert result.status == "RETRYING" and result.retry_count == 1
        wait_for(lambda: status("evt-partial") == "CONSUMED", what="CONSUMED")
    assert recorder.deliveries[(ALPHA, "evt-partial")] == 1  # the re-push went to beta's queue only
    assert recorder.deliveries[(BETA, "evt-partial")] == 3
    assert recorder.effects == {(ALPHA, "evt-partial"): 1, (BETA, "evt-partial"): 1}
    assert workers[0].stats.received == 1
    event = bus.store.get_event("evt-partial")
    assert event["retryCount"] == 1 and event["lastSentAt"] >= event["sentAt"]
    [audit] = bus.store.repush_history("evt-partial")
    assert (audit["requestedBy"], audit["consumerId"], audit["outcome"]) == ("ops", BETA, "published")


def test_bad_input_over_http_stores_and_publishes_nothing(rabbit, db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = APIClient()
    client.force_authenticate(user)
    response = client.post("/bus/events/", {"topic": "bad topic", "payload": {"x": 1}, "sequence": -3},
                           format="json")
    assert response.status_code == 400 and response.json()["errorCode"] == "BusValidation"
    assert {e["name"] for e in response.json()["bindingErrors"]} == {"topic", "sequence"}
    ok = client.post("/bus/events/", {"topic": TOPIC, "payload": {"x": 1}, "eventId": "evt-http"}, format="json")
    assert ok.status_code == 201
    anonymous = APIClient()
    for headers, code in (({}, "NotAuthenticated"), ({"HTTP_AUTHORIZATION": "Bearer wrong-token"}, "AuthenticationFailed"),
                          ({"HTTP_AUTHORIZATION": "Basic x"}, "NotAuthenticated")):
        response = anonymous.post("/bus/callback/", {"eventId": "evt-http", "success": True}, format="json", **headers)
        assert response.status_code == 401 and response.json()["errorCode"] == code
    bus = get_bus()
    total, events = bus.store.find_events(EventQuery(), skip=0, limit=10)
    assert (total, [e["eventId"] for e in events]) == (1, ["evt-http"])
    assert [r["attemptNo"] for r in bus.store.consumption_rows(["evt-http"])] == [0, 0]
    assert queue_depth(amqp_url(), rabbit["BUS_EXCHANGE"], ALPHA) == 1


@pytest.fixture
def rollup_worker(rabbit):
    """A Celery worker thread serving only this test's rollup queue (unique: Redis may be shared)."""
    from celery.contrib.testing.worker import start_worker

    from sample_project.celery import app

    def forget_connections():
        # The app caches its broker pools on first use; make the next use see the current broker_url.
        if app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
        # The producer pool comes from kombu's process-wide registry, keyed by the broker URL: drop the
        # closed one, or the next test on the same URL gets "Acquire on closed pool".
        kombu.pools.reset()

    saved = {key: app.conf[key] for key in ("broker_url", "result_backend", "task_always_eager")}
    forget_connections()
    app.conf.update(broker_url=REDIS_URL, result_backend=REDIS_URL, task_always_eager=False)
    try:
        # One serial worker on the rollup queue only, as in production.
        with start_worker(app, pool="threads", concurrency=1, queues=[rabbit["BUS_ROLLUP_QUEUE"]],
                          perform_ping_check=False, shutdown_timeout=10) as worker:
            yield worker
    finally:
        app.conf.update(saved)
        forget_connections()


def test_feedback_rolls_up_on_a_celery_worker_of_the_rollup_queue(rabbit, recorder, rollup_worker):
    from celery.signals import task_postrun

    runs = []

    def record(sender=None, task=None, **kwargs):
        if task.name == "wow_django.bus.rollup":
            runs.append((task.request.is_eager, (task.request.delivery_info or {}).get("routing_key"),
                         threading.current_thread().name))

    task_postrun.connect(record, weak=False)
    try:
        bus = get_bus()
        with Running(ALPHA, BETA):
            for n in range(3):
                bus.send(TOPIC, {"n": n}, event_id=f"evt-w{n}")
            wait_for(lambda: all(status(f"evt-w{n}") == "CONSUMED" for n in range(3)), what="CONSUMED")
        assert len(runs) >= 6 and all(not eager and key == rabbit["BUS_ROLLUP_QUEUE"] for eager, key, _ in runs)
        assert all(thread != threading.current_thread().name for *_, thread in runs)

        # Concurrent HTTP callbacks for one event: distinct attempt numbers, then one rollup result.
        bus.send(TOPIC, {}, event_id="evt-callbacks")
        errors = []

        def report(consumer_id, n):
            client = APIClient()
            response = client.post("/bus/callback/", {"eventId": "evt-callbacks", "success": n % 2 == 1,
                                                      "error": None if n % 2 else "try again"},
                                   format="json", HTTP_AUTHORIZATION=f"Bearer {TOKENS[consumer_id]}")
            if response.status_code != 201:
                errors.append(response.json())

        threads = [threading.Thread(target=report, args=(c, n)) for c in (ALPHA, BETA) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        rows = bus.store.consumption_rows(["evt-callbacks"])
        for consumer_id in (ALPHA, BETA):
            numbers = sorted(r["attemptNo"] for r in rows if r["consumerId"] == consumer_id)
            assert numbers == list(range(7))
        latest = {c: max((r for r in rows if r["consumerId"] == c), key=lambda r: r["attemptNo"]) for c in (ALPHA, BETA)}
        expected = "CONSUMED" if all(r["success"] for r in latest.values()) else (
            "PARTIAL" if any(r["success"] for r in latest.values()) else "FAILED")
        wait_for(lambda: status("evt-callbacks") == expected, what=expected)
        assert bus.rollup("evt-callbacks") == expected  # rerunning changes nothing
    finally:
        task_postrun.disconnect(record)


def test_the_first_send_after_a_broker_restart_is_published(recorder, proxied):
    """A pooled connection that died with the broker is replaced at once, not left to the relay."""
    proxy, settings = proxied
    with override_settings(WOW=settings):
        bus = get_bus()
        bus.set_topic_consumer(TOPIC, ALPHA)
        assert bus.send(TOPIC, {"n": 1}, event_id="evt-before").status == "SENT"
        proxy.stop()  # the broker restarts: the pooled connection dies
        proxy.start()
        result = bus.send(TOPIC, {"n": 2}, event_id="evt-after")
        assert result.status == "SENT", result.error
        ids = {m.payload["eventId"] for m in take_messages(amqp_url(), settings["BUS_EXCHANGE"], ALPHA)}
        assert ids == {"evt-before", "evt-after"}


@pytest.mark.parametrize("url", ["amqp", "redis://127.0.0.1:6379/13", "memory://"])
def test_delete_entities_removes_the_queues_and_exchange_it_declared_and_nothing_else(url):
    """What a project taken down leaves on the broker: each consumer's durable queue (with its messages) and
    the exchange; names it never declared are not reported, other exchanges' queues stay."""
    url = amqp_url() if url == "amqp" else url
    name, other = unique_exchange("wow.it.teardown"), unique_exchange("wow.it.keep")
    ours, theirs = BusTransport(url, name), BusTransport(url, other)
    try:
        ours.publish({"eventId": "e-1"}, topic=TOPIC, consumers=[ALPHA, BETA])
        theirs.publish({"eventId": "e-2"}, topic=TOPIC, consumers=[ALPHA])
        ours.publish({"eventId": "e-3"}, topic=TOPIC, consumers=["foreign"])  # a queue we are not told of
        # the exchange stays while another queue is bound to it (it would lose what is published for it)
        assert ours.delete_entities([ALPHA, BETA, "never-declared"]) == [f"{name}.{ALPHA}", f"{name}.{BETA}"]
        assert ours.delete_entities(["foreign"]) == [f"{name}.foreign", name]
        assert ours.delete_entities([ALPHA, BETA]) == []  # nothing left to delete
        if url.startswith("redis://"):
            import redis

            client = redis.Redis.from_url(url)
            assert [k for k in client.scan_iter("*") if name.encode() in k] == []  # no list, no binding left
            client.close()
        if not url.startswith("memory://"):  # (memory:// keeps its queues per connection's process state)
            with Connection(url) as connection:
                with connection.SimpleQueue(f"{other}.{ALPHA}", no_ack=False) as kept:
                    assert kept.get(timeout=5).payload["eventId"] == "e-2"
    finally:
        theirs.delete_entities([ALPHA])
        ours.close()
        theirs.close()


def test_a_burst_is_acknowledged_at_once_past_a_message_requeued_inside_it(rabbit, recorder, monkeypatch):
    """40 events wait in the queues, so each consumer takes them in bursts of its prefetch count; one message
    in the first burst is requeued (its store read fails once). Every message ends up acknowledged once: the
    queues are empty once the workers stop, and each event had its effect once."""
    bus = get_bus()
    ids = [f"evt-burst-{n:02d}" for n in range(40)]
    for event_id in ids:
        bus.send(TOPIC, {"n": event_id}, event_id=event_id)
    real = bus.store.latest_consumption
    failed: list[str] = []

    def fails_once(event_id, consumer_id):
        if event_id == ids[5] and consumer_id == ALPHA and not failed:
            failed.append(event_id)
            raise RuntimeError("store unavailable for a moment")
        return real(event_id, consumer_id)

    monkeypatch.setattr(bus.store, "latest_consumption", fails_once)
    acks: list[bool] = []
    real_ack = Message.ack

    def ack(message, multiple=False):
        acks.append(multiple)
        return real_ack(message, multiple=multiple)

    monkeypatch.setattr(Message, "ack", ack)
    with Running(ALPHA, BETA, prefetch=16) as workers:
        wait_for(lambda: all(status(event_id) == "CONSUMED" for event_id in ids), what="40 CONSUMED", timeout=60)
    assert failed == [ids[5]] and workers[0].stats.requeued == 1
    assert workers[0].stats.received == 41 and workers[1].stats.received == 40
    settings = rabbit
    assert [queue_depth(amqp_url(), settings["BUS_EXCHANGE"], c) for c in (ALPHA, BETA)] == [0, 0]
    assert recorder.effects == {(c, event_id): 1 for c in (ALPHA, BETA) for event_id in ids}
    assert True in acks and len(acks) < 80  # bursts acknowledged with one frame, not one per message

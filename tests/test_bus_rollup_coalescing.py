"""Coalesced bus rollups (``WOW['BUS_ROLLUP_COALESCE']``): feedback marks its event pending in a Redis set
and queues a drain task only when none is queued; the drain rolls up every pending event.

The cache is Django's RedisCache on the Redis at 127.0.0.1 (``WOW_TEST_REDIS_URL`` overrides), under a key
prefix of each test's own. The unit tests hold the queued drain tasks and run them here, as the serial
worker would; the last tests run them on a real Celery worker thread.
"""

from __future__ import annotations

import logging
import queue as queues
import random
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
import redis
from celery import Celery, current_app
from celery import _state as celery_state
from celery.contrib.testing.worker import start_worker
from celery.signals import task_postrun
from django.core.cache import cache
from django.test import override_settings

from wow_django import tasks
from wow_django.backends.mongo.client import disconnect
from wow_django.bus import ConsumerWorker, RelayReport, consumer, get_bus
from wow_django.bus import service as bus_service
from wow_django.bus.envelope import utcnow
from wow_django.exceptions import RecoverableStoreError
from wow_django.testing.bus import RunningConsumers, amqp_url, delete_amqp_entities, unique_exchange, wait_for
from wow_django.testing.bus import event_status as status

from .support import fresh_wow, in_thread
from .workers import redis_url

pytestmark = pytest.mark.integration

REDIS_URL = redis_url()
ALPHA, BETA = "co-alpha", "co-beta"
TOPIC = "shop.paid"


def redis_cache(prefix: str, location: str = REDIS_URL) -> dict:
    return {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": location,
                        "KEY_PREFIX": prefix}}


@pytest.fixture
def shared_cache():
    """CACHES['default'] on Redis, under a key prefix of this test's own (deleted afterwards)."""
    prefix = f"wow-test-{uuid.uuid4().hex[:10]}"
    with override_settings(CACHES=redis_cache(prefix)):
        yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def bus_settings(bus_store: str, **extra) -> dict:
    return fresh_wow("mongo", SERVICE_NAME="shop", BUS_STORE=bus_store, BUS_EXCHANGE=unique_exchange(),
                     BUS_ROLLUP_QUEUE=f"wow-test-rollup-{uuid.uuid4().hex[:10]}", **extra)


@pytest.fixture
def coalescing(shared_cache, bus_store, monkeypatch):
    """A bus whose rollups are coalesced, as with a real broker; the drain tasks it queues are held in
    ``queued`` (a per-feedback task fails the test)."""
    monkeypatch.setitem(tasks.rollup_event.app.conf, "task_always_eager", False)
    queued: list[tuple] = []
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda args, **options: queued.append((args, options)))
    monkeypatch.setattr(tasks.rollup_event, "apply_async",
                        lambda args, **options: pytest.fail(f"a per-feedback rollup task was queued: {args}"))
    settings = bus_settings(bus_store)
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        assert tasks.coalesced_rollups()
        yield SimpleNamespace(bus=bus, queued=queued, queue=settings["BUS_ROLLUP_QUEUE"],
                              pending=tasks.PendingRollups(settings["BUS_ROLLUP_QUEUE"]))
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], (ALPHA, BETA))
    disconnect(settings["MONGO_URI"])


def run_queued(env) -> int:
    """Run the held drain tasks one after the other, as the rollup queue's one worker does; how many ran."""
    runs = 0
    while env.queued:
        args, options = env.queued.pop(0)
        assert args == (env.queue,) and options == {"queue": env.queue}
        tasks.rollup_pending(*args)
        runs += 1
    return runs


def send_events(bus, count: int, prefix: str) -> list[str]:
    ids = [f"evt-{prefix}{n}" for n in range(count)]
    for event_id in ids:
        bus.send(TOPIC, {}, event_id=event_id)
    return ids


def give_feedback(bus, event_id: str, n: int) -> str:
    """ALPHA succeeds; BETA fails for good every third event. The status the event must end with."""
    bus.record_feedback(event_id, ALPHA, True)
    if n % 3 == 0:
        bus.record_feedback(event_id, BETA, False, "no stock", dead_lettered=True)
        return "PARTIAL"
    bus.record_feedback(event_id, BETA, True)
    return "CONSUMED"


# --- the coalescing ----------------------------------------------------------------------------------


def test_many_feedbacks_queue_one_drain_which_rolls_up_every_pending_event(coalescing):
    env = coalescing
    ids = send_events(env.bus, 30, "c")
    expected = {event_id: give_feedback(env.bus, event_id, n) for n, event_id in enumerate(ids)}
    assert env.queued == [((env.queue,), {"queue": env.queue})]  # 60 feedbacks, one task
    assert {status(i) for i in ids} == {"SENT"}  # the worker has not run yet
    assert tasks.rollup_pending(env.queue) == 30  # one rollup per event, not per feedback
    env.queued.clear()
    assert {i: status(i) for i in ids} == expected
    assert not env.pending.has_any() and cache.get(env.pending.marker) is None
    # The drain released the marker when it was done: the next feedback queues a new drain.
    env.bus.record_feedback(ids[0], BETA, True)
    assert len(env.queued) == 1 and status(ids[0]) == "PARTIAL"
    assert run_queued(env) == 1 and status(ids[0]) == "CONSUMED"


def test_the_snapshot_requests_and_the_rollups_share_one_queue_once_rule(coalescing, monkeypatch):
    """A marker set means the task is queued: nothing else is sent; a failed send clears the marker."""
    sent = []
    assert tasks.queue_once("wow:test-marker", 5, lambda: sent.append(1)) is True
    assert tasks.queue_once("wow:test-marker", 5, lambda: sent.append(2)) is False
    assert sent == [1]
    cache.delete("wow:test-marker")

    def broken():
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        tasks.queue_once("wow:test-marker", 5, broken)
    assert cache.get("wow:test-marker") is None


def test_a_feedback_made_while_the_drain_runs_is_rolled_up_by_it(coalescing, monkeypatch):
    """Feedback whose queue request found the marker set (and queued nothing) while the drain was rolling
    up, even after it had found the set empty, is rolled up by that same run."""
    env = coalescing
    monkeypatch.setattr(tasks, "ROLLUP_LINGER_S", 0)  # the drain lets go as soon as it found nothing
    first, during, after_empty = send_events(env.bus, 3, "w")
    env.bus.record_feedback(first, ALPHA, True)
    real_rollup_many, real_drain = env.bus.rollup_many, tasks.PendingRollups.drain

    mid_batch = []

    def rollup_many(ids):  # mid-batch: feedback for an event being rolled up and for another one
        if not mid_batch:
            mid_batch.append(ids)
            env.bus.record_feedback(first, BETA, True)
            env.bus.record_feedback(during, ALPHA, True)
            env.bus.record_feedback(during, BETA, True)
        return real_rollup_many(ids)

    drained = []

    def drain(self, *args, **kwargs):  # after the set was found empty, before the marker is released
        done = real_drain(self, *args, **kwargs)
        if not drained:
            drained.append(done)
            env.bus.record_feedback(after_empty, ALPHA, True)
            env.bus.record_feedback(after_empty, BETA, False, "down", dead_lettered=True)
        return done

    monkeypatch.setattr(env.bus, "rollup_many", rollup_many)
    monkeypatch.setattr(tasks.PendingRollups, "drain", drain)
    assert run_queued(env) == 1  # no feedback above queued a second task
    # [first], then the next pending set: first again (its feedback came mid-batch) and during.
    assert mid_batch == [[first]] and drained == [3]
    assert (status(first), status(during), status(after_empty)) == ("CONSUMED", "CONSUMED", "PARTIAL")
    assert not env.pending.has_any() and cache.get(env.pending.marker) is None


@pytest.mark.parametrize("window", ["drain found nothing, marker held", "marker released, not yet re-checked"])
def test_feedback_from_another_thread_in_the_drains_last_window_is_rolled_up(coalescing, monkeypatch, window):
    """The worker thread stops in the window between its drain finding nothing pending and the end of
    the task; a producer thread records feedback then. Either the same run rolls it up (the marker was
    still held: the producer queued nothing) or the producer queued the next drain (it was released)."""
    env = coalescing
    monkeypatch.setattr(tasks, "ROLLUP_LINGER_S", 0)  # the window right after the drain found nothing
    first, late = send_events(env.bus, 2, "l")
    env.bus.record_feedback(first, ALPHA, True)
    opened, recorded = threading.Event(), threading.Event()
    real_drain, real_has_any = tasks.PendingRollups.drain, tasks.PendingRollups.has_any
    paused = []

    def pause():
        if not paused:
            paused.append(cache.get(env.pending.marker))
            opened.set()
            assert recorded.wait(10)

    def drain(self, *args, **kwargs):
        done = real_drain(self, *args, **kwargs)
        if window.startswith("drain"):
            pause()
        return done

    def has_any(self):
        if window.startswith("marker"):
            pause()
        return real_has_any(self)

    monkeypatch.setattr(tasks.PendingRollups, "drain", drain)
    monkeypatch.setattr(tasks.PendingRollups, "has_any", has_any)

    def producer():
        assert opened.wait(10)
        env.bus.record_feedback(late, ALPHA, True)
        env.bus.record_feedback(late, BETA, True)
        recorded.set()

    thread = threading.Thread(target=producer)
    thread.start()
    args, _ = env.queued.pop(0)
    worker = threading.Thread(target=tasks.rollup_pending, args=args)
    worker.start()
    worker.join(20)
    thread.join(20)
    if window.startswith("drain"):
        assert paused == [1] and env.queued == []  # the producer found the marker held
        assert status(late) == "CONSUMED"  # rolled up by the same run
    else:
        assert paused == [None] and len(env.queued) == 1 and status(late) == "SENT"  # it queued a drain
        assert run_queued(env) == 1 and status(late) == "CONSUMED"
    assert not env.pending.has_any() and cache.get(env.pending.marker) is None


def test_a_drain_that_found_nothing_watches_a_while_for_more_before_it_lets_go(coalescing, monkeypatch):
    """Feedback a little after the drain emptied the set: the same run rolls it up (a steady stream keeps
    one task going); after ROLLUP_LINGER_S without any, the marker is released."""
    env = coalescing
    monkeypatch.setattr(tasks, "ROLLUP_LINGER_S", 0.5)
    first, later = send_events(env.bus, 2, "g")
    env.bus.record_feedback(first, ALPHA, True)
    real_drain = tasks.PendingRollups.drain
    drains = []

    def drain(self, *args, **kwargs):
        drains.append(real_drain(self, *args, **kwargs))
        if len(drains) == 1:  # 0.1 s after the set was found empty, from another thread
            threading.Timer(0.1, lambda: (env.bus.record_feedback(later, ALPHA, True),
                                          env.bus.record_feedback(later, BETA, True))).start()
        return drains[-1]

    monkeypatch.setattr(tasks.PendingRollups, "drain", drain)
    started = time.monotonic()
    assert run_queued(env) == 1  # the feedback found the marker held and queued nothing
    # The later event in that same run: once, or twice when the drain looked between its two feedbacks (in
    # one call of drain, which takes the set again when it finds it empty, or in two).
    assert drains[0] == 1 and drains[1:] in ([1], [1, 1], [2]) and status(later) == "CONSUMED"
    assert time.monotonic() - started >= 0.6  # it watched 0.5 s past the last feedback, then let go
    assert cache.get(env.pending.marker) is None


def test_concurrent_feedback_and_a_serial_worker_lose_no_rollup(coalescing, monkeypatch):
    """Four threads record feedback while a worker thread runs the queued drains one at a time (each
    batch, and the end of each drain, slowed down a little, so feedback lands mid-drain and just before
    the marker is released): every event ends with its status."""
    env = coalescing
    ids = send_events(env.bus, 120, "t")
    work: queues.Queue = queues.Queue()
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda args, **options: work.put(args))
    monkeypatch.setattr(tasks, "ROLLUP_BATCH", 7)
    monkeypatch.setattr(tasks, "ROLLUP_LINGER_S", 0)  # each drain lets go at once: many releases, many races
    real_rollup_many = env.bus.rollup_many
    jitter = random.Random(4)

    def slow_rollup_many(batch):
        threading.Event().wait(jitter.random() * 0.003)
        return real_rollup_many(batch)

    real_drain = tasks.PendingRollups.drain

    def slow_drain(self, *args, **kwargs):  # widen the window between the last empty read and the release
        done = real_drain(self, *args, **kwargs)
        threading.Event().wait(jitter.random() * 0.003)
        return done

    monkeypatch.setattr(env.bus, "rollup_many", slow_rollup_many)
    monkeypatch.setattr(tasks.PendingRollups, "drain", slow_drain)
    runs = []
    errors = []

    def worker():
        while (args := work.get()) is not None:
            try:
                runs.append(tasks.rollup_pending(*args))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    expected: dict[str, str] = {}

    def producer(part: int):
        for n, event_id in enumerate(ids):
            if n % 4 == part:
                expected[event_id] = give_feedback(env.bus, event_id, n)

    worker_thread = threading.Thread(target=worker)
    worker_thread.start()
    producers = [threading.Thread(target=producer, args=(p,)) for p in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    work.put(None)  # after every drain the producers queued
    worker_thread.join(60)
    assert errors == [] and not worker_thread.is_alive()
    assert {i: status(i) for i in ids} == expected
    assert not env.pending.has_any() and cache.get(env.pending.marker) is None
    assert 1 <= len(runs) < len(ids) * 2  # fewer tasks than feedbacks
    assert sum(runs) >= len(ids)


# --- failures -----------------------------------------------------------------------------------------


class Killed(BaseException):
    """The pool process killed mid-batch: nothing of the task's cleanup runs."""


def test_a_drain_killed_mid_batch_leaves_its_events_to_the_redelivered_task(coalescing, monkeypatch):
    env = coalescing
    ids = send_events(env.bus, 20, "k")
    for event_id in ids:
        env.bus.record_feedback(event_id, ALPHA, True)
        env.bus.record_feedback(event_id, BETA, True)
    monkeypatch.setattr(tasks, "ROLLUP_BATCH", 6)
    real_rollup_many = env.bus.rollup_many
    batches = []

    def dying(batch):
        batches.append(batch)
        if len(batches) == 2:
            real_rollup_many(batch[:2])
            raise Killed()
        return real_rollup_many(batch)

    monkeypatch.setattr(env.bus, "rollup_many", dying)
    args, _ = env.queued.pop(0)
    with pytest.raises(Killed):
        tasks.rollup_pending(*args)
    assert sum(status(i) == "CONSUMED" for i in ids) == 8  # the first batch and part of the second
    assert cache.get(env.pending.marker) == 1  # still held: the task's message is redelivered (acks_late)
    env.bus.record_feedback(ids[0], BETA, True)  # meanwhile: coalesced into that redelivery
    assert env.queued == []
    monkeypatch.setattr(env.bus, "rollup_many", real_rollup_many)
    assert tasks.rollup_pending(*args) == 20 - 6 + 1  # the redelivery: the unfinished batches, then the rest
    assert {status(i) for i in ids} == {"CONSUMED"}
    assert not env.pending.has_any() and cache.get(env.pending.marker) is None


def test_the_drain_task_is_redelivered_when_its_worker_is_lost():
    assert tasks.rollup_pending.acks_late and tasks.rollup_pending.reject_on_worker_lost
    assert tasks.rollup_pending.ignore_result


def test_the_resweep_repairs_what_a_lost_pending_set_left_behind(coalescing, monkeypatch):
    """Redis lost the pending set and the queued drain (flushed, evicted, a drain that failed for good):
    the statuses stay behind their feedback until the resweep rolls them up."""
    env = coalescing
    ids = send_events(env.bus, 5, "r")
    expected = {event_id: give_feedback(env.bus, event_id, n) for n, event_id in enumerate(ids)}
    client = redis.Redis.from_url(REDIS_URL)
    assert client.delete(env.pending.pending) == 1
    client.close()
    env.queued.clear()
    assert {status(i) for i in ids} == {"SENT"}
    later = utcnow() + timedelta(seconds=1)
    monkeypatch.setattr(bus_service, "utcnow", lambda: later)
    report = tasks.resweep_statuses.run(older_than_s=0.5)
    assert report["changed"] == expected
    assert {i: status(i) for i in ids} == expected


def test_events_stranded_by_a_process_killed_before_it_queued_the_drain_are_drained_by_the_relay(
        coalescing, monkeypatch, caplog):
    """The feedback's process set the marker and added its events, then died before it queued the drain: the
    marker expires, no later feedback comes, and the periodic relay queues the drain."""
    env = coalescing
    ids = send_events(env.bus, 3, "k")
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda *args, **kwargs: None)  # as if killed
    expected = {event_id: give_feedback(env.bus, event_id, n) for n, event_id in enumerate(ids)}
    monkeypatch.setattr(tasks.rollup_pending, "apply_async",
                        lambda args, **options: env.queued.append((args, options)))
    assert env.pending.has_any() and cache.get(env.pending.marker) == 1
    assert env.queued == [] and {status(i) for i in ids} == {"SENT"}
    monkeypatch.setattr(env.bus, "relay_pending", lambda limit: RelayReport((), ()))
    # While the marker lives, a drain may still come: the relay queues none.
    assert tasks.relay_pending.run() == {"published": [], "failed": []}
    assert env.queued == []
    cache.delete(env.pending.marker)  # its life ran out
    with caplog.at_level("WARNING", "wow_django.tasks"):
        assert tasks.relay_pending.run() == {"published": [], "failed": []}
    assert env.queued == [((env.queue,), {"queue": env.queue})]
    assert "no drain queued" in caplog.text
    assert tasks.relay_pending.run() == {"published": [], "failed": []}  # that drain's marker is set now
    assert len(env.queued) == 1
    assert run_queued(env) == 1
    assert {i: status(i) for i in ids} == expected
    assert tasks.queue_stranded_rollups() is False  # nothing pending any more
    assert env.queued == []


def test_a_relay_whose_pending_set_check_fails_still_reports_its_relay(coalescing, monkeypatch, caplog):
    env = coalescing
    monkeypatch.setattr(env.bus, "relay_pending", lambda limit: RelayReport(("evt-1",), ()))
    monkeypatch.setattr(tasks.PendingRollups, "has_any", lambda self: (_ for _ in ()).throw(redis.ConnectionError("down")))
    with caplog.at_level("WARNING", "wow_django.tasks"):
        assert tasks.relay_pending.run() == {"published": ["evt-1"], "failed": []}
    assert "stranded" in caplog.text and env.queued == []


def test_a_failed_drain_releases_the_marker_and_keeps_its_events(coalescing, monkeypatch):
    """A store error mid-drain (retried by Celery): the next drain, the retry or one a new feedback
    queues, rolls up the taken events."""
    env = coalescing
    ids = send_events(env.bus, 4, "f")
    for event_id in ids:
        env.bus.record_feedback(event_id, ALPHA, True)
        env.bus.record_feedback(event_id, BETA, True)

    def down(batch):
        raise RecoverableStoreError("primary stepped down")

    monkeypatch.setattr(env.bus, "rollup_many", down)
    args, _ = env.queued.pop(0)
    with pytest.raises(RecoverableStoreError):
        tasks.rollup_pending.run(*args)
    assert cache.get(env.pending.marker) is None and env.pending.has_any()
    monkeypatch.undo()  # the store is back (and the task queue is the real one again)
    monkeypatch.setitem(tasks.rollup_event.app.conf, "task_always_eager", False)
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda args, **options: env.queued.append((args, options)))
    env.bus.record_feedback(ids[0], BETA, True)
    assert run_queued(env) == 1
    assert {status(i) for i in ids} == {"CONSUMED"}


def test_rollup_many_goes_on_past_a_failed_event_and_stops_at_a_store_error(coalescing, monkeypatch, caplog):
    env = coalescing
    ids = send_events(env.bus, 3, "m")
    for event_id in ids:
        env.bus.record_feedback(event_id, ALPHA, True)
        env.bus.record_feedback(event_id, BETA, True)
    real_rollup = env.bus.rollup

    def rollup(event_id):
        if event_id == ids[1]:
            raise ValueError("corrupt row")
        return real_rollup(event_id)

    def batch_read_fails(*args, **kwargs):
        raise ValueError("corrupt batch")

    # The batched read fails: each event is rolled up on its own, and one failing does not stop the others.
    monkeypatch.setattr(env.bus, "rollup", rollup)
    monkeypatch.setattr(env.bus.store, "get_events", batch_read_fails)
    with caplog.at_level(logging.ERROR, logger="wow_django.bus"):
        assert env.bus.rollup_many(ids) == {ids[0]: "CONSUMED", ids[1]: None, ids[2]: "CONSUMED"}
    assert "the batched rollup of 3 events failed" in caplog.text
    assert f"rollup of {ids[1]} failed" in caplog.text

    def store_down(*args, **kwargs):
        raise RecoverableStoreError("primary stepped down")

    monkeypatch.setattr(env.bus, "rollup", store_down)
    with pytest.raises(RecoverableStoreError):
        env.bus.rollup_many(ids)
    monkeypatch.setattr(env.bus, "rollup", real_rollup)
    monkeypatch.setattr(env.bus.store, "get_events", store_down)
    with pytest.raises(RecoverableStoreError):  # from the batched read as well: the caller retries the batch
        env.bus.rollup_many(ids)


def test_rollup_many_reads_the_batch_once_and_rolls_up_alone_what_lost_a_race(coalescing, monkeypatch):
    env = coalescing
    ids = send_events(env.bus, 4, "b")
    for event_id in ids[:3]:
        env.bus.record_feedback(event_id, ALPHA, True)
        env.bus.record_feedback(event_id, BETA, True)
    env.bus.record_feedback(ids[3], ALPHA, True)  # one of two: still SENT
    store, calls, depth = env.bus.store, Counter(), [0]
    def counting(name, real):
        def counted(*args, **kwargs):
            calls[name] += depth[0] == 0  # the bus's calls, not those a store makes inside them
            depth[0] += 1
            try:
                return real(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted

    for name in ("get_event", "get_events", "consumption_rows", "latest_consumptions", "set_status_if"):
        monkeypatch.setattr(store, name, counting(name, getattr(store, name)))
    real_set = store.set_status_if

    def loses_once(event_id, *args, **kwargs):  # a concurrent writer changed ids[1] between read and write
        if event_id == ids[1] and calls["lost"] == 0:
            calls["lost"] += 1
            return False
        return real_set(event_id, *args, **kwargs)

    monkeypatch.setattr(store, "set_status_if", loses_once)
    statuses = env.bus.rollup_many([*ids, "no-such-event"])
    assert statuses == {ids[0]: "CONSUMED", ids[1]: "CONSUMED", ids[2]: "CONSUMED", ids[3]: "SENT",
                        "no-such-event": None}
    # One read of the events and one of their feedback for the batch; alone: the lost race and the unknown id.
    assert (calls["get_events"], calls["consumption_rows"]) == (1, 1)
    assert calls["get_event"] == 2 and calls["latest_consumptions"] == 1
    assert [status(event_id) for event_id in ids] == ["CONSUMED", "CONSUMED", "CONSUMED", "SENT"]


def test_an_unreachable_redis_rolls_up_inline(shared_cache, monkeypatch):
    monkeypatch.setitem(tasks.rollup_event.app.conf, "task_always_eager", False)
    with override_settings(CACHES=redis_cache(shared_cache, "redis://127.0.0.1:1/0")), \
            override_settings(WOW=bus_settings("in_memory")):
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        [event_id] = send_events(bus, 1, "u")
        bus.record_feedback(event_id, ALPHA, True)
        bus.record_feedback(event_id, BETA, True)
        assert status(event_id) == "CONSUMED"


def test_a_consumer_killed_before_its_burst_was_acknowledged_gets_it_again_and_rolls_it_up(shared_cache,
                                                                                            monkeypatch):
    """On RabbitMQ: a consumer handled a burst and stored its feedback, then died before the burst's rollups
    were queued (and so before its messages were acknowledged): the broker delivers them again, and the
    redelivery queues the rollups (a coalesced drain rolls them up)."""
    monkeypatch.setitem(tasks.rollup_event.app.conf, "task_always_eager", False)
    queued: list[tuple] = []
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda args, **options: queued.append((args, options)))
    effects: list[str] = []
    consumer(ALPHA, topics=[TOPIC])(lambda event, ctx: effects.append(event.event_id))

    class Killed(BaseException):
        pass

    settings = bus_settings("in_memory", BUS_TRANSPORT_URL=amqp_url())
    with override_settings(WOW=settings):
        bus = get_bus()
        try:
            for consumer_id in (ALPHA, BETA):
                bus.set_topic_consumer(TOPIC, consumer_id)
            ids = send_events(bus, 3, "kill")
            for event_id in ids:
                bus.record_feedback(event_id, BETA, True)
            queued.clear()
            tasks.PendingRollups(settings["BUS_ROLLUP_QUEUE"]).drain(bus.rollup_many)
            cache.delete(tasks.PendingRollups(settings["BUS_ROLLUP_QUEUE"]).marker)
            real = bus.queue_rollups

            def killed(event_ids):
                if event_ids:
                    raise Killed()

            monkeypatch.setattr(bus, "queue_rollups", killed)
            with pytest.raises(Killed):
                in_thread(ConsumerWorker(ALPHA, bus=bus).run, max_messages=3, idle_timeout=5)
            assert sorted(effects) == ids and queued == []
            assert {status(i) for i in ids} == {"SENT"}
            monkeypatch.setattr(bus, "queue_rollups", real)
            again = ConsumerWorker(ALPHA, bus=bus)
            assert in_thread(again.run, max_messages=3, idle_timeout=5).duplicates == 3  # redelivered, not handled again
            assert sorted(effects) == ids and len(queued) == 1
            assert run_queued(SimpleNamespace(queued=queued, queue=settings["BUS_ROLLUP_QUEUE"])) == 1
            assert {status(i) for i in ids} == {"CONSUMED"}
        finally:
            delete_amqp_entities(amqp_url(), settings["BUS_EXCHANGE"], (ALPHA, BETA))


# --- when rollups are not coalesced -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["setting off", "process-local cache"])
def test_without_coalescing_each_feedback_queues_its_own_rollup(shared_cache, monkeypatch, how):
    monkeypatch.setitem(tasks.rollup_event.app.conf, "task_always_eager", False)
    queued = []
    monkeypatch.setattr(tasks.rollup_event, "apply_async", lambda args, **options: queued.append((args, options)))
    monkeypatch.setattr(tasks.rollup_pending, "apply_async", lambda *a, **k: pytest.fail("a drain was queued"))
    extra = {"BUS_ROLLUP_COALESCE": False} if how == "setting off" else {}
    caches = ({"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
              if how == "process-local cache" else redis_cache(shared_cache))
    settings = bus_settings("in_memory", **extra)
    with override_settings(CACHES=caches), override_settings(WOW=settings):
        assert not tasks.coalesced_rollups()
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        [event_id] = send_events(bus, 1, "n")
        bus.record_feedback(event_id, ALPHA, True)
        bus.record_feedback(event_id, BETA, True)
        assert queued == [((event_id,), {"queue": settings["BUS_ROLLUP_QUEUE"]})] * 2


def test_a_drain_on_a_worker_without_the_redis_cache_says_so(caplog):
    with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}):
        with caplog.at_level(logging.ERROR, logger="wow_django.tasks"):
            assert tasks.rollup_pending.run("wow.bus.rollup") == 0
    assert "is not Redis" in caplog.text


# --- on a real Celery worker ---------------------------------------------------------------------------


@pytest.fixture
def celery_app():
    """A Celery app of this test's own on Redis, current while the test runs (no worker yet)."""
    app = Celery("wow-coalescing-tests", set_as_current=False)
    app.conf.update(broker_url=REDIS_URL, result_backend=None, task_ignore_result=True,
                    broker_connection_retry_on_startup=True)
    app.autodiscover_tasks(["wow_django"], force=True)
    previous_current = current_app._get_current_object()
    previous_default = celery_state.default_app
    app.set_current()
    try:
        yield app
    finally:
        previous_current.set_current()
        celery_state.set_default_app(previous_default)
        app.close()


@pytest.fixture
def task_runs():
    """The names of the tasks run on any worker of this process, in order."""
    runs: list[str] = []

    def record(sender=None, task=None, **kwargs):
        runs.append(task.name)

    task_postrun.connect(record, weak=False)
    yield runs
    task_postrun.disconnect(record)


def serial_worker(app, queue: str):
    """The rollup queue's one serial worker, as in production (``-Q <queue> -c 1``), as a thread."""
    return start_worker(app, pool="threads", concurrency=1, queues=[queue], perform_ping_check=False,
                        shutdown_timeout=10)


def test_on_a_real_worker_many_feedbacks_run_few_tasks_and_every_status_is_right(
        shared_cache, celery_app, task_runs):
    settings = bus_settings("in_memory", BUS_CONSUMER_MAX_ATTEMPTS=1, BUS_CONSUMER_BACKOFF_S=0.01)
    rollups = ("wow_django.bus.rollup_pending", "wow_django.bus.rollup")

    @consumer(ALPHA, topics=[TOPIC])
    def alpha(event, ctx):
        pass

    @consumer(BETA, topics=[TOPIC])
    def beta(event, ctx):
        if event.payload["n"] % 3 == 0:
            raise RuntimeError("no stock")  # one attempt: dead-lettered, the event PARTIAL

    with override_settings(WOW=settings):
        queue = settings["BUS_ROLLUP_QUEUE"]
        bus = get_bus()
        for consumer_id in (ALPHA, BETA):
            bus.set_topic_consumer(TOPIC, consumer_id)
        try:
            assert tasks.coalesced_rollups() and not tasks.rollup_event.app.conf.task_always_eager
            # 1. 400 feedbacks recorded while no worker runs: one task queued; the worker runs just it.
            ids = send_events(bus, 200, "q")
            expected = {event_id: give_feedback(bus, event_id, n) for n, event_id in enumerate(ids)}
            with serial_worker(celery_app, queue):
                wait_for(lambda: {i: status(i) for i in ids} == expected, what="every event rolled up")
                wait_for(lambda: cache.get(tasks.PendingRollups(queue).marker) is None, what="the drain ended")
            assert [name for name in task_runs if name in rollups] == ["wow_django.bus.rollup_pending"]
            task_runs.clear()

            # 2. Consumers and the worker at once: 300 events sent from 3 threads, each handled by both
            # consumers (600 feedbacks, every one asking for a rollup while the worker drains). A drain
            # keeps going while feedback comes in less than ROLLUP_LINGER_S apart (here: one task); a new
            # one starts only after such a pause, and the phase lasts seconds at most.
            live = [f"evt-live{n}" for n in range(300)]
            with serial_worker(celery_app, queue), RunningConsumers(ALPHA, BETA, bus=bus):
                senders = [threading.Thread(target=lambda part=part: [
                    bus.send(TOPIC, {"n": n}, event_id=event_id)
                    for n, event_id in enumerate(live) if n % 3 == part]) for part in range(3)]
                for thread in senders:
                    thread.start()
                for thread in senders:
                    thread.join(60)
                want = {event_id: "PARTIAL" if n % 3 == 0 else "CONSUMED" for n, event_id in enumerate(live)}
                wait_for(lambda: {i: status(i) for i in live} == want, timeout=60, what="every event rolled up")
                wait_for(lambda: cache.get(tasks.PendingRollups(queue).marker) is None, what="the drains ended")
            drains = [name for name in task_runs if name in rollups]
            assert set(drains) == {"wow_django.bus.rollup_pending"}
            assert len(drains) <= 600 / 20, f"600 feedbacks, {len(drains)} rollup tasks"
            assert not tasks.PendingRollups(queue).has_any()
        finally:
            delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], (ALPHA, BETA))
            client = redis.Redis.from_url(REDIS_URL)
            client.delete(queue)
            client.close()

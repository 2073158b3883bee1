"""Bus throughput over RabbitMQ: end to end, and bare kombu doing the same messaging.

In one run, with the same envelopes (``--events`` of them, sent from
``--senders`` threads) and two consumers:

- **bare kombu**: publish each envelope (persistent, publisher-confirmed) to a
  durable topic exchange bound to two durable queues; two consumer threads
  receive and acknowledge every message. Events/s = events / time until both
  queues are drained.
- **wow_django bus**, once per bus store and rollup mode: ``send`` (validate, store PENDING
  with two pending feedback rows, publish confirmed, mark SENT); two
  ``ConsumerWorker``s with no-op handlers (inbox claim, handler, inbox done,
  feedback row; the rollups of each burst of delivered messages queued in one
  request, then the burst acknowledged); the rollup writes CONSUMED.
  Events/s = events / time until every event is CONSUMED. Its stats say when
  the last send returned (``sent_s``) and how many rollup tasks ran. The bus store
  calls per event (by operation) are counted in one more run of each, not timed:
  counting every call costs time of its own.

Bus stores (``--store``, repeatable; default: both):

- ``memory``: the in-memory bus store (``WOW['BUS_STORE'] = "in_memory"``);
- ``mongomock``: the Mongo bus store on the embedded engine (``mongomock://``),
  or on the MongoDB that ``--mongo`` (or ``WOW_TEST_MONGO_URI``) names. The
  embedded engine has no indexes: every query and every unique check scans
  its collection, in Python, so this variant slows down as the run grows and
  its figure measures the engine more than the bus.

The rollup (``--rollup``, repeatable) runs on a Celery worker thread serving
the rollup queue on Redis, with Django's RedisCache on the same Redis as the
default cache (``worker``: coalesced, the production shape — each feedback marks
its event pending and a drain task rolls up every pending event;
``worker-per-feedback``: ``WOW['BUS_ROLLUP_COALESCE'] = False``, one task per
feedback, what a project without a Redis cache gets), or inline in the consumer
(``eager``: Celery's ``task_always_eager``, what the sample project uses with
stores that live in one process). By default the in-memory store is measured
with ``worker`` and ``eager`` and the Mongo store with ``worker``. Everything
runs in this one process, so the Celery worker thread shares the interpreter
with the senders and consumers. The goal: the bus with the rollup on its Celery
worker at ≥ 0.60 of bare kombu's events/s; each worker run says whether it meets
it. On a machine busy with other work the figures move from run to run:
``--repeat N`` measures in N rounds (bare kombu, then each bus run) and reports
medians. ``--profile FILE`` samples every thread of the first in-memory run and
writes the hottest functions to FILE.

    python bench/bench_bus.py
    python bench/bench_bus.py --store memory --events 5000
    python bench/bench_bus.py --events 2000 --senders 4 --rollup eager
    python bench/bench_bus.py --store memory --rollup worker --rollup worker-per-feedback
    python bench/bench_bus.py --store memory --rollup worker --events 2000 --repeat 5   # the goal, medians
    python bench/bench_bus.py --mongo mongodb://127.0.0.1:27017 --store mongomock
    python bench/bench_bus.py --amqp amqp://guest:guest@127.0.0.1:5672// --redis redis://127.0.0.1:6379/14
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "wow_django", "wow_django.bus"],
    DATABASES={},
    WOW={"CONTEXT_NAME": "bench"},
    USE_TZ=True,
)
django.setup()

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.signals import task_postrun  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from kombu import Connection, Consumer, Exchange, Producer, Queue, binding  # noqa: E402

from wow_django.backends.mongo.client import disconnect  # noqa: E402
from wow_django.bus import ConsumerWorker, consumer, get_bus, run_in_thread  # noqa: E402
from wow_django.bus.envelope import build_envelope  # noqa: E402
from wow_django.persistence.bus import BusStore, EventQuery  # noqa: E402
from wow_django.testing.bus import delete_amqp_entities  # noqa: E402

TOPIC = "bench.purchased"
CONSUMERS = ("bench-member", "bench-message")
GOAL = 0.6  # the bus with the rollup on its Celery worker, as a share of bare kombu's events/s
ROLLUP_TASKS = ("wow_django.bus.rollup_pending", "wow_django.bus.rollup")


def envelopes(count: int) -> list[dict]:
    return [
        build_envelope({"topic": TOPIC, "payload": {"orderId": f"o-{n}", "userId": f"u-{n % 100}",
                                                    "amount": "199.00", "currency": "CNY"},
                        "initiator": {"service": "bench", "operation": "pay"}}, default_service="bench").to_json()
        for n in range(count)
    ]


def split(items, parts):
    return [items[i::parts] for i in range(parts)]


# --- bare kombu -----------------------------------------------------------------------------


def bare_kombu(url: str, messages: list[dict], senders: int) -> float:
    name = f"bench.bare.{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="topic", durable=True)
    queues = [Queue(f"{name}.{c}", bindings=[binding(exchange, routing_key=TOPIC)], durable=True) for c in CONSUMERS]
    with Connection(url) as setup:
        channel = setup.channel()
        exchange(channel).declare()
        for queue in queues:
            queue(channel).declare()
    received = [0] * len(queues)
    done = threading.Event()
    ready = threading.Barrier(len(queues) + 1)

    def consume(index: int) -> None:
        with Connection(url) as connection:
            def on_message(body, message):
                message.ack()
                received[index] += 1

            with Consumer(connection.channel(), queues=[queues[index]], callbacks=[on_message], accept=["json"],
                          prefetch_count=16):
                ready.wait()
                while received[index] < len(messages) and not done.is_set():
                    try:
                        connection.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass

    def send(chunk: list[dict]) -> None:
        with Connection(url, transport_options={"confirm_publish": True}) as connection:
            producer = Producer(connection.channel(), exchange=exchange)
            for message in chunk:
                producer.publish(json.dumps(message), routing_key=TOPIC, content_type="application/json",
                                 content_encoding="utf-8", delivery_mode=2, message_id=message["eventId"])

    consumers = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(len(queues))]
    for thread in consumers:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    sender_threads = [threading.Thread(target=send, args=(chunk,)) for chunk in split(messages, senders)]
    for thread in sender_threads:
        thread.start()
    for thread in sender_threads:
        thread.join()
    for thread in consumers:
        thread.join(120)
    elapsed = time.perf_counter() - started
    done.set()
    with Connection(url) as cleanup:
        channel = cleanup.channel()
        for queue in queues:
            queue(channel).delete()
        exchange(channel).delete()
    if received != [len(messages)] * len(queues):
        raise RuntimeError(f"bare kombu: received {received}, expected {len(messages)} each")
    return elapsed


# --- the bus ----------------------------------------------------------------------------------


class StoreMeter:
    """Counts and times the operations of a bus store as its callers make them: its abstract methods and
    the combined ones of ``BusStore`` (on this instance only); a call a store makes inside another of its
    calls is part of that one."""

    COMBINED = ("insert_event_with_consumptions", "get_events")

    def __init__(self, store):
        self.calls = 0
        self.seconds = 0.0
        self.by_name: Counter = Counter()
        self._lock = threading.Lock()
        self._depth = threading.local()
        for name in sorted({*BusStore.__abstractmethods__, *self.COMBINED}):
            setattr(store, name, self._timed(getattr(store, name)))

    def _timed(self, method):
        name = method.__name__

        def timed(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                self._depth.n = depth
                if depth == 0:
                    with self._lock:
                        self.calls += 1
                        self.seconds += elapsed
                        self.by_name[name] += 1

        return timed


class Sampler:
    """A sampling profiler of every thread: the innermost frames seen most often, and what is on the stack."""

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.own: Counter = Counter()
        self.total: Counter = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-sampler")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                self.samples += 1
                seen = set()
                top = True
                while frame is not None:
                    code = frame.f_code
                    key = f"{code.co_filename.split('site-packages/')[-1]}:{code.co_firstlineno} {code.co_name}"
                    if top:
                        self.own[key] += 1
                        top = False
                    if key not in seen:
                        seen.add(key)
                        self.total[key] += 1
                    frame = frame.f_back

    def report(self, limit: int = 60) -> str:
        lines = [f"{self.samples} samples of every thread (idle waits included)", "", "own (innermost frame):"]
        lines += [f"{n:7d}  {key}" for key, n in self.own.most_common(limit)]
        lines += ["", "total (on the stack):"]
        lines += [f"{n:7d}  {key}" for key, n in self.total.most_common(limit * 2)]
        return "\n".join(lines)


def bus_end_to_end(url: str, messages: list[dict], senders: int, rollup: str, redis_url: str,
                   store: str, mongo: str, profile: str | None = None, metered: bool = False) -> tuple[float, dict]:
    """Seconds until every event of ``messages`` was CONSUMED, and the run's stats. ``metered``: every bus store
    call is counted and timed (the ``store`` stats), which costs time of its own: the timed runs are not
    metered, a run of its own is."""
    exchange = f"bench.bus.{uuid.uuid4().hex[:8]}"
    rollup_queue = f"{exchange}.rollup"
    database = f"bench_bus_{uuid.uuid4().hex[:8]}"
    wow = {"CONTEXT_NAME": "bench", "MONGO_URI": mongo, "BUS_DATABASE": database,
           "BUS_STORE": "in_memory" if store == "memory" else "mongo",
           "BUS_TRANSPORT_URL": url, "BUS_EXCHANGE": exchange, "BUS_ROLLUP_QUEUE": rollup_queue,
           "BUS_ROLLUP_COALESCE": rollup != "worker-per-feedback"}
    # The shared cache coalescing needs: Django's RedisCache, on the Celery broker's Redis, under a key
    # prefix of this run's own (its keys are deleted afterwards).
    caches = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url,
                          "KEY_PREFIX": exchange}}
    from wow_django import tasks  # (registers the tasks with the app below)

    app = Celery("bench_bus", set_as_current=True)
    app.conf.update(broker_url=redis_url, result_backend=None, task_ignore_result=True,
                    task_always_eager=rollup == "eager", broker_connection_retry_on_startup=True)
    app.set_default()  # the consumer threads' current app too
    rollup_runs: Counter = Counter()

    def count_rollup_task(sender=None, task=None, **kwargs):
        if task.name in ROLLUP_TASKS:
            rollup_runs[task.name] += 1

    task_postrun.connect(count_rollup_task, weak=False)

    for consumer_id in CONSUMERS:
        consumer(consumer_id, topics=[TOPIC])(lambda event, ctx: None)
    worker_context = None
    sampler = Sampler() if profile else None
    with override_settings(WOW=wow, CACHES=caches):
        try:
            bus = get_bus()
            for consumer_id in CONSUMERS:
                bus.set_topic_consumer(TOPIC, consumer_id)
            if rollup == "worker" and not tasks.coalesced_rollups():
                raise RuntimeError("the rollups are not coalesced: is the default cache Django's RedisCache?")
            meter = StoreMeter(bus.store) if metered else None
            if rollup != "eager":
                from celery.contrib.testing.worker import start_worker

                worker_context = start_worker(app, pool="threads", concurrency=1, queues=[rollup_queue],
                                              perform_ping_check=False, shutdown_timeout=10)
                worker_context.__enter__()
            workers = [ConsumerWorker(c, bus=bus) for c in CONSUMERS]
            threads = [run_in_thread(w) for w in workers]

            def send(chunk: list[dict]) -> None:
                for message in chunk:
                    result = bus.send_envelope(message)
                    if result.status is None:
                        raise RuntimeError(result)

            consumed_query = EventQuery(status="CONSUMED")
            if sampler is not None:
                sampler.__enter__()
            started = time.perf_counter()
            sender_threads = [threading.Thread(target=send, args=(chunk,)) for chunk in split(messages, senders)]
            for thread in sender_threads:
                thread.start()
            for thread in sender_threads:
                thread.join()
            sent = time.perf_counter() - started
            deadline = time.monotonic() + float(os.environ.get("BENCH_BUS_TIMEOUT", 600))
            consumed = 0
            while time.monotonic() < deadline:
                consumed, _ = bus.store.find_events(consumed_query, skip=0, limit=0)
                if consumed == len(messages):
                    break
                # The count only (an empty page): the in-memory store reads its status index; the embedded
                # engine scans. This watching shares the interpreter with the bus, so it stays cheap.
                time.sleep(0.005 if store == "memory" else 0.05)
            elapsed = time.perf_counter() - started
            if sampler is not None:
                sampler.__exit__(None, None, None)
                with open(profile, "w") as out:
                    out.write(sampler.report() + "\n")
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(30)
            if consumed != len(messages):
                statuses = {s: bus.store.find_events(EventQuery(status=s), skip=0, limit=1)[0]
                            for s in ("PENDING", "SENT", "CONSUMED", "PARTIAL", "FAILED")}
                raise RuntimeError(f"bus: {consumed} of {len(messages)} events CONSUMED: {statuses}, "
                                   f"consumers {[w.stats.to_json() for w in workers]}")
            stats = {w.consumer_id: w.stats.to_json() for w in workers}
            # Where the time went: every send had returned after sent_s; the rest is the consumers and
            # the rollups catching up.
            stats["sent_s"] = round(sent, 2)
            if meter is not None:
                stats["store"] = {"calls_per_event": round(meter.calls / len(messages), 1),
                                  "mean_call_ms": round(1000 * meter.seconds / max(meter.calls, 1), 3),
                                  "per_event": {name: round(count / len(messages), 2)
                                                for name, count in meter.by_name.most_common()}}
            if rollup != "eager":
                # Tasks run until every event was CONSUMED (a last drain may still be finishing).
                tasks_run = sum(rollup_runs.values())
                stats["rollup_tasks"] = {"run": tasks_run, "feedbacks": len(messages) * len(CONSUMERS),
                                         "events_per_task": round(len(messages) / max(tasks_run, 1), 1)}
        finally:
            task_postrun.disconnect(count_rollup_task)
            if worker_context is not None:
                worker_context.__exit__(None, None, None)
            delete_amqp_entities(url, exchange, CONSUMERS)
            client = redis.Redis.from_url(redis_url)
            leftover = list(client.scan_iter(f"{exchange}:*")) + [rollup_queue]
            client.delete(*leftover)
            client.close()
            if store != "memory":
                from wow_django.backends.mongo import get_connection

                get_connection().client.drop_database(database)
                disconnect(wow["MONGO_URI"])
    return elapsed, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--rollup", action="append", choices=("worker", "worker-per-feedback", "eager"),
                        help="where the rollup runs (default: worker and eager for the in-memory store, worker for "
                             "the Mongo store)")
    parser.add_argument("--store", action="append", choices=("memory", "mongomock"),
                        help="the bus store(s) to measure, in this order (default: memory, then mongomock)")
    parser.add_argument("--amqp", default=os.environ.get("WOW_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--redis", default=os.environ.get("WOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument("--mongo", default=os.environ.get("WOW_TEST_MONGO_URI", "mongomock://localhost/bench"),
                        help="where the Mongo bus store keeps its records: the embedded engine (default) or a "
                             "real MongoDB (a database bench_bus_* is created and dropped)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure bare kombu and every bus run this many times, in rounds; report medians")
    parser.add_argument("--profile", metavar="FILE",
                        help="sample every thread during the in-memory bus run and write the hottest functions here")
    args = parser.parse_args()

    stores = args.store or ["memory", "mongomock"]
    runs = [(store, rollup) for store in stores
            for rollup in args.rollup or (["worker", "eager"] if store == "memory" else ["worker"])]
    messages = envelopes(args.events)
    mongo_label = f"Mongo store on {args.mongo.split('://')[0]}://"
    labels = {"memory": "in-memory store", "mongomock": mongo_label}
    rollups = {"worker": "rollup on its Celery worker", "worker-per-feedback": "a rollup task per feedback",
               "eager": "rollup inline"}
    print(f"events={args.events} senders={args.senders} consumers={len(CONSUMERS)} repeat={args.repeat} "
          f"broker={args.amqp.split('@')[-1]} celery broker and cache={args.redis.split('@')[-1]}")
    print(f"send → both consumers handle → feedback → rollup to CONSUMED; goal: the bus with the rollup on its "
          f"Celery worker ≥ {GOAL:.2f} × bare kombu")
    # Rounds of bare kombu then every bus run, so that a machine busy with something else weighs on both.
    bare_rates: list[float] = []
    results: dict[tuple[str, str], list[tuple[float, dict]]] = {run: [] for run in runs}
    profile = args.profile
    for _ in range(args.repeat):
        bare_rates.append(args.events / bare_kombu(args.amqp, messages, args.senders))
        for store, rollup in runs:
            elapsed, stats = bus_end_to_end(args.amqp, [dict(m) for m in messages], args.senders, rollup, args.redis,
                                            store, args.mongo, profile=profile if store == "memory" else None)
            if store == "memory":
                profile = None
            results[(store, rollup)].append((args.events / elapsed, stats))
    # The store calls per event, counted in one more run of each (not timed: counting costs time too).
    calls = {run: bus_end_to_end(args.amqp, [dict(m) for m in messages], args.senders, run[1], args.redis, run[0],
                                 args.mongo, metered=True)[1]["store"] for run in runs}

    def spread(rates: list[float]) -> str:
        return f"  (median of {len(rates)}: {min(rates):.1f} to {max(rates):.1f})" if len(rates) > 1 else ""

    bare_rate = statistics.median(bare_rates)
    print(f"{'bare kombu (publish confirmed → 2 queues → ack)':58} {bare_rate:8.1f} events/s{spread(bare_rates)}")
    verdicts = []
    for store, rollup in runs:
        rates = [rate for rate, _ in results[(store, rollup)]]
        rate = statistics.median(rates)
        _, stats = min(results[(store, rollup)], key=lambda result: abs(result[0] - rate))
        name = f"bus, {labels[store]}, {rollups[rollup]}"
        print(f"{name:58} {rate:8.1f} events/s  ratio {rate / bare_rate:.2f}{spread(rates)}")
        print(f"    stats: {json.dumps(stats)}")
        print(f"    store calls (a run of its own, counted): {json.dumps(calls[(store, rollup)])}")
        if rollup == "worker":
            verdict = (f"{name}: {rate:.1f} / {bare_rate:.1f} events/s = {rate / bare_rate:.2f} × bare kombu: "
                       + ("meets" if rate / bare_rate >= GOAL else "does NOT meet") + f" the ≥ {GOAL:.2f} goal")
            if store == "mongomock" and args.mongo.startswith("mongomock://"):
                verdict += " (the embedded engine scans its collections in Python: this measures the engine)"
            verdicts.append(verdict)
    for verdict in verdicts:
        print(verdict)


if __name__ == "__main__":
    main()

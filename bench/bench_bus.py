"""Bus throughput over RabbitMQ: end to end, and bare kombu doing the same messaging.

In one run, with the same envelopes (``--events`` of them, sent from
``--senders`` threads) and two consumers:

- **bare kombu**: publish each envelope (persistent, publisher-confirmed) to a
  durable topic exchange bound to two durable queues; two consumer threads
  receive and acknowledge every message. Events/s = events / time until both
  queues are drained.
- **wow_django bus**: ``send`` (validate, store PENDING with two pending
  feedback rows, publish confirmed, mark SENT); two ``ConsumerWorker``s with
  no-op handlers (inbox claim, handler, inbox done, feedback row); each
  feedback queues the rollup, which writes CONSUMED. Events/s = events / time
  until every event is CONSUMED.

The rollup runs on a Celery worker thread serving the rollup queue on Redis
(``--rollup worker``, the production shape) or inline (``--rollup eager``).
Bus records are on the embedded engine (``mongomock://``) unless ``--mongo``
(or ``WOW_TEST_MONGO_URI``) names a real MongoDB. The embedded engine has no
indexes: every query and every unique check scans its collection, in Python,
so the bus side slows down as the run grows and its figure measures the
engine more than the bus. Everything runs in this one process.

    python bench/bench_bus.py
    python bench/bench_bus.py --events 2000 --senders 4 --rollup eager
    python bench/bench_bus.py --amqp amqp://guest:guest@127.0.0.1:5672// --redis redis://127.0.0.1:6379/14
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid

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

from celery import Celery  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from kombu import Connection, Consumer, Exchange, Producer, Queue, binding  # noqa: E402

from wow_django.bus import ConsumerWorker, consumer, get_bus, run_in_thread  # noqa: E402
from wow_django.bus.envelope import build_envelope  # noqa: E402
from wow_django.bus.testing import delete_amqp_entities  # noqa: E402
from wow_django.mongo.client import disconnect  # noqa: E402

TOPIC = "bench.purchased"
CONSUMERS = ("bench-member", "bench-message")


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


def bus_end_to_end(url: str, messages: list[dict], senders: int, rollup: str, redis_url: str,
                   mongo: str) -> tuple[float, dict]:
    exchange = f"bench.bus.{uuid.uuid4().hex[:8]}"
    rollup_queue = f"{exchange}.rollup"
    database = f"bench_bus_{uuid.uuid4().hex[:8]}"
    wow = {"CONTEXT_NAME": "bench", "MONGO_URI": mongo, "BUS_DATABASE": database,
           "BUS_TRANSPORT_URL": url, "BUS_EXCHANGE": exchange, "BUS_ROLLUP_QUEUE": rollup_queue}
    from wow_django.bus import tasks  # noqa: F401  (registers the bus tasks with the app below)

    app = Celery("bench_bus", set_as_current=True)
    app.conf.update(broker_url=redis_url, result_backend=None, task_ignore_result=True,
                    task_always_eager=rollup == "eager", broker_connection_retry_on_startup=True)
    app.set_default()  # the consumer threads' current app too

    for consumer_id in CONSUMERS:
        consumer(consumer_id, topics=[TOPIC])(lambda event, ctx: None)
    worker_context = None
    with override_settings(WOW=wow):
        try:
            bus = get_bus()
            for consumer_id in CONSUMERS:
                bus.set_topic_consumer(TOPIC, consumer_id)
            store_time, store_calls, store_run = [0.0], [0], bus.store.run

            def timed_run(collection, action, fn):
                started = time.perf_counter()
                try:
                    return store_run(collection, action, fn)
                finally:
                    store_time[0] += time.perf_counter() - started
                    store_calls[0] += 1

            bus.store.run = timed_run
            if rollup == "worker":
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

            started = time.perf_counter()
            sender_threads = [threading.Thread(target=send, args=(chunk,)) for chunk in split(messages, senders)]
            for thread in sender_threads:
                thread.start()
            for thread in sender_threads:
                thread.join()
            deadline = time.monotonic() + float(os.environ.get('BENCH_BUS_TIMEOUT', 600))
            consumed = 0
            while time.monotonic() < deadline:
                consumed = bus.store.events.count_documents({"status": "CONSUMED"})
                if consumed == len(messages):
                    break
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(30)
            if consumed != len(messages):
                statuses = {s: bus.store.events.count_documents({"status": s})
                            for s in ("PENDING", "SENT", "CONSUMED", "PARTIAL", "FAILED")}
                raise RuntimeError(f"bus: {consumed} of {len(messages)} events CONSUMED: {statuses}, "
                                   f"consumers {[w.stats.to_json() for w in workers]}")
            stats = {w.consumer_id: w.stats.to_json() for w in workers}
            stats["store"] = {"calls_per_event": round(store_calls[0] / len(messages), 1),
                              "mean_call_ms": round(1000 * store_time[0] / max(store_calls[0], 1), 3)}
        finally:
            if worker_context is not None:
                worker_context.__exit__(None, None, None)
            delete_amqp_entities(url, exchange, CONSUMERS)
            from wow_django.mongo import get_connection

            get_connection().client.drop_database(database)
            disconnect(wow["MONGO_URI"])
    return elapsed, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--rollup", choices=("worker", "eager"), default="worker")
    parser.add_argument("--amqp", default=os.environ.get("WOW_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    parser.add_argument("--redis", default=os.environ.get("WOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument("--mongo", default=os.environ.get("WOW_TEST_MONGO_URI", "mongomock://localhost/bench"),
                        help="where the bus records go: the embedded engine (default) or a real MongoDB "
                             "(a database bench_bus_* is created and dropped)")
    args = parser.parse_args()

    messages = envelopes(args.events)
    bus_rate_input = [dict(m) for m in messages]
    bare = bare_kombu(args.amqp, messages, args.senders)
    bus, stats = bus_end_to_end(args.amqp, bus_rate_input, args.senders, args.rollup, args.redis, args.mongo)
    bare_rate, bus_rate = args.events / bare, args.events / bus
    print(f"events={args.events} senders={args.senders} consumers={len(CONSUMERS)} rollup={args.rollup} "
          f"broker={args.amqp.split('@')[-1]} bus records={args.mongo.split('://')[0]}://")
    print(f"bare kombu (publish confirmed → 2 queues → ack):           {bare_rate:9.1f} events/s  ({bare:.2f} s)")
    print(f"wow_django bus (send → 2 consumers → feedback → CONSUMED): {bus_rate:9.1f} events/s  ({bus:.2f} s)")
    print(f"ratio bus / bare: {bus_rate / bare_rate:.2f}  (goal ≥ 0.50)")
    print(f"consumer stats: {json.dumps(stats)}")


if __name__ == "__main__":
    main()

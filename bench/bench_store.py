"""Event-store throughput: appends/s and loads/s.

Runs, in one process and one run:
- our in-memory store and our Mongo store on the embedded engine
  (``mongomock://``), each with batching off and on;
- pyeventsourcing's in-memory (POPO) aggregate recorder doing the same work,
  as the baseline.

Work: ``--aggregates`` aggregates × ``--versions`` appends each (one event per
append, as one call per append), spread over ``--threads`` threads; then five
full loads per aggregate. Batching is shown with the default 1 ms window and
with a 0 ms window (pure group commit: what queues during a flush goes next).
The embedded engine checks unique indexes by scanning the collection, so its
appends slow down as it fills: it is for development, not for load. Only the store calls are timed: streams and stored
events are built beforehand.

    python bench/bench_store.py                 # defaults
    python bench/bench_store.py --aggregates 2000 --versions 10 --threads 8

Needs the ``bench`` extra (``pip install -e '.[bench]'``).
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

from wow_django.backends.memory.stores import InMemoryEventStore  # noqa: E402
from wow_django.backends.mongo.client import MongoConnection  # noqa: E402
from wow_django.backends.mongo.event_store import MongoEventStore  # noqa: E402
from wow_django.backends.mongo.schema import SchemaGuard  # noqa: E402
from wow_django.persistence.batching import BatchingEventStore  # noqa: E402
from wow_django.persistence.records import AggregateId  # noqa: E402
from wow_django.testing.event_store import make_stream  # noqa: E402


def split(items, parts):
    return [items[i::parts] for i in range(parts)]


def run_threads(target, chunks):
    """Seconds for ``target`` to run over every chunk, one thread each; a thread's exception is raised here."""
    errors: list[BaseException] = []

    def run(chunk):
        try:
            target(chunk)
        except BaseException as exc:  # raised in the caller: a failed thread makes the run malformed
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(chunk,)) for chunk in chunks]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


LOAD_ROUNDS = 5


def bench_ours(store, aggregates: int, versions: int, threads: int):
    ids = [AggregateId("order", uuid.uuid4().hex) for _ in range(aggregates)]
    # Each thread owns whole aggregates and appends their versions in order.
    work = [[make_stream(agg, v) for v in range(1, versions + 1)] for agg in ids]

    def append(chunk):
        for streams in chunk:
            for stream in streams:
                store.append(stream)

    append_s = run_threads(append, split(work, threads))

    def load(chunk):
        for _ in range(LOAD_ROUNDS):
            for agg in chunk:
                assert len(store.load(agg)) == versions

    load_s = run_threads(load, split(ids, threads))
    store.close()
    return aggregates * versions / append_s, aggregates * LOAD_ROUNDS / load_s


def bench_baseline(aggregates: int, versions: int, threads: int, recorder=None):
    """The same work on a pyeventsourcing recorder (POPO unless another, with its table created, is given)."""
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.popo import POPOAggregateRecorder

    recorder = recorder if recorder is not None else POPOAggregateRecorder()
    ids = [uuid.uuid4() for _ in range(aggregates)]
    work = [
        [
            StoredEvent(originator_id=agg, originator_version=v, topic="tests:ThingHappened",
                        state=json.dumps({"n": v, "i": 0, "text": f"event 0 of v{v}"}).encode())
            for v in range(1, versions + 1)
        ]
        for agg in ids
    ]

    def append(chunk):
        for events in chunk:
            for event in events:
                recorder.insert_events([event])

    append_s = run_threads(append, split(work, threads))

    def load(chunk):
        for _ in range(LOAD_ROUNDS):
            for agg in chunk:
                assert len(recorder.select_events(agg)) == versions

    load_s = run_threads(load, split(ids, threads))
    return aggregates * versions / append_s, aggregates * LOAD_ROUNDS / load_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=1000)
    parser.add_argument("--mongomock-aggregates", type=int, default=200,
                        help="aggregates for the embedded engine rows (it is O(n) per write)")
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    args = parser.parse_args()
    a, v, t = args.aggregates, args.versions, args.threads

    def best(fn):
        runs = [fn() for _ in range(args.repeat)]
        return max(r[0] for r in runs), max(r[1] for r in runs)

    def mongo_store():
        connection = MongoConnection("mongomock://localhost/bench")
        return MongoEventStore(connection, "bench", schema=SchemaGuard("bench"))

    m = args.mongomock_aggregates
    rows = [
        ("pyeventsourcing POPO recorder (baseline)", "-", a, best(lambda: bench_baseline(a, v, t))),
        ("wow_django in-memory", "off", a, best(lambda: bench_ours(InMemoryEventStore(), a, v, t))),
        ("wow_django in-memory", "on 1ms", a,
         best(lambda: bench_ours(BatchingEventStore(InMemoryEventStore()), a, v, t))),
        ("wow_django in-memory", "on 0ms", a,
         best(lambda: bench_ours(BatchingEventStore(InMemoryEventStore(), max_delay_ms=0), a, v, t))),
        ("wow_django mongomock://", "off", m, best(lambda: bench_ours(mongo_store(), m, v, t))),
        ("wow_django mongomock://", "on 1ms", m, best(lambda: bench_ours(BatchingEventStore(mongo_store()), m, v, t))),
        ("wow_django mongomock://", "on 0ms", m,
         best(lambda: bench_ours(BatchingEventStore(mongo_store(), max_delay_ms=0), m, v, t))),
    ]
    base_append, base_load = rows[0][3]
    print(f"# x {v} appends per aggregate, {t} threads, best of {args.repeat}; Python {sys.version.split()[0]}")
    print(f"{'store':42} {'batching':8} {'aggs':>5} {'appends/s':>12} {'x base':>7} {'loads/s':>12} {'x base':>7}")
    for name, batching, count, (appends, loads) in rows:
        print(f"{name:42} {batching:8} {count:5} {appends:12,.0f} {appends / base_append:7.2f} "
              f"{loads:12,.0f} {loads / base_load:7.2f}")


if __name__ == "__main__":
    main()

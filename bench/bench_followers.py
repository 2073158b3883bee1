"""Follower catch-up throughput: streams/s a follower hands to its handler while behind.

``--streams`` streams (one event each) are appended to one context, then:

* **feed reads** — bare :meth:`StreamFeed.read` pages of ``--batch`` streams
  from position 0 to the head (the floor a follower cannot beat);
* **follower** — a :class:`FollowerRunner` with a no-op handler catching up
  from position 0 (batches growing from ``FOLLOWER_MIN_BATCH`` = 16 to
  ``--batch``, a lease and one checkpoint per batch);
* **baseline** — pyeventsourcing's application recorder on the same engine
  reading its notification log in pages of ``--batch``
  (``select_notifications``) over as many stored events.

Each figure is the best of ``--repeat`` runs; SQLite files are new, the
PostgreSQL databases are created and dropped (``WOW_BENCH_PG_HOST`` /
``_PORT`` / ``_USER`` / ``_PASSWORD``, default 127.0.0.1:5432 postgres).

    python bench/bench_followers.py --streams 20000 --batch 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_django_store import PG, admin_connection  # noqa: E402

#: A real MongoDB server for the ``mongo backend, server`` row (the test suite's variable).
REAL_MONGO_ENV = "WOW_TEST_MONGO_URI"


def fill(store, context: str, count: int) -> None:
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_stream

    streams = [make_stream(AggregateId("order", uuid.uuid4().hex, context, "t"), 1) for _ in range(count)]
    for start in range(0, count, 500):
        results = store.append_many(streams[start:start + 500])
        assert not any(results), results


def mongo_row(label: str, uri: str, count: int, cleanups: list):
    """A catch-up row on MongoDB at ``uri``: a new database filled with ``count`` streams (dropped by ``cleanups``)."""
    from wow_django.backends.mongo.client import MongoConnection
    from wow_django.backends.mongo.event_store import MongoEventStore
    from wow_django.backends.mongo.followers import MongoFollowerStore, MongoStreamFeed
    from wow_django.backends.mongo.schema import SchemaGuard

    connection = MongoConnection(uri)
    cleanups.append(connection.close)
    name = f"wow_bench_f_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    cleanups.append(lambda: connection.client.drop_database(name))
    guard = SchemaGuard("bench")
    store = MongoEventStore(connection, name, schema=guard)
    fill(store, "bench", count)
    return label, MongoStreamFeed(store, "bench"), MongoFollowerStore(connection, name, schema=guard), None


def bench_reads(feed, batch: int) -> float:
    started, after, seen = time.perf_counter(), 0, 0
    while True:
        items = feed.read(after, batch)
        if not items:
            break
        seen += len(items)
        after = items[-1].position
    return seen / (time.perf_counter() - started)


def bench_follower(feed, store, batch: int) -> float:
    from wow_django.application.followers import Follower, FollowerRunner

    count = [0]

    def handle(item):
        count[0] += 1

    runner = FollowerRunner(Follower(f"bench-{uuid.uuid4().hex[:8]}", handle), feed, store, gap_timeout_s=10,
                            lease_s=30, min_batch=16, max_batch=batch, max_wait_s=0.01)
    started = time.perf_counter()
    runner.run(threading.Event(), until_caught_up=True)
    return count[0] / (time.perf_counter() - started)


def bench_baseline(recorder, count: int, batch: int) -> float:
    started, start, seen = time.perf_counter(), 1, 0
    while True:
        notifications = recorder.select_notifications(start, batch)
        if not notifications:
            break
        seen += len(notifications)
        start = notifications[-1].id + 1
    assert seen == count, (seen, count)
    return seen / (time.perf_counter() - started)


def stored_events(count: int):
    from eventsourcing.persistence import StoredEvent

    state = b'{"n":1,"i":0,"text":"event 0 of v1"}'
    return [StoredEvent(uuid.uuid4(), 1, "tests:ThingHappened", state) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000, help="page size / FOLLOWER_MAX_BATCH")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    args = parser.parse_args()
    n, batch = args.streams, args.batch

    directory = tempfile.mkdtemp(prefix="wow-bench-followers-")
    pg_names = [f"wow_bench_f_{os.getpid()}_{i}" for i in range(2)]
    with admin_connection() as admin:
        for name in pg_names:
            admin.execute(f'CREATE DATABASE "{name}"')
    import django
    from django.conf import settings

    settings.configure(DATABASES={
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(directory, "wow.sqlite3")},
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[0], **PG},
    }, INSTALLED_APPS=["wow_django"], USE_TZ=True, WOW={"STORAGE": "in_memory"})
    django.setup()
    from django.core.management import call_command
    from django.db import connections
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed
    from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
    from wow_django.backends.memory.stores import InMemoryEventStore

    rows = []
    datastore = None
    mongo_cleanups = []
    try:
        memory = InMemoryEventStore()
        fill(memory, "bench", n)
        rows.append(("in_memory", InMemoryStreamFeed(memory, "bench"), InMemoryFollowerStore(), None))
        rows.append(mongo_row("mongo backend, embedded engine*", "mongomock://localhost/wow_bench", n,
                              mongo_cleanups))
        if os.environ.get(REAL_MONGO_ENV):
            rows.append(mongo_row("mongo backend, server", os.environ[REAL_MONGO_ENV], n, mongo_cleanups))
        for alias in ("sqlite", "pg"):
            call_command("migrate", "wow_django", database=alias, verbosity=0)
            store = DjangoEventStore(using=alias)
            fill(store, "bench", n)
            rows.append((f"django backend, {'SQLite' if alias == 'sqlite' else 'PostgreSQL'}",
                         DjangoStreamFeed(store, "bench"), DjangoFollowerStore(using=alias), alias))
        recorder = SQLiteApplicationRecorder(SQLiteDatastore(os.path.join(directory, "baseline.sqlite3")))
        recorder.create_table()
        for start in range(0, n, 500):
            recorder.insert_events(stored_events(min(500, n - start)))
        baselines = {"sqlite": recorder}
        try:
            from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
        except ImportError:
            print("# pyeventsourcing's PostgreSQL recorder needs psycopg_pool: its baseline is skipped")
        else:
            datastore = PostgresDatastore(pg_names[1], PG["HOST"], PG["PORT"], PG["USER"], PG["PASSWORD"])
            pg_recorder = PostgresApplicationRecorder(datastore)
            pg_recorder.create_table()
            for start in range(0, n, 500):
                pg_recorder.insert_events(stored_events(min(500, n - start)))
            baselines["pg"] = pg_recorder

        print(f"# {n} streams of one event in one context, pages of {batch}, best of {args.repeat}; "
              f"Python {sys.version.split()[0]}")
        print(f"{'engine':<36} {'pyeventsourcing reads/s':>24} {'feed reads/s':>14} {'follower/s':>12} "
              f"{'follower x base':>16}")
        for name, feed, follower_store, alias in rows:
            base = baselines.get(alias) if alias else None
            base_rate = max(bench_baseline(base, n, batch) for _ in range(args.repeat)) if base else None
            reads = max(bench_reads(feed, batch) for _ in range(args.repeat))
            follows = max(bench_follower(feed, follower_store, batch) for _ in range(args.repeat))
            ratio = f"{follows / base_rate:16.2f}" if base_rate else f"{'-':>16}"
            base_text = f"{base_rate:24,.0f}" if base_rate else f"{'-':>24}"
            print(f"{name:<36} {base_text} {reads:14,.0f} {follows:12,.0f} {ratio}")
        print("# * mongomock in this process (the test suite's embedded engine), not a MongoDB server figure"
              + ("" if os.environ.get(REAL_MONGO_ENV) else f"; set {REAL_MONGO_ENV} for a server row"))
    finally:
        for cleanup in reversed(mongo_cleanups):
            cleanup()
        if datastore is not None:
            datastore.close()
        connections.close_all()
        with admin_connection() as admin:
            for name in pg_names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()

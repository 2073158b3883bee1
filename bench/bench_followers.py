"""Followers: catch-up throughput (streams/s while behind) and live latency (append → handler).

**Catch-up** (``--streams N``, 0: skipped): N streams (one event each) are
appended to one context, then:

* **feed reads** — bare :meth:`StreamFeed.read` pages of ``--batch`` streams
  from position 0 to the head (the floor a follower cannot beat);
* **follower** — a :class:`FollowerRunner` with a no-op handler catching up
  from position 0 (batches growing from ``FOLLOWER_MIN_BATCH`` = 16 to
  ``--batch``, a lease and one checkpoint per batch);
* **pyeventsourcing follower** (the baseline) — pyeventsourcing's own follower
  on the same engine: a ``ProcessApplication`` with a no-op policy following
  an upstream ``Application`` that holds as many stored events (one new
  aggregate each), caught up by ``pull_and_process`` (sections of
  ``--batch``: the upstream's ``log_section_size`` and the follower's
  ``pull_section_size``), timed from the first pull to the last event
  processed; each event is decoded and recorded with its tracking record (its
  checkpoint: one transaction per event, as pyeventsourcing does). POPO
  (``eventsourcing.popo``) for the in_memory row, ``eventsourcing.sqlite``
  (the upstream and each follower on new files) and ``eventsourcing.postgres``
  (a new database, dropped; a follower's tables per run);
* **pyeventsourcing bare reads** — the upstream's application recorder read
  in pages of ``--batch`` (``select_notifications``: no decoding, no
  tracking), the floor of its follower.

Engines: in_memory; the mongo backend on the embedded engine (mongomock, in
this process: *not* a server figure; ``--embedded-mongo-streams``, 2,000 by
default, as its inserts slow down with the collection's size) and, when ``WOW_TEST_MONGO_URI`` is set,
on that server (a new database, dropped); the django backend on SQLite and
PostgreSQL. Each figure is the best of ``--repeat`` runs.

**Live** (``--live N``, 0: skipped): N one-stream appends, one every
``--interval-ms``, each stamped with ``time.time()`` in its header just
before the append; the follower's handler takes ``time.time()`` when it gets
the stream. Per row, ``WARMUP`` unmeasured streams first, handled before the
measured ones start. The follower runs

* in **another OS process** (this script with ``--child``, a FollowerRunner
  as ``wow_follow`` runs one): it sees other processes' appends by polling,
  10 ms doubling to ``FOLLOWER_MAX_WAIT_S`` (``--max-wait-s``) while reads
  find nothing — on SQLite both processes share one WAL file, on PostgreSQL
  one new database;
* as a **thread** of the appending process, where the store's
  ``AppendNotifier`` wakes it at each append.

Each with ``CONN_MAX_AGE`` 0 (Django's default; the runner closes obsolete
connections around each cycle as Django does around a request, so the
follower reconnects at every poll) and None (kept open), ``--conn-max-age``.

SQLite files are new and removed, the PostgreSQL databases are created and
dropped (``WOW_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``,
default 127.0.0.1:5432 postgres), the follower process is killed, also on
an error or SIGTERM.

    python bench/bench_followers.py --streams 20000 --batch 1000
    python bench/bench_followers.py --streams 0 --live 1000 --interval-ms 5 20
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_django_store import PG, admin_connection  # noqa: E402
from eventsourcing.domain import Aggregate  # noqa: E402  (the bench extra)

# Figures (one run each, this machine, shared with other work: the live percentiles are noisy).
# Catch-up (2026-12-02):
#   python bench/bench_followers.py --streams 20000 --batch 1000
#   (3 min 20 s)
#
#   # catch-up: 20000 streams of one event in one context (pyeventsourcing: 20000 aggregates of one event), pages of 1000, best of 3; Python 3.11.7, eventsourcing 9.5.6
#   engine                                     pyeventsourcing bare reads/s   feed reads/s pyeventsourcing follower/s   follower/s follower x bare reads follower x follower baseline
#   in_memory                                                       342,550    192,270,717                     40,733      387,270                  1.13                         9.51
#   mongo backend, embedded engine* (2,000)                               -         11,161                          -        4,285                     -                            -
#   django backend, SQLite                                           81,496         30,516                      2,136       28,498                  0.35                        13.34
#   django backend, PostgreSQL                                      187,325         26,720                        955       19,793                  0.11                        20.72
#   # * mongomock in this process (the test suite's embedded engine), not a MongoDB server figure; (N): the streams it holds (--embedded-mongo-streams); set WOW_TEST_MONGO_URI for a server row
#   # pyeventsourcing follower: ProcessApplication (no-op policy) following an upstream Application by pull_and_process, one tracking record per event; in_memory compares against POPO
#
#   python bench/bench_followers.py --streams 100000 --batch 1000
#   (10 min 37 s)
#
#   # catch-up: 100000 streams of one event in one context (pyeventsourcing: 100000 aggregates of one event), pages of 1000, best of 3; Python 3.11.7, eventsourcing 9.5.6
#   engine                                     pyeventsourcing bare reads/s   feed reads/s pyeventsourcing follower/s   follower/s follower x bare reads follower x follower baseline
#   in_memory                                                       702,155    161,944,893                     75,062      732,334                  1.04                         9.76
#   mongo backend, embedded engine* (2,000)                               -         18,905                          -        8,202                     -                            -
#   django backend, SQLite                                          183,454         49,880                      2,515       21,488                  0.12                         8.54
#   django backend, PostgreSQL                                      255,966         16,929                        945       14,491                  0.06                        15.33
#   # * mongomock in this process (the test suite's embedded engine), not a MongoDB server figure; (N): the streams it holds (--embedded-mongo-streams); set WOW_TEST_MONGO_URI for a server row
#   # pyeventsourcing follower: ProcessApplication (no-op policy) following an upstream Application by pull_and_process, one tracking record per event; in_memory compares against POPO
#
# Live (2026-12-01; the catch-up table of that run, against bare reads only, is replaced by the one above):
#   python bench/bench_followers.py --streams 20000 --batch 1000 --live 1000 --interval-ms 5 20
#   (4 min 54 s)
#
#   # live: 1000 appends of one stream per row after 10 unmeasured; append -> handler latency (ms) from just before the append to the handler; FOLLOWER_MIN_BATCH=16, FOLLOWER_MAX_WAIT_S=1.0 (a live follower polls after 10 ms doubling to it unless its process's append wakes it)
#   engine                               CONN_MAX_AGE follower  append p50      p50      p90      p99      max
#   # one append every 5 ms
#   in_memory                                       - thread          0.04     0.23     0.47     3.55     7.51
#   django backend, SQLite (WAL file)               0 process         1.19    12.44    22.65    64.06   101.94
#   django backend, SQLite (WAL file)               0 thread          0.88     2.78     9.24    30.36    42.93
#   django backend, SQLite (WAL file)            None process         2.04    14.89    46.03   106.64   135.03
#   django backend, SQLite (WAL file)            None thread          3.69     7.23    21.53    29.46    96.37
#   django backend, PostgreSQL                      0 process         3.77    26.43    44.69    57.42    66.59
#   django backend, PostgreSQL                      0 thread          3.92    17.36    29.93    38.64    50.15
#   django backend, PostgreSQL                   None process         3.85    17.20    28.71    36.44    52.04
#   django backend, PostgreSQL                   None thread          3.96     9.93    17.69    24.09    28.50
#   # one append every 20 ms
#   in_memory                                       - thread          0.07     0.36     0.48     2.07     2.89
#   django backend, SQLite (WAL file)               0 process         1.43    14.08    25.30    37.05    59.00
#   django backend, SQLite (WAL file)               0 thread          1.56     4.00     8.66    27.56    72.60
#   django backend, SQLite (WAL file)            None process         1.66    12.62    22.52    26.83    38.82
#   django backend, SQLite (WAL file)            None thread          1.24     3.10     6.17    27.88   175.72
#   django backend, PostgreSQL                      0 process         3.01    18.02    31.25    45.97    82.51
#   django backend, PostgreSQL                      0 thread          4.50    18.50    50.73    92.85   152.33
#   django backend, PostgreSQL                   None process         2.99    12.40    26.09    32.52    56.93
#   django backend, PostgreSQL                   None thread          3.76     6.56    11.96    21.30    82.90
#
# Sparse appends: the idle follower's backoff sets the cross-process latency (each run 3 min 36 s):
#   python bench/bench_followers.py --streams 0 --live 200 --interval-ms 200 --conn-max-age none
#
#   # live: 200 appends of one stream per row after 10 unmeasured; append -> handler latency (ms) from just before the append to the handler; FOLLOWER_MIN_BATCH=16, FOLLOWER_MAX_WAIT_S=1.0 (a live follower polls after 10 ms doubling to it unless its process's append wakes it)
#   engine                               CONN_MAX_AGE follower  append p50      p50      p90      p99      max
#   # one append every 200 ms
#   in_memory                                       - thread          0.07     0.42     2.03    10.07    46.89
#   django backend, SQLite (WAL file)            None process         3.40    43.03   157.46   167.97   169.18
#   django backend, SQLite (WAL file)            None thread          5.06     9.30    15.60    39.46    42.64
#   django backend, PostgreSQL                   None process         3.54    42.46   161.06   167.49   178.81
#   django backend, PostgreSQL                   None thread          2.61     5.89    19.04    29.60    32.75
#
#   python bench/bench_followers.py --streams 0 --live 200 --interval-ms 200 --conn-max-age none --max-wait-s 0.05
#
#   # live: 200 appends of one stream per row after 10 unmeasured; append -> handler latency (ms) from just before the append to the handler; FOLLOWER_MIN_BATCH=16, FOLLOWER_MAX_WAIT_S=0.05 (a live follower polls after 10 ms doubling to it unless its process's append wakes it)
#   engine                               CONN_MAX_AGE follower  append p50      p50      p90      p99      max
#   # one append every 200 ms
#   in_memory                                       - thread          0.08     0.48     0.56     0.70     2.93
#   django backend, SQLite (WAL file)            None process         1.67    32.13    51.63    56.13    95.51
#   django backend, SQLite (WAL file)            None thread          1.93     4.50     9.89    18.61    49.97
#   django backend, PostgreSQL                   None process         2.65    33.59    56.34    84.77   116.94
#   django backend, PostgreSQL                   None thread          2.01     4.30     5.09     7.69    10.32
#
# Read: a follower in another process polls (10 ms, doubling while idle, to FOLLOWER_MAX_WAIT_S), so its
# latency is up to a poll period plus a read, where a thread is woken at once by its process's append; with
# CONN_MAX_AGE 0 (Django's default) the runner reconnects at every cycle, which adds a connection
# (~10 ms on PostgreSQL here) to each figure. Catch-up against pyeventsourcing's own follower (issue 10's
# baseline, goal >= 1.0x): 20,000 streams: 9.5x on in_memory (POPO), 13x on SQLite, 21x on PostgreSQL;
# 100,000 (issue 10's size): 9.8x, 8.5x, 15x: met. pyeventsourcing's follower decodes each event and writes
# its tracking record in one transaction per event, where ours checkpoints once per batch; against its bare
# notification reads (no decoding, no tracking: a floor no follower reaches) ours is 0.06-0.35x on the
# databases.

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


def bench_bare_reads(recorder, count: int, batch: int) -> float:
    started, start, seen = time.perf_counter(), 1, 0
    while True:
        notifications = recorder.select_notifications(start, batch)
        if not notifications:
            break
        seen += len(notifications)
        start = notifications[-1].id + 1
    assert seen == count, (seen, count)
    return seen / (time.perf_counter() - started)


class BenchThing(Aggregate):
    """The upstream's aggregates: one ``BenchThing.Created`` event each (the payload of ``make_stream``'s event)."""

    def __init__(self, n: int, i: int, text: str):
        self.n, self.i, self.text = n, i, text


def es_upstream(env: dict, count: int, batch: int):
    """pyeventsourcing's upstream ``Application`` on ``env``, holding ``count`` events (one new aggregate each),
    its notification log in sections of ``batch``."""
    from eventsourcing.application import Application

    class BenchUpstream(Application):
        name = "BenchUpstream"
        log_section_size = batch

    upstream = BenchUpstream(env=env)
    for start in range(0, count, 500):
        upstream.save(*(BenchThing(1, 0, "event 0 of v1") for _ in range(min(500, count - start))))
    return upstream


def bench_es_follower(upstream, env: dict, name: str, count: int, batch: int) -> float:
    """pyeventsourcing's follower (a new ``ProcessApplication`` ``name`` on ``env``, a no-op policy) catching
    up over ``upstream``'s notification log by ``pull_and_process``: events/s from the first pull to the last
    event processed (each decoded and recorded with its tracking record)."""
    from eventsourcing.system import ProcessApplication

    handled = [0]

    class BenchFollower(ProcessApplication):
        pull_section_size = batch

        def policy(self, domain_event, processing_event) -> None:
            handled[0] += 1

    BenchFollower.name = name
    follower = BenchFollower(env=env)
    try:
        follower.follow(upstream.name, upstream.notification_log)
        started = time.perf_counter()
        follower.pull_and_process(upstream.name)
        elapsed = time.perf_counter() - started
        assert handled[0] == count, (handled[0], count)
        assert follower.recorder.max_tracking_id(upstream.name) == upstream.recorder.max_notification_id()
    finally:
        follower.close()
    return count / elapsed


# --- live latency ------------------------------------------------------------------------------------

#: Streams appended (and waited for) before the measured ones: connections opened, the follower's backoff reset.
WARMUP = 10


class LatencyRecorder:
    """A follower's handler: for each measured stream, handling time minus the ``sent`` time in its header."""

    def __init__(self, expected: int):
        self.expected = expected
        self.latencies: list[float] = []
        self.seen = 0
        self.done = threading.Event()  # also the runner's stop event

    def __call__(self, item) -> None:
        now = time.time()
        header = item.stream.header
        self.seen += 1
        if not header.get("warmup"):
            self.latencies.append(now - header["sent"])
        if self.seen >= self.expected:
            self.done.set()


def live_runner(name: str, recorder: LatencyRecorder, feed, follower_store):
    """A runner with this process's WOW settings (``FOLLOWER_MAX_WAIT_S`` & co.), as ``wow_follow`` builds one."""
    from wow_django.application.followers import Follower, FollowerRunner

    return FollowerRunner(Follower(name, recorder), feed, follower_store)


def database_spec(engine: str, name: str, conn_max_age: float | None = 0) -> dict:
    """A DATABASES entry; ``conn_max_age`` as Django's ``CONN_MAX_AGE`` (0, its default: closed around each
    request, which a follower runner does around each cycle; None: kept open)."""
    if engine == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "CONN_MAX_AGE": conn_max_age}
    return {"ENGINE": "django.db.backends.postgresql", "NAME": name, "CONN_MAX_AGE": conn_max_age, **PG}


def configure(databases: dict, max_wait_s: float | None) -> None:
    import django
    from django.conf import settings

    wow = {"STORAGE": "in_memory"}
    if max_wait_s is not None:
        wow["FOLLOWER_MAX_WAIT_S"] = max_wait_s
    settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
                                  **databases}, INSTALLED_APPS=["wow_django"], USE_TZ=True, WOW=wow)
    django.setup()


def child_main(args) -> None:
    """The follower process of a cross-process row: prints ``ready`` once it holds the lease, then, once
    ``--child-count`` streams are handled (or ``--child-timeout`` s passed), the latencies as JSON."""
    engine, db = args.child
    configure({"live": database_spec(engine, db, args.child_conn_max_age)}, args.max_wait_s)
    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed

    recorder = LatencyRecorder(args.child_count)
    runner = live_runner(args.child_name, recorder, DjangoStreamFeed(DjangoEventStore(using="live"),
                                                                     args.child_context),
                         DjangoFollowerStore(using="live"))
    runner.run_once()  # takes the lease
    print("ready", flush=True)
    timer = threading.Timer(args.child_timeout, recorder.done.set)
    timer.daemon = True
    timer.start()
    runner.run(recorder.done)
    print(json.dumps({"seen": recorder.seen, "latencies": recorder.latencies}), flush=True)


def append_live(store, context: str, count: int, interval_s: float, *, warmup: bool = False) -> list[float]:
    """Append ``count`` one-event streams, one every ``interval_s``, each stamped ``sent`` just before its
    append; the append durations."""
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_stream

    durations = []
    next_at = time.perf_counter()
    for _ in range(count):
        header = {"sent": time.time(), "warmup": warmup}
        stream = make_stream(AggregateId("order", uuid.uuid4().hex, context, "t"), 1, header=header)
        started = time.perf_counter()
        results = store.append_many([stream])
        durations.append(time.perf_counter() - started)
        assert not any(results), results
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return durations


def wait_position(follower_store, name: str, position: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = follower_store.get(name)
        if state is not None and state.position >= position:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"follower {name!r} did not reach position {position} in {timeout}s")
        time.sleep(0.005)


def live_thread(store, feed, follower_store, count: int, interval_s: float):
    """The follower as a thread of the appending process (woken by the store's AppendNotifier)."""
    context, name = feed.context_name, f"live-{uuid.uuid4().hex[:8]}"
    recorder = LatencyRecorder(WARMUP + count)
    runner = live_runner(name, recorder, feed, follower_store)
    ready = threading.Event()

    def run():
        try:
            runner.run_once()
        finally:
            ready.set()
        runner.run(recorder.done)

    thread = threading.Thread(target=run, name="bench-live-follower", daemon=True)
    thread.start()
    try:
        ready.wait(30)
        append_live(store, context, WARMUP, interval_s, warmup=True)
        wait_position(follower_store, name, feed.head())
        durations = append_live(store, context, count, interval_s)
        recorder.done.wait(count * interval_s + 30)
    finally:
        recorder.done.set()
        runner.wake()
        thread.join(10)
    return recorder.latencies, durations


def live_process(engine: str, db: str, age: float | None, store, follower_store, count: int, interval_s: float, max_wait_s):
    """The follower in another OS process (this script with ``--child``), polling with its backoff."""
    context, name = f"live-{uuid.uuid4().hex[:8]}", f"live-{uuid.uuid4().hex[:8]}"
    timeout = count * interval_s + 60
    command = [sys.executable, os.path.abspath(__file__), "--child", engine, db, "--child-name", name,
               "--child-context", context, "--child-count", str(WARMUP + count), "--child-timeout", str(timeout),
               "--child-conn-max-age", str(age)]
    if max_wait_s is not None:
        command += ["--max-wait-s", str(max_wait_s)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        if not ready or child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the follower process did not start (exit code {child.poll()})")
        append_live(store, context, WARMUP, interval_s, warmup=True)
        from wow_django.backends.django.followers import DjangoStreamFeed

        wait_position(follower_store, name, DjangoStreamFeed(store, context).head())
        durations = append_live(store, context, count, interval_s)
        out, _ = child.communicate(timeout=timeout + 30)
        if child.returncode:
            raise RuntimeError(f"the follower process failed (exit code {child.returncode})")
        found = json.loads(out.strip().splitlines()[-1])
        return found["latencies"], durations
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def live_line(name: str, age: str, where: str, count: int, latencies: list[float], durations: list[float]) -> str:
    ms = [v * 1000 for v in latencies]
    missing = f" ({count - len(ms)} not handled)" if len(ms) < count else ""
    return (f"{name:<36} {age:>12} {where:<9} {percentile([d * 1000 for d in durations], 0.5):10.2f} "
            f"{percentile(ms, 0.5):8.2f} {percentile(ms, 0.9):8.2f} {percentile(ms, 0.99):8.2f} "
            f"{max(ms):8.2f}{missing}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20_000, help="catch-up: streams stored (0: no catch-up table)")
    parser.add_argument("--embedded-mongo-streams", type=int, default=2_000, metavar="N",
                        help="catch-up: streams on the embedded MongoDB engine (at most --streams; mongomock's "
                             "inserts slow down with the collection's size: 4,000 take minutes)")
    parser.add_argument("--batch", type=int, default=1_000, help="page size / FOLLOWER_MAX_BATCH")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    parser.add_argument("--live", type=int, default=0, metavar="N",
                        help="live latency: N paced appends per row (0: no live table)")
    parser.add_argument("--interval-ms", type=float, nargs="+", default=[5.0],
                        help="live: time between two appends (several values: a block of rows each)")
    parser.add_argument("--conn-max-age", type=conn_max_age, nargs="+", default=[0, None], metavar="S|none",
                        help="live: the databases' CONN_MAX_AGE (several values: rows each; default: 0 none)")
    parser.add_argument("--max-wait-s", type=float, default=None,
                        help="live: WOW FOLLOWER_MAX_WAIT_S of the followers (default: the setting's default)")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "DB"), help=argparse.SUPPRESS)
    parser.add_argument("--child-name", help=argparse.SUPPRESS)
    parser.add_argument("--child-context", help=argparse.SUPPRESS)
    parser.add_argument("--child-count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-timeout", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--child-conn-max-age", type=conn_max_age, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    n = args.streams
    sys.stdout.reconfigure(line_buffering=True)  # rows show as they come, also through a pipe
    # SIGTERM (a CI timeout, kill) leaves through the finally below: child, databases and files cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    directory = tempfile.mkdtemp(prefix="wow-bench-followers-")
    pg_names = [f"wow_bench_f_{os.getpid()}_{i}" for i in range(3)]
    created: list[str] = []
    upstreams: list = []
    mongo_cleanups: list = []
    try:
        with admin_connection() as admin:
            for name in pg_names:
                admin.execute(f'CREATE DATABASE "{name}"')
                created.append(name)
        live_dbs = {"sqlite": os.path.join(directory, "live.sqlite3"), "pg": pg_names[2]}
        targets = [(f"{engine}_live_{i}", engine, db, age)
                   for engine, db in live_dbs.items() for i, age in enumerate(args.conn_max_age)]
        configure({
            "sqlite": database_spec("sqlite", os.path.join(directory, "wow.sqlite3")),
            "pg": database_spec("pg", pg_names[0]),
            **{alias: database_spec(engine, db, age) for alias, engine, db, age in targets},
        }, args.max_wait_s)
        if n:
            upstreams = catch_up(args, directory, pg_names, mongo_cleanups)
        if args.live:
            live(args, targets)
    finally:
        for cleanup in reversed(mongo_cleanups):
            cleanup()
        for upstream in upstreams:
            upstream.close()
        from django.conf import settings

        if settings.configured:
            from django.db import connections

            connections.close_all()
        with admin_connection() as admin:
            for name in created:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(directory, ignore_errors=True)


def catch_up(args, directory: str, pg_names: list[str], mongo_cleanups: list):
    """Print the catch-up table; pyeventsourcing's upstream applications to close."""
    n, batch = args.streams, args.batch
    from django.core.management import call_command

    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed
    from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
    from wow_django.backends.memory.stores import InMemoryEventStore

    rows = []
    memory = InMemoryEventStore()
    fill(memory, "bench", n)
    rows.append(("in_memory", InMemoryStreamFeed(memory, "bench"), InMemoryFollowerStore(), "popo"))
    embedded = min(n, args.embedded_mongo_streams)
    rows.append(mongo_row(f"mongo backend, embedded engine* ({embedded:,})", "mongomock://localhost/wow_bench",
                          embedded, mongo_cleanups))
    if os.environ.get(REAL_MONGO_ENV):
        rows.append(mongo_row("mongo backend, server", os.environ[REAL_MONGO_ENV], n, mongo_cleanups))
    for alias in ("sqlite", "pg"):
        call_command("migrate", "wow_django", database=alias, verbosity=0)
        store = DjangoEventStore(using=alias)
        fill(store, "bench", n)
        rows.append((f"django backend, {'SQLite' if alias == 'sqlite' else 'PostgreSQL'}",
                     DjangoStreamFeed(store, "bench"), DjangoFollowerStore(using=alias), alias))

    # pyeventsourcing: per engine, the upstream's env and a follower's env for run ``i`` (a new SQLite file;
    # on PostgreSQL the follower's tables are named after it).
    envs = {
        "popo": ({"PERSISTENCE_MODULE": "eventsourcing.popo"}, lambda i: {"PERSISTENCE_MODULE": "eventsourcing.popo"}),
        "sqlite": ({"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                    "SQLITE_DBNAME": os.path.join(directory, "es_upstream.sqlite3")},
                   lambda i: {"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                              "SQLITE_DBNAME": os.path.join(directory, f"es_follower_{i}.sqlite3")}),
    }
    try:
        import eventsourcing.postgres  # noqa: F401
    except ImportError:
        print("# pyeventsourcing's PostgreSQL persistence needs psycopg_pool: its baselines are skipped")
    else:
        pg_env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": pg_names[1],
                  "POSTGRES_HOST": PG["HOST"], "POSTGRES_PORT": PG["PORT"], "POSTGRES_USER": PG["USER"],
                  "POSTGRES_PASSWORD": PG["PASSWORD"]}
        envs["pg"] = (pg_env, lambda i: pg_env)
    upstreams = {}
    for key, (env, _) in envs.items():
        upstreams[key] = es_upstream(env, n, batch)

    print(f"# catch-up: {n} streams of one event in one context (pyeventsourcing: {n} aggregates of one event), "
          f"pages of {batch}, best of {args.repeat}; Python {sys.version.split()[0]}, "
          f"eventsourcing {es_version()}")
    print(f"{'engine':<42} {'pyeventsourcing bare reads/s':>28} {'feed reads/s':>14} "
          f"{'pyeventsourcing follower/s':>26} {'follower/s':>12} {'follower x bare reads':>21} "
          f"{'follower x follower baseline':>28}")
    for name, feed, follower_store, key in rows:
        upstream = upstreams.get(key) if key else None
        if upstream is not None:
            follower_env = envs[key][1]
            es_follows = max(bench_es_follower(upstream, follower_env(i), f"BenchFollower{i}", n, batch)
                             for i in range(args.repeat))
            bare = max(bench_bare_reads(upstream.recorder, n, batch) for _ in range(args.repeat))
        else:
            es_follows = bare = None
        reads = max(bench_reads(feed, batch) for _ in range(args.repeat))
        follows = max(bench_follower(feed, follower_store, batch) for _ in range(args.repeat))

        def cell(value, width, fmt):
            return f"{value:{width}{fmt}}" if value else f"{'-':>{width}}"

        print(f"{name:<42} {cell(bare, 28, ',.0f')} {reads:14,.0f} {cell(es_follows, 26, ',.0f')} "
              f"{follows:12,.0f} {cell(bare and follows / bare, 21, '.2f')} "
              f"{cell(es_follows and follows / es_follows, 28, '.2f')}")
    print("# * mongomock in this process (the test suite's embedded engine), not a MongoDB server figure; "
          "(N): the streams it holds (--embedded-mongo-streams)"
          + ("" if os.environ.get(REAL_MONGO_ENV) else f"; set {REAL_MONGO_ENV} for a server row"))
    print("# pyeventsourcing follower: ProcessApplication (no-op policy) following an upstream Application by "
          "pull_and_process, one tracking record per event; in_memory compares against POPO")
    return list(upstreams.values())


def es_version() -> str:
    from importlib.metadata import version

    return version("eventsourcing")


def conn_max_age(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def live(args, targets: list[tuple[str, str, str, float | None]]) -> None:
    """Print the live latency table: in-process rows, then each database with the follower in another process
    and as a thread of the appending one."""
    from django.core.management import call_command

    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed
    from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
    from wow_django.backends.memory.stores import InMemoryEventStore
    from wow_django.conf import wow_settings

    count = args.live
    for alias, *_ in targets:
        call_command("migrate", "wow_django", database=alias, verbosity=0)
    print(f"# live: {count} appends of one stream per row after {WARMUP} unmeasured; append -> handler "
          f"latency (ms) from just before the append to the handler; FOLLOWER_MIN_BATCH="
          f"{wow_settings.FOLLOWER_MIN_BATCH}, FOLLOWER_MAX_WAIT_S={wow_settings.FOLLOWER_MAX_WAIT_S} "
          f"(a live follower polls after 10 ms doubling to it unless its process's append wakes it)")
    print(f"{'engine':<36} {'CONN_MAX_AGE':>12} {'follower':<9} {'append p50':>10} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for interval_ms in args.interval_ms:
        interval_s = interval_ms / 1000
        print(f"# one append every {interval_ms:g} ms")
        memory = InMemoryEventStore()
        latencies, durations = live_thread(memory, InMemoryStreamFeed(memory, f"live-{uuid.uuid4().hex[:8]}"),
                                           InMemoryFollowerStore(), count, interval_s)
        print(live_line("in_memory", "-", "thread", count, latencies, durations), flush=True)
        for alias, engine, db, age in targets:
            name = f"django backend, {'SQLite (WAL file)' if engine == 'sqlite' else 'PostgreSQL'}"
            store, follower_store = DjangoEventStore(using=alias), DjangoFollowerStore(using=alias)
            latencies, durations = live_process(engine, db, age, store, follower_store, count, interval_s,
                                                args.max_wait_s)
            print(live_line(name, str(age), "process", count, latencies, durations), flush=True)
            feed = DjangoStreamFeed(store, f"live-{uuid.uuid4().hex[:8]}")
            latencies, durations = live_thread(store, feed, follower_store, count, interval_s)
            print(live_line(name, str(age), "thread", count, latencies, durations), flush=True)


if __name__ == "__main__":
    main()

"""Event-store throughput of the django backend: appends/s and loads/s on SQLite and PostgreSQL.

Same work as ``bench_store.py``: ``--aggregates`` aggregates × ``--versions``
appends each (one event per append, one call per append) over ``--threads``
threads, then five full loads per aggregate. Each row runs on fresh tables:
a new SQLite file (WAL) and a new PostgreSQL database that is dropped
afterwards; each row is the best of ``--repeat`` runs on its tables, the
runs interleaved (every row once, then again). Batching is shown off, with
the default 1 ms window and with a 0 ms window. The baselines are pyeventsourcing's SQLite and PostgreSQL aggregate recorders
doing the same work (the PostgreSQL one needs ``psycopg_pool``, which the
``bench`` extra brings; its row is skipped without it); ``x base`` is a row's
figure over its engine's baseline. For comparison only, pyeventsourcing's
*application* recorders run too: they give each event a notification id in
commit order (PostgreSQL: ``LOCK TABLE … IN EXCLUSIVE MODE`` per insert), the
guarantee our positions have (one lock per context until commit).

Floor rows: the event store's own insert and select sent straight through the driver (sqlite3, psycopg)
from the same threads, with no Python layer of ours and no Django: what the schema allows at best. On
PostgreSQL once with the context's lock (the append's statement as it is) and once without it (positions
then commit in any order): the lock's price.

A second table runs the default rows (ours with batching off, the baselines) again from ``--processes``
processes (default 2, spawned) x ``--threads`` threads at once, the aggregates shared out between them:
each phase is timed from the first process's start to the last one's end. It shows what the GIL of one
process hides, and what several processes writing one SQLite file cost.

Round trips: after the timed runs, each row appends and loads a few more
aggregates in one thread while this process counts what it sends to the
database: every statement psycopg sends (each cursor execute, and the BEGIN,
COMMIT and ROLLBACK it issues itself; preparing a statement costs one more,
once per connection, which a warm-up pays before the count) and every statement SQLite runs (its trace callback: BEGIN,
COMMIT and PRAGMAs included; in process, but each a call into the library).
The ``trips`` columns are those counts per append and per load. The summary
at the end gives, per engine, the rows with the default settings (batching
off) against the baseline.

One thread: after the round trips, the default rows and the baselines append and load a few more aggregates in
one thread, timed with ``time.process_time()`` and ``time.perf_counter()``: the CPU this process spends per
append and per load (the database server's is not in it; SQLite runs in the process, so its statement is) and
the latency of each. With no threads queueing for the GIL or the cores, these move less between runs than the
throughput figures (10–30 % on a shared 2-core machine): the figures to profile and compare changes by.

The bench exits with status 1 when a run is malformed (a thread failed, a
load found the wrong number of streams, a count is off), never because a
figure is low.

Like for like: on SQLite both sides use WAL and SQLite's default
``synchronous`` (FULL), both commit each append. On PostgreSQL both commit each
append (``synchronous_commit`` as the server says); pyeventsourcing sends
prepared statements, while Django by default sends every statement unprepared
(``prepare_threshold`` None, client-side binding), so one more django row runs
with ``OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}``: the
same statements, prepared by psycopg from the fifth use (a project's choice:
not safe behind PgBouncer in transaction mode without prepared-statement support).

    python bench/bench_django_store.py
    python bench/bench_django_store.py --aggregates 500 --versions 10 --threads 8

PostgreSQL: ``WOW_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``
(default 127.0.0.1:5432, user postgres, no password). Needs the ``bench`` and
``test`` extras.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_store import bench_baseline, bench_ours  # noqa: E402  (the same work as bench_store.py)

PG = {
    "HOST": os.environ.get("WOW_BENCH_PG_HOST", "127.0.0.1"),
    "PORT": os.environ.get("WOW_BENCH_PG_PORT", "5432"),
    "USER": os.environ.get("WOW_BENCH_PG_USER", "postgres"),
    "PASSWORD": os.environ.get("WOW_BENCH_PG_PASSWORD", ""),
}


def admin_connection():
    import psycopg

    return psycopg.connect(host=PG["HOST"], port=PG["PORT"], user=PG["USER"], password=PG["PASSWORD"] or None,
                           dbname="postgres", autocommit=True)


BATCHING = ("off", "on 1ms", "on 0ms")


class MalformedRun(Exception):
    """A run that did not do the work it measures."""


class RoundTrips:
    """Counts what this process sends to a database while :attr:`on` (see the module docstring)."""

    def __init__(self) -> None:
        self.on = False
        self.count = 0
        self._lock = threading.Lock()

    def hit(self, *args) -> None:
        if self.on:
            with self._lock:
                self.count += 1

    def install(self) -> None:
        """Wrap the drivers: SQLite connections get the trace callback, psycopg's senders count."""
        import psycopg
        from psycopg._connection_base import BaseConnection

        connect = sqlite3.connect

        def traced_connect(*args, **kwargs):
            raw = connect(*args, **kwargs)
            raw.set_trace_callback(self.hit)
            return raw

        sqlite3.connect = sqlite3.dbapi2.connect = traced_connect

        def counted(method):
            def wrapper(*args, **kwargs):
                self.hit()
                return method(*args, **kwargs)
            return wrapper

        psycopg.Cursor.execute = counted(psycopg.Cursor.execute)
        psycopg.Cursor.executemany = counted(psycopg.Cursor.executemany)
        BaseConnection._exec_command = counted(BaseConnection._exec_command)

    def per_operation(self, operation, items) -> float:
        """Statements sent per call of ``operation`` over ``items`` (one thread)."""
        self.count = 0
        self.on = True
        try:
            for item in items:
                operation(item)
        finally:
            self.on = False
        return self.count / len(items)


TRIPS = RoundTrips()
TRIP_AGGREGATES = 10


def trips_ours(store, versions: int) -> tuple[float, float]:
    """Round trips per append and per load of ``store`` (a few aggregates after a warm-up, one thread)."""
    from wow_django.persistence.records import AggregateId
    from wow_django.testing.event_store import make_stream

    ids = [AggregateId("order", uuid.uuid4().hex) for _ in range(TRIP_AGGREGATES + 1)]
    for v in range(1, versions + 1):  # warm-up: the connection, its prepared statements
        store.append(make_stream(ids[0], v))
    store.load(ids[0])
    streams = [make_stream(agg, v) for agg in ids[1:] for v in range(1, versions + 1)]
    appends = TRIPS.per_operation(store.append, streams)
    found: list[int] = []
    loads = TRIPS.per_operation(lambda agg: found.append(len(store.load(agg))), ids[1:])
    store.close()
    if found != [versions] * TRIP_AGGREGATES:
        raise MalformedRun(f"a load found {found}, not {versions} streams per aggregate")
    return appends, loads


def trips_baseline(recorder, versions: int) -> tuple[float, float]:
    """Round trips per insert and per select of a pyeventsourcing recorder, as :func:`trips_ours`."""
    import json

    from eventsourcing.persistence import StoredEvent

    ids = [uuid.uuid4() for _ in range(TRIP_AGGREGATES + 1)]

    def event(agg, v):
        return StoredEvent(originator_id=agg, originator_version=v, topic="tests:ThingHappened",
                           state=json.dumps({"n": v, "i": 0, "text": f"event 0 of v{v}"}).encode())

    for v in range(1, versions + 1):
        recorder.insert_events([event(ids[0], v)])
    recorder.select_events(ids[0])
    events = [event(agg, v) for agg in ids[1:] for v in range(1, versions + 1)]
    appends = TRIPS.per_operation(lambda e: recorder.insert_events([e]), events)
    found: list[int] = []
    loads = TRIPS.per_operation(lambda agg: found.append(len(recorder.select_events(agg))), ids[1:])
    if found != [versions] * TRIP_AGGREGATES:
        raise MalformedRun(f"a select found {found}, not {versions} events per aggregate")
    return appends, loads


CPU_AGGREGATES = 40


def cpu_per_operation(append, load, new_id, event, versions: int) -> tuple[float, float, float, float]:
    """Microseconds of this process's CPU per ``append`` and per ``load`` in one thread (after a warm-up), and of
    wall-clock time (the latency: the client's CPU, the round trip and the server's work)."""
    from bench_store import LOAD_ROUNDS

    ids = [new_id() for _ in range(CPU_AGGREGATES + 1)]
    for v in range(1, versions + 1):
        append(event(ids[0], v))
    load(ids[0])
    items = [event(agg, v) for agg in ids[1:] for v in range(1, versions + 1)]
    started, wall_started = time.process_time(), time.perf_counter()
    for item in items:
        append(item)
    appended, wall_appended = time.process_time(), time.perf_counter()
    for _ in range(LOAD_ROUNDS):
        for agg in ids[1:]:
            if len(load(agg)) != versions:
                raise MalformedRun(f"a load found the wrong number of streams (CPU run of {append!r})")
    loaded, wall_loaded = time.process_time(), time.perf_counter()
    loads = LOAD_ROUNDS * CPU_AGGREGATES
    return ((appended - started) / len(items) * 1e6, (loaded - appended) / loads * 1e6,
            (wall_appended - wall_started) / len(items) * 1e6, (wall_loaded - wall_appended) / loads * 1e6)


def cpu_ours(store, versions: int) -> tuple[float, float, float, float]:
    from wow_django.persistence.records import AggregateId
    from wow_django.testing.event_store import make_stream

    try:
        return cpu_per_operation(store.append, store.load, lambda: AggregateId("order", uuid.uuid4().hex),
                                 make_stream, versions)
    finally:
        store.close()


def cpu_baseline(recorder, versions: int) -> tuple[float, float, float, float]:
    import json

    from eventsourcing.persistence import StoredEvent

    def event(agg, v):
        return StoredEvent(originator_id=agg, originator_version=v, topic="tests:ThingHappened",
                           state=json.dumps({"n": v, "i": 0, "text": f"event 0 of v{v}"}).encode())

    return cpu_per_operation(lambda e: recorder.insert_events([e]), recorder.select_events, uuid.uuid4, event,
                             versions)


def django_store(alias: str, batching: str):
    """A DjangoEventStore on the migrated, empty tables of ``alias``."""
    from django.core.management import call_command

    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.persistence.batching import BatchingEventStore

    call_command("migrate", "wow_django", database=alias, verbosity=0)
    store = DjangoEventStore(using=alias)
    if batching == "on 1ms":
        return BatchingEventStore(store)
    if batching == "on 0ms":
        return BatchingEventStore(store, max_delay_ms=0)
    return store


def bench_floor(alias: str, aggregates: int, versions: int, threads: int, *, locked: bool = True) -> tuple[float, float]:
    """Our own statements sent straight through the driver (no Python layer of ours, no Django): appends/s of
    the event store's insert and loads/s of its select, on the migrated tables of ``alias``; what the
    django backend could reach at best with its schema. ``locked=False`` (PostgreSQL) leaves out the
    context's lock that makes positions commit in order."""
    import psycopg
    from bench_store import run_threads, split
    from django.core.management import call_command
    from django.db import connections

    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.persistence.records import AggregateId
    from wow_django.testing.event_store import make_stream

    call_command("migrate", "wow_django", database=alias, verbosity=0)
    store = DjangoEventStore(using=alias)
    ids = [AggregateId("order", uuid.uuid4().hex) for _ in range(aggregates)]
    work = [[store._values(make_stream(agg, v)) for v in range(1, versions + 1)] for agg in ids]
    settings = connections[alias].settings_dict
    read = store._select_sql.format_map(store._names) + " ORDER BY " + store._names["version"]
    if connections[alias].vendor == "sqlite":
        insert, read = (store._insert_sql + store._row_sql).replace("%s", "?"), read.replace("%s", "?")

        def connect():
            raw = sqlite3.connect(settings["NAME"], isolation_level=None, check_same_thread=False, timeout=10)
            raw.execute("PRAGMA journal_mode = WAL")
            return raw
    else:
        def connect():
            return psycopg.connect(host=PG["HOST"], port=PG["PORT"], user=PG["USER"], password=PG["PASSWORD"] or None,
                                   dbname=settings["NAME"], autocommit=True)

    def append(chunk):
        raw = connect()
        for rows in chunk:
            for values in rows:
                if connections[alias].vendor == "sqlite":
                    raw.execute(insert, values)
                elif locked:
                    raw.execute(*store._locked([_Stub], values))
                else:
                    raw.execute(store._insert_sql + store._typed_row_sql, values)
        raw.close()

    append_s = run_threads(append, split(work, threads))

    def load(chunk):
        raw = connect()
        for _ in range(5):
            for agg in chunk:
                found = raw.execute(read, (agg.aggregate_name, agg.id, agg.tenant_id)).fetchall()
                if len(found) != versions:
                    raise MalformedRun(f"a floor load found {len(found)} rows, not {versions}")
        raw.close()

    load_s = run_threads(load, split(ids, threads))
    return aggregates * versions / append_s, aggregates * 5 / load_s


class _Stub:
    """What ``DjangoEventStore._locked`` reads of a stream: its context."""

    class aggregate_id:
        context_name = "default"


def _process_work(spec: tuple, databases: dict, aggregates: int, versions: int, threads: int, barrier,
                  results) -> None:
    """One process of a multi-process row (spawned: nothing of the parent's connections or threads is shared).

    ``spec``: ``("ours", alias)``, ``("sqlite baseline", path)`` or ``("pg baseline", database)``. The
    processes start each phase together (``barrier``) and put their phases' wall-clock bounds on ``results``.
    """
    try:
        import django
        from django.conf import settings

        settings.configure(DATABASES=databases, INSTALLED_APPS=["wow_django"], USE_TZ=True)
        django.setup()
        import json

        from bench_store import LOAD_ROUNDS, run_threads, split
        from eventsourcing.persistence import StoredEvent

        from wow_django.persistence.records import AggregateId
        from wow_django.testing.event_store import make_stream

        kind, target = spec
        closing = []
        if kind == "ours":
            from wow_django.backends.django.event_store import DjangoEventStore

            store = DjangoEventStore(using=target)
            ids: list = [AggregateId("order", uuid.uuid4().hex) for _ in range(aggregates)]
            work = [[make_stream(agg, v) for v in range(1, versions + 1)] for agg in ids]
            append, load = store.append, store.load
            closing.append(store.close)
        else:
            if kind == "sqlite baseline":
                from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteDatastore

                recorder = SQLiteAggregateRecorder(SQLiteDatastore(target))
            else:
                from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore

                datastore = PostgresDatastore(target, PG["HOST"], PG["PORT"], PG["USER"], PG["PASSWORD"],
                                              pool_size=threads)
                closing.append(datastore.close)
                recorder = PostgresAggregateRecorder(datastore)
            ids = [uuid.uuid4() for _ in range(aggregates)]
            work = [[StoredEvent(originator_id=agg, originator_version=v, topic="tests:ThingHappened",
                                 state=json.dumps({"n": v, "i": 0, "text": f"event 0 of v{v}"}).encode())
                     for v in range(1, versions + 1)] for agg in ids]

            def append(event):
                recorder.insert_events([event])

            load = recorder.select_events

        def appends(chunk):
            for items in chunk:
                for item in items:
                    append(item)

        def loads(chunk):
            for _ in range(LOAD_ROUNDS):
                for agg in chunk:
                    if len(load(agg)) != versions:
                        raise MalformedRun(f"a load found the wrong number of streams in {kind}")

        barrier.wait(120)
        started = time.time()
        run_threads(appends, split(work, threads))
        appended = time.time()
        barrier.wait(600)
        loading = time.time()
        run_threads(loads, split(ids, threads))
        results.put((started, appended, loading, time.time(), None))
        for close in closing:
            close()
    except BaseException as exc:  # the parent reports it: the run is malformed
        barrier.abort()
        results.put((0.0, 0.0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))


def bench_processes(spec: tuple, databases: dict, aggregates: int, versions: int, threads: int,
                    processes: int) -> tuple[float, float]:
    """Appends/s and loads/s of ``processes`` processes × ``threads`` threads doing the work together
    (``aggregates`` shared out between them), each phase from the first process's start to the last one's end."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    share = [aggregates // processes + (1 if n < aggregates % processes else 0) for n in range(processes)]
    workers = [context.Process(target=_process_work, args=(spec, databases, n, versions, threads, barrier, results))
               for n in share]
    for worker in workers:
        worker.start()
    try:
        bounds = [results.get(timeout=900) for _ in workers]
    finally:
        for worker in workers:
            worker.join(60)
    errors = [error for *_, error in bounds if error]
    if errors or any(worker.exitcode != 0 for worker in workers):
        raise MalformedRun(f"a process of the {spec[0]} row failed: {errors or [w.exitcode for w in workers]}")
    append_s = max(b[1] for b in bounds) - min(b[0] for b in bounds)
    load_s = max(b[3] for b in bounds) - min(b[2] for b in bounds)
    from bench_store import LOAD_ROUNDS

    return aggregates * versions / append_s, aggregates * LOAD_ROUNDS / load_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=300)
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    parser.add_argument("--processes", type=int, default=2,
                        help="the second table: this many processes x --threads threads (0: leave it out)")
    args = parser.parse_args()
    try:
        report(args)
    except (MalformedRun, AssertionError) as exc:
        print(f"malformed run: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


def report(args) -> None:
    a, v, t = args.aggregates, args.versions, args.threads
    TRIPS.install()

    # Fresh databases per row: SQLite files in a temporary directory, PostgreSQL databases dropped at the end.
    directory = tempfile.mkdtemp(prefix="wow-bench-")
    pg_names = [f"wow_bench_{os.getpid()}_{n}" for n in range(len(BATCHING) + 7)]
    with admin_connection() as admin:
        for name in pg_names:
            admin.execute(f'CREATE DATABASE "{name}"')
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    for batching in BATCHING:
        databases[f"sqlite {batching}"] = {"ENGINE": "django.db.backends.sqlite3",
                                           "NAME": os.path.join(directory, f"{batching}.sqlite3")}
        databases[f"pg {batching}"] = {"ENGINE": "django.db.backends.postgresql",
                                       "NAME": pg_names[BATCHING.index(batching)], **PG}
    databases["pg prepared"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[-3], **PG,
                                "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5}}
    databases["sqlite floor"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(directory, "floor.sqlite3")}
    databases["pg floor"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[-4], **PG}
    databases["pg floor unlocked"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[-5], **PG}
    databases["sqlite processes"] = {"ENGINE": "django.db.backends.sqlite3",
                                     "NAME": os.path.join(directory, "processes.sqlite3")}
    databases["pg processes"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[-6], **PG}

    import django
    from django.conf import settings

    settings.configure(DATABASES=databases, INSTALLED_APPS=["wow_django"], USE_TZ=True)
    django.setup()
    from django.db import connections
    from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteApplicationRecorder, SQLiteDatastore

    # The rows in order: (engine, name, batching, timed run, round-trip count). Each run goes through every
    # row once, so that what else the machine does at a moment weighs on the baselines and on ours alike.
    plan = []
    datastores = []
    try:
        recorder = SQLiteAggregateRecorder(SQLiteDatastore(os.path.join(directory, "baseline.sqlite3")))
        recorder.create_table()
        plan.append(("SQLite", "pyeventsourcing SQLite recorder (baseline)", "-",
                     lambda: bench_baseline(a, v, t, recorder), lambda: trips_baseline(recorder, v)))
        # Client CPU per operation, one thread: (engine, side, measure).
        cpu_plan = [("SQLite", "wow_django", lambda: cpu_ours(django_store("sqlite off", "off"), v)),
                    ("SQLite", "baseline", lambda: cpu_baseline(recorder, v))]
        ordered = SQLiteApplicationRecorder(SQLiteDatastore(os.path.join(directory, "ordered.sqlite3")))
        ordered.create_table()
        plan.append(("SQLite", "pyeventsourcing SQLite application recorder", "-",
                     lambda: bench_baseline(a, v, t, ordered), lambda: trips_baseline(ordered, v)))
        plan.append(("SQLite", "floor: our statements straight to sqlite3", "-",
                     lambda: bench_floor("sqlite floor", a, v, t), lambda: (1.0, 1.0)))
        for batching in BATCHING:
            plan.append(("SQLite", "wow_django django backend, SQLite", batching,
                         lambda b=batching: bench_ours(django_store(f"sqlite {b}", b), a, v, t),
                         lambda b=batching: trips_ours(django_store(f"sqlite {b}", b), v)))
        try:
            from eventsourcing.postgres import PostgresAggregateRecorder, PostgresApplicationRecorder, PostgresDatastore
        except ImportError:
            print("# pyeventsourcing's PostgreSQL recorders need psycopg_pool: their rows are skipped")
        else:
            for name, recorder_class in ((pg_names[-1], PostgresAggregateRecorder),
                                         (pg_names[-2], PostgresApplicationRecorder)):
                datastore = PostgresDatastore(name, PG["HOST"], PG["PORT"], PG["USER"], PG["PASSWORD"], pool_size=t)
                datastores.append(datastore)
                pg_recorder = recorder_class(datastore)
                pg_recorder.create_table()
                label = ("pyeventsourcing PostgreSQL recorder (baseline)" if recorder_class is PostgresAggregateRecorder
                         else "pyeventsourcing PostgreSQL application recorder")
                plan.append(("PostgreSQL", label, "-", lambda r=pg_recorder: bench_baseline(a, v, t, r),
                             lambda r=pg_recorder: trips_baseline(r, v)))
                if recorder_class is PostgresAggregateRecorder:
                    cpu_plan += [("PostgreSQL", "wow_django", lambda: cpu_ours(django_store("pg off", "off"), v)),
                                 ("PostgreSQL", "baseline", lambda r=pg_recorder: cpu_baseline(r, v))]
        for batching in BATCHING:
            plan.append(("PostgreSQL", "wow_django django backend, PostgreSQL", batching,
                         lambda b=batching: bench_ours(django_store(f"pg {b}", b), a, v, t),
                         lambda b=batching: trips_ours(django_store(f"pg {b}", b), v)))
        plan.append(("PostgreSQL", "floor: our statements straight to psycopg", "-",
                     lambda: bench_floor("pg floor", a, v, t), lambda: (1.0, 1.0)))
        plan.append(("PostgreSQL", "floor, without the context lock (no order)", "-",
                     lambda: bench_floor("pg floor unlocked", a, v, t, locked=False), lambda: (1.0, 1.0)))
        plan.append(("PostgreSQL", "wow_django django backend, PostgreSQL, prepared", "off",
                     lambda: bench_ours(django_store("pg prepared", "off"), a, v, t),
                     lambda: trips_ours(django_store("pg prepared", "off"), v)))
        # The second table: the default rows and the baselines again, from several processes at once.
        process_plan = []
        if args.processes > 0:
            procs = args.processes
            baseline_file = os.path.join(directory, "baseline-processes.sqlite3")
            SQLiteAggregateRecorder(SQLiteDatastore(baseline_file)).create_table()
            process_plan.append(("SQLite", "pyeventsourcing SQLite recorder (baseline)", lambda: bench_processes(
                ("sqlite baseline", baseline_file), databases, a, v, t, procs)))
            django_store("sqlite processes", "off")  # migrated
            process_plan.append(("SQLite", "wow_django django backend, SQLite", lambda: bench_processes(
                ("ours", "sqlite processes"), databases, a, v, t, procs)))
            if any(engine == "PostgreSQL" and "(baseline)" in name for engine, name, *_ in plan):
                datastore = PostgresDatastore(pg_names[-7], PG["HOST"], PG["PORT"], PG["USER"], PG["PASSWORD"])
                PostgresAggregateRecorder(datastore).create_table()
                datastore.close()
                process_plan.append(("PostgreSQL", "pyeventsourcing PostgreSQL recorder (baseline)",
                                     lambda: bench_processes(("pg baseline", pg_names[-7]), databases, a, v, t,
                                                             procs)))
            django_store("pg processes", "off")
            process_plan.append(("PostgreSQL", "wow_django django backend, PostgreSQL", lambda: bench_processes(
                ("ours", "pg processes"), databases, a, v, t, procs)))
        runs, process_runs = [], []
        for _ in range(args.repeat):
            runs.append([run() for *_, run, _ in plan])
            process_runs.append([run() for *_, run in process_plan])
        trips = [count() for *_, count in plan]
        cpu = [(engine, side, *measure()) for engine, side, measure in cpu_plan]
    finally:
        for datastore in datastores:
            datastore.close()
        connections.close_all()
        with admin_connection() as admin:
            for name in pg_names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    rows = [(engine, name, batching, max(run[i][0] for run in runs), max(run[i][1] for run in runs), trips[i])
            for i, (engine, name, batching, *_) in enumerate(plan)]
    for row in rows:
        if not all(figure > 0 for figure in row[3:5]) or not all(count >= 1 for count in row[5]):
            raise MalformedRun(f"{row[1]} ({row[2]}): a figure or a round-trip count is not positive: {row[3:]}")
    bases = {engine: (appends, loads) for engine, name, _, appends, loads, _ in rows if "(baseline)" in name}
    print(f"# {a} aggregates x {v} appends each, {t} threads, best of {args.repeat}; "
          f"Python {sys.version.split()[0]}")
    print(f"{'store':48} {'batching':8} {'appends/s':>10} {'x base':>7} {'loads/s':>10} {'x base':>7} "
          f"{'trips/append':>12} {'trips/load':>10}")
    for engine, name, batching, appends, loads, (append_trips, load_trips) in rows:
        base = bases.get(engine, (appends, loads))
        print(f"{name:48} {batching:8} {appends:10,.0f} {appends / base[0]:7.2f} {loads:10,.0f} "
              f"{loads / base[1]:7.2f} {append_trips:12.2f} {load_trips:10.2f}")
    print("\n# default settings (batching off, Django's default OPTIONS) against the baseline of the same engine")
    print(f"{'engine':10} {'side':10} {'appends/s':>10} {'loads/s':>10} {'trips/append':>12} {'trips/load':>10}")
    for engine in bases:
        base = next(row for row in rows if row[0] == engine and "(baseline)" in row[1])
        ours = next(row for row in rows if row[0] == engine and row[1].startswith("wow_django") and row[2] == "off")
        for side, row in (("wow_django", ours), ("baseline", base)):
            print(f"{engine:10} {side:10} {row[3]:10,.0f} {row[4]:10,.0f} {row[5][0]:12.2f} {row[5][1]:10.2f}")
        print(f"{engine:10} {'ratio':10} {ours[3] / base[3]:9.2f}x {ours[4] / base[4]:9.2f}x")
    print("\n# one thread, microseconds per operation: the client's CPU (this process only: PostgreSQL's server is "
          "not in it, SQLite's statement is) and the wall-clock latency; default settings")
    print(f"{'engine':10} {'side':10} {'append CPU':>10} {'load CPU':>10} {'append':>10} {'load':>10}")
    for engine, side, *figures in cpu:
        if not all(figure > 0 for figure in figures):
            raise MalformedRun(f"{engine} {side}: a one-thread figure is not positive")
        print(f"{engine:10} {side:10} " + " ".join(f"{figure:10.1f}" for figure in figures))
    if process_plan:
        print(f"\n# {args.processes} processes x {t} threads, the {a} aggregates shared out, best of {args.repeat}; "
              "default settings against the baseline of the same engine")
        print(f"{'engine':10} {'side':10} {'appends/s':>10} {'loads/s':>10}")
        figures = {(engine, "(baseline)" in name): (max(run[i][0] for run in process_runs),
                                                    max(run[i][1] for run in process_runs))
                   for i, (engine, name, _) in enumerate(process_plan)}
        for (engine, _), (appends, loads) in figures.items():
            if appends <= 0 or loads <= 0:
                raise MalformedRun(f"{engine}: a multi-process figure is not positive")
        for engine in dict.fromkeys(engine for engine, _ in figures):
            if (engine, True) not in figures or (engine, False) not in figures:
                continue
            ours, base = figures[engine, False], figures[engine, True]
            print(f"{engine:10} {'wow_django':10} {ours[0]:10,.0f} {ours[1]:10,.0f}")
            print(f"{engine:10} {'baseline':10} {base[0]:10,.0f} {base[1]:10,.0f}")
            print(f"{engine:10} {'ratio':10} {ours[0] / base[0]:9.2f}x {ours[1] / base[1]:9.2f}x")


if __name__ == "__main__":
    main()

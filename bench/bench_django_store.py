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
figure over its engine's baseline.

Like for like: on SQLite both sides use WAL and SQLite's default
``synchronous`` (FULL), both commit each append. On PostgreSQL both commit each
append (``synchronous_commit`` as the server says); pyeventsourcing sends
prepared statements, while Django by default sends every statement unprepared
(``prepare_threshold`` None, client-side binding), so one more django row runs
with ``OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}``: the
same statements, prepared by psycopg from the fifth use.

    python bench/bench_django_store.py
    python bench/bench_django_store.py --aggregates 500 --versions 10 --threads 8

PostgreSQL: ``WOW_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``
(default 127.0.0.1:5432, user postgres, no password). Needs the ``bench`` and
``test`` extras.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=300)
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    args = parser.parse_args()
    a, v, t = args.aggregates, args.versions, args.threads

    # Fresh databases per row: SQLite files in a temporary directory, PostgreSQL databases dropped at the end.
    directory = tempfile.mkdtemp(prefix="wow-bench-")
    pg_names = [f"wow_bench_{os.getpid()}_{n}" for n in range(len(BATCHING) + 2)]
    with admin_connection() as admin:
        for name in pg_names:
            admin.execute(f'CREATE DATABASE "{name}"')
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    for batching in BATCHING:
        databases[f"sqlite {batching}"] = {"ENGINE": "django.db.backends.sqlite3",
                                           "NAME": os.path.join(directory, f"{batching}.sqlite3")}
        databases[f"pg {batching}"] = {"ENGINE": "django.db.backends.postgresql",
                                       "NAME": pg_names[BATCHING.index(batching)], **PG}
    databases["pg prepared"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_names[-2], **PG,
                                "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5}}

    import django
    from django.conf import settings

    settings.configure(DATABASES=databases, INSTALLED_APPS=["wow_django"], USE_TZ=True)
    django.setup()
    from django.db import connections
    from eventsourcing.sqlite import SQLiteAggregateRecorder, SQLiteDatastore

    # The rows in order; each run goes through every row once, so that what else the machine does
    # at a moment weighs on the baselines and on ours alike.
    plan = []
    datastore = None
    try:
        recorder = SQLiteAggregateRecorder(SQLiteDatastore(os.path.join(directory, "baseline.sqlite3")))
        recorder.create_table()
        plan.append(("pyeventsourcing SQLite recorder (baseline)", "-", lambda: bench_baseline(a, v, t, recorder)))
        for batching in BATCHING:
            plan.append(("wow_django django backend, SQLite", batching,
                         lambda b=batching: bench_ours(django_store(f"sqlite {b}", b), a, v, t)))
        try:
            from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore
        except ImportError:
            print("# pyeventsourcing's PostgreSQL recorder needs psycopg_pool: its row is skipped")
        else:
            datastore = PostgresDatastore(pg_names[-1], PG["HOST"], PG["PORT"], PG["USER"], PG["PASSWORD"],
                                          pool_size=t)
            postgres_recorder = PostgresAggregateRecorder(datastore)
            postgres_recorder.create_table()
            plan.append(("pyeventsourcing PostgreSQL recorder (baseline)", "-",
                         lambda: bench_baseline(a, v, t, postgres_recorder)))
        for batching in BATCHING:
            plan.append(("wow_django django backend, PostgreSQL", batching,
                         lambda b=batching: bench_ours(django_store(f"pg {b}", b), a, v, t)))
        plan.append(("wow_django django backend, PostgreSQL, prepared", "off",
                     lambda: bench_ours(django_store("pg prepared", "off"), a, v, t)))
        runs = [[run() for _, _, run in plan] for _ in range(args.repeat)]
    finally:
        if datastore is not None:
            datastore.close()
        connections.close_all()
        with admin_connection() as admin:
            for name in pg_names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    rows = [(name, batching, (max(run[i][0] for run in runs), max(run[i][1] for run in runs)))
            for i, (name, batching, _) in enumerate(plan)]
    print(f"# {a} aggregates x {v} appends each, {t} threads, best of {args.repeat}; "
          f"Python {sys.version.split()[0]}")
    print(f"{'store':48} {'batching':8} {'appends/s':>10} {'x base':>7} {'loads/s':>10} {'x base':>7}")
    base = (1.0, 1.0)
    for name, batching, (appends, loads) in rows:
        if "(baseline)" in name:
            base = (appends, loads)
        print(f"{name:48} {batching:8} {appends:10,.0f} {appends / base[0]:7.2f} {loads:10,.0f} "
              f"{loads / base[1]:7.2f}")


if __name__ == "__main__":
    main()

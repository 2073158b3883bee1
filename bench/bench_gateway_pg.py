"""Command throughput through the gateway on PostgreSQL: wow_django (``STORAGE = "django"``) vs pyeventsourcing.

The workload is ``bench_gateway.py``'s part 1 (its functions, imported): ``--aggregates``
aggregates are created, then each gets ``--updates`` update commands, single-threaded.

- wow_django: the runtime's gateway with ``WOW['STORAGE'] = "django"`` on a fresh
  PostgreSQL database (created here, migrated for the apps ``wow_django`` and
  ``wow_bus``, dropped at the end): with the default settings (snapshot strategy
  "all", written by the snapshot follower off the command path; the run ends when
  it has caught up, so its work counts), without snapshots, and with the
  snapshots saved inline (a lane saves one per command). Django's connection
  settings are its defaults, then once more with prepared statements
  (``OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}``), as
  pyeventsourcing sends them.
- pyeventsourcing's ``Application`` with ``PERSISTENCE_MODULE =
  "eventsourcing.postgres"`` on its own fresh database (snapshotting off, its
  default), as the baseline: ``save`` of a new aggregate, then
  ``repository.get`` + method + ``save`` per update.

Each row is the best of ``--repeat`` runs, interleaved; ``x base`` is commands/s over the baseline's.

    python bench/bench_gateway_pg.py
    python bench/bench_gateway_pg.py --aggregates 300 --updates 9 --repeat 3

PostgreSQL: ``WOW_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD`` (as
``bench_django_store.py``). Needs the ``bench`` and ``test`` extras.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_django_store import PG, admin_connection  # noqa: E402  (the same server settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=300)
    parser.add_argument("--updates", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    args = parser.parse_args()
    a, u = args.aggregates, args.updates

    ours, prepared, theirs = (f"wow_bench_gw_{os.getpid()}_{part}" for part in ("ours", "prepared", "es"))
    with admin_connection() as admin:
        for name in (ours, prepared, theirs):
            admin.execute(f'CREATE DATABASE "{name}"')

    # Settings before bench_gateway is imported: it configures its own only when none are.
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "wow_django", "wow_django.bus"],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.postgresql", "NAME": ours, **PG},
            "prepared": {"ENGINE": "django.db.backends.postgresql", "NAME": prepared, **PG,
                         "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5}},
        },
        WOW={"CONTEXT_NAME": "bench", "STORAGE": "django"},
        USE_TZ=True,
    )
    django.setup()

    from bench_gateway import bench_baseline, bench_ours
    from django.core.management import call_command
    from django.db import connections
    from django.test import override_settings

    from wow_django.application.runtime import close_runtime, get_runtime

    def snapshots_caught_up() -> None:
        """Wait for the snapshot follower (default settings) to pass every stream: its work counts."""
        from wow_django.application.followers import snapshot_follower
        from wow_django.application.snapshotting import SNAPSHOT_FOLLOWER

        if snapshot_follower() is None:
            return
        runtime = get_runtime()
        head = runtime.stream_feed.head()
        while True:
            state = runtime.follower_store.get(SNAPSHOT_FOLLOWER)
            if state is not None and state.position >= head:
                return
            if state is not None and state.poison is not None:
                raise SystemExit(f"the snapshot follower stopped: {state.poison.error}")
            time.sleep(0.005)

    def ours_with(alias: str, strategy: str, mode: str | None = None) -> float:
        wow = {"CONTEXT_NAME": "bench", "STORAGE": "django", "DATABASE_ALIAS": alias, "SNAPSHOT_STRATEGY": strategy}
        if mode is not None:
            wow["SNAPSHOT_MODE"] = mode
        with override_settings(WOW=wow):
            try:
                return bench_ours(get_runtime().gateway, a, u, settle=snapshots_caught_up)
            finally:
                close_runtime()

    env = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": theirs,
           "POSTGRES_HOST": PG["HOST"], "POSTGRES_PORT": PG["PORT"], "POSTGRES_USER": PG["USER"],
           "POSTGRES_PASSWORD": PG["PASSWORD"]}
    try:
        for alias in ("default", "prepared"):
            for app in ("wow_django", "wow_bus"):
                call_command("migrate", app, database=alias, verbosity=0)
        plan = [
            ("pyeventsourcing Application, PostgreSQL (baseline)", lambda: bench_baseline(a, u, env)),
            ("wow_django gateway, django/PostgreSQL, DEFAULT SETTINGS", lambda: ours_with("default", "all")),
            ("  no snapshots (SNAPSHOT_STRATEGY none)", lambda: ours_with("default", "none")),
            ("  snapshots inline (SNAPSHOT_MODE inline)", lambda: ours_with("default", "all", "inline")),
            ("  prepared statements, default snapshot settings", lambda: ours_with("prepared", "all")),
        ]
        # Interleaved (every row once, then again): load from elsewhere weighs on every row alike.
        runs = [[run() for _, run in plan] for _ in range(args.repeat)]
        rows = [(name, max(run[i] for run in runs)) for i, (name, _) in enumerate(plan)]
        baseline = rows[0][1]
    finally:
        connections.close_all()
        with admin_connection() as admin:
            for name in (ours, prepared, theirs):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    print(f"# create then {u} updates per aggregate, {a} aggregates, single thread, best of {args.repeat}; "
          f"Python {sys.version.split()[0]}")
    print(f"{'':62} {'commands/s':>12} {'x base':>7}")
    for name, rate in rows:
        print(f"{name:62} {rate:12,.0f} {rate / baseline:7.2f}")


if __name__ == "__main__":
    main()

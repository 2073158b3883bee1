"""A follower process killed mid-batch (SIGKILL) loses nothing and, where its handler is idempotent, applies
nothing twice; a bus relay killed between the append and the publish loses no integration event.

Real OS processes on PostgreSQL (``tests/follower_kill_settings.py``): one
process appends (``kill_probe_orders``: no follower runs in it), a
``manage.py wow_follow`` process runs the followers of ``tests/follower_app``
and is killed with SIGKILL while a batch is in flight (its handled streams not
yet checkpointed), and a second ``wow_follow --until-caught-up`` takes the
lease over once the dead one's expires and finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.pg import pg_connect_kwargs, scratch_database

ROOT = Path(__file__).resolve().parent.parent
ORDERS = 120  # 240 order streams (placed + paid), 120 of them paid


@pytest.fixture
def kill_env(tmp_path):
    with scratch_database("test_wow_kill") as database:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("WOW_MONGO", "SAMPLE_", "CELERY_"))},
               "DJANGO_SETTINGS_MODULE": "tests.follower_kill_settings", "WOW_KILL_PG_DB": database,
               "PYTHONUNBUFFERED": "1"}
        yield env, database


def manage(env, *args, timeout=300) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def rows(database: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(dbname=database, autocommit=True, **pg_connect_kwargs()) as conn:
        return conn.execute(sql, params).fetchall()


def checkpoint(database: str, name: str) -> int:
    found = rows(database, "SELECT position FROM wow_follower WHERE name = %s", name)
    return found[0][0] if found else 0


@pytest.mark.deep  # a kill test (about 30 s): the deep tier; tests/test_follower_commands.py runs wow_follow in a
# process in the default tier
def test_a_follower_process_killed_mid_batch_loses_nothing_and_applies_nothing_twice(kill_env, tmp_path):
    env, database = kill_env
    manage(env, "migrate", "-v0")
    manage(env, "kill_probe_orders", str(ORDERS))
    positions = [p for (p,) in rows(database, "SELECT position FROM wow_event_stream WHERE aggregate_name = 'order' "
                                              "ORDER BY position")]
    assert len(positions) == 2 * ORDERS

    log = open(tmp_path / "follow-1.log", "w")
    first = subprocess.Popen([sys.executable, "manage.py", "wow_follow", "kill-probe", "kill-relay"], cwd=ROOT,
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Kill it once it has handled a third, and while it holds handled streams it has not checkpointed.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            applied = rows(database, "SELECT count(*) FROM kill_applied")[0][0]
            relayed = rows(database, "SELECT count(*) FROM wow_bus_event")[0][0]
            if applied >= len(positions) // 3 and 0 < relayed < ORDERS and \
                    applied > checkpoint(database, "kill-probe"):
                break
            assert first.poll() is None, (tmp_path / "follow-1.log").read_text()
            time.sleep(0.005)
        else:
            pytest.fail("the follower did not get a third of the way in 120 s")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    at_kill = checkpoint(database, "kill-probe")
    # Called but not checkpointed (the kill may also land between a call's two inserts: called, not applied).
    called_at_kill = {p for (p,) in rows(database, "SELECT position FROM kill_calls")}
    in_flight = {p for p in called_at_kill if p > at_kill}
    assert in_flight, "the kill landed on a checkpoint: nothing was in flight"
    relayed_at_kill = rows(database, "SELECT count(*) FROM wow_bus_event")[0][0]
    assert 0 < relayed_at_kill < ORDERS

    # A second instance takes the lease over once the dead one's expires, and catches up.
    out = manage(env, "wow_follow", "kill-probe", "kill-relay", "--until-caught-up", timeout=300)
    assert "Stopped kill-probe" in out

    # Nothing lost: every order stream was applied, every paid order relayed.
    assert sorted(p for (p,) in rows(database, "SELECT position FROM kill_applied")) == positions
    relayed = rows(database, "SELECT event_id FROM wow_bus_event")
    paid = rows(database, "SELECT body FROM wow_event_stream WHERE aggregate_name = 'order' AND version = 2")
    assert len(relayed) == len(paid) == ORDERS
    assert {event_id for (event_id,) in relayed} == {f"kill-{body[0]['id']}" for (body,) in paid}
    # At least once: what was handled but not checkpointed at the kill was handed again, nothing else was.
    calls = dict(rows(database, "SELECT position, count(*) FROM kill_calls GROUP BY position"))
    assert {p for p, n in calls.items() if n > 1} <= in_flight
    assert any(calls[p] == 2 for p in in_flight)
    assert all(n <= 2 for n in calls.values())
    # The follower's status: caught up, no error.
    status = manage(env, "wow_followers", "--format", "json")
    import json

    by_name = {row["name"]: row for row in json.loads(status)}
    for name in ("kill-probe", "kill-relay"):
        assert (by_name[name]["lag_events"], by_name[name]["error"]) == (0, None)

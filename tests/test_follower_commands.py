"""``manage.py wow_follow`` and ``manage.py wow_followers``: through call_command on the in-memory runtime, and
in real processes on a SQLite file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from sample_project.orders.aggregates import OrderLine, PlaceOrder
from wow_django.application import WaitStage
from wow_django.application.followers import FollowerRegistry, follower, use_followers
from wow_django.application.runtime import get_runtime
from wow_django.domain import registry
from wow_django.testing import isolated_registry

from .support import fresh_wow, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def declared():
    """An in-memory runtime and a follower "ledger" recording positions; fails on positions in ``fail_at``.

    Followers run only where the commands run them (``FOLLOWERS_RUN="command"``), not as threads of this
    process, so the lag before ``wow_follow`` is what the tests see."""
    with override_settings(WOW=fresh_wow("in_memory", FOLLOWERS_RUN="command", SNAPSHOT_MODE="inline")), \
            isolated_registry():
        handled: list[int] = []
        fail_at: set[int] = set()

        @follower("ledger", aggregates={"order"})
        def ledger(item):
            if item.position in fail_at:
                raise ValueError(f"bad order at {item.position}")
            handled.append(item.position)

        yield handled, fail_at


def place(count: int) -> None:
    for n in range(count):
        get_runtime().gateway.send(PlaceOrder(customer_id=f"c-{n}", items=[
            OrderLine(sku="A", quantity=1, unit_price=Decimal("1"))]), wait=WaitStage.SNAPSHOT)


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def status() -> dict:
    return {row["name"]: row for row in json.loads(run("wow_followers", "--format", "json"))}


def test_wow_follow_until_caught_up_then_status(declared):
    handled, _ = declared
    place(3)
    assert status()["ledger"]["lag_events"] == 3
    assert status()["ledger"]["lag_seconds"] >= 0
    out = run("wow_follow", "ledger", "--until-caught-up")
    assert "Stopped ledger at position 3" in out
    assert handled == [1, 2, 3]
    row = status()["ledger"]
    assert (row["position"], row["head"], row["lag_events"], row["lag_seconds"]) == (3, 3, 0, 0.0)
    assert (row["paused"], row["error"], row["gaps_skipped"], row["lease_holder"]) == (False, None, 0, None)
    assert "ledger: position 3 of 3, lag 0 stream(s)" in run("wow_followers")


def test_wow_follow_refuses_unknown_names(declared):
    with pytest.raises(CommandError, match=r"NAME: unknown follower\(s\) 'nope' \(declared: .*ledger"):
        run("wow_follow", "nope")
    domain = registry.current()  # a copy (isolated_registry): the sample's projections and processors
    for handler in domain.handlers():
        domain.discard_handler(handler.name)
    with use_followers(FollowerRegistry()), pytest.raises(CommandError, match="no follower is declared"):
        run("wow_follow", "--until-caught-up")  # were one declared, it would still stop


def test_pause_and_resume(declared):
    handled, _ = declared
    place(1)
    run("wow_follow", "--until-caught-up")
    assert "Paused ledger" in run("wow_followers", "pause", "ledger")
    assert status()["ledger"]["paused"] is True
    assert "PAUSED" in run("wow_followers")
    place(1)
    run("wow_follow", "ledger", "--until-caught-up")  # paused: it stops at once, nothing handled
    assert handled == [1]
    run("wow_followers", "resume", "ledger")
    run("wow_follow", "ledger", "--until-caught-up")
    assert handled == [1, 2]


def test_rewind_tells_what_it_replays_and_asks_for_yes(declared):
    handled, _ = declared
    place(4)
    run("wow_follow", "--until-caught-up")
    out = run("wow_followers", "rewind", "ledger", "--to-position", "1")
    assert "from position 4 to 1 replays 3 stream(s)" in out and "add --yes" in out
    assert status()["ledger"]["position"] == 4
    run("wow_followers", "rewind", "ledger", "--to-position", "1", "--yes")
    assert status()["ledger"]["position"] == 1
    run("wow_follow", "--until-caught-up")
    assert handled == [1, 2, 3, 4, 2, 3, 4]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert "to 4 replays 0" in run("wow_followers", "rewind", "ledger", "--to-time", later, "--yes")
    out = run("wow_followers", "rewind", "ledger", "--to-time", "2000-01-01T00:00:00", "--yes")
    assert "to 0 replays 4" in out
    assert status()["ledger"]["position"] == 0


def test_rewind_arguments_are_checked(declared):
    place(1)
    run("wow_follow", "--until-caught-up")
    with pytest.raises(CommandError, match=r"--to-position must be an integer ≥ 0, got '-2'"):
        run("wow_followers", "rewind", "ledger", "--to-position", "-2")
    with pytest.raises(CommandError, match=r"--to-position must be an integer ≥ 0, got 'x'"):
        run("wow_followers", "rewind", "ledger", "--to-position", "x")
    with pytest.raises(CommandError, match=r"--to-time must be an ISO time"):
        run("wow_followers", "rewind", "ledger", "--to-time", "yesterday")
    with pytest.raises(CommandError, match=r"NAME: no follower named 'ghost'"):
        run("wow_followers", "rewind", "ghost", "--to-position", "0")
    with pytest.raises(CommandError, match="one of the arguments --to-position --to-time is required"):
        run("wow_followers", "rewind", "ledger")


def test_a_poison_event_shows_then_retry_or_skip(declared):
    handled, fail_at = declared
    place(3)
    fail_at.add(2)
    run("wow_follow", "--until-caught-up")
    assert handled == [1]
    row = status()["ledger"]
    assert row["position"] == 1 and row["error"]["position"] == 2
    assert "bad order at 2" in row["error"]["error"]
    assert "STOPPED at 2" in run("wow_followers")
    assert "Cleared the poison event of ledger at position 2" in run("wow_followers", "retry", "ledger")
    run("wow_follow", "--until-caught-up")  # still failing: stopped again
    assert status()["ledger"]["error"]["position"] == 2
    with pytest.raises(CommandError, match="--reason must say why"):
        run("wow_followers", "skip", "ledger", "--reason", " ")
    out = run("wow_followers", "skip", "ledger", "--reason", "test data", "--by", "alice")
    assert "Skipped position 2" in out and "alice" in out
    [audit] = get_runtime().follower_store.skipped("ledger")
    assert (audit["position"], audit["by"], audit["reason"]) == (2, "alice", "test data")
    run("wow_follow", "--until-caught-up")
    assert handled == [1, 3]
    with pytest.raises(CommandError, match="NAME: follower 'ledger' is not stopped on a poison event"):
        run("wow_followers", "retry", "ledger")
    with pytest.raises(CommandError, match="NAME: follower 'ledger' is not stopped on a poison event"):
        run("wow_followers", "skip", "ledger", "--reason", "again")


def test_actions_on_unknown_followers(declared):
    for action in (["pause", "ghost"], ["resume", "ghost"], ["retry", "ghost"], ["skip", "ghost", "--reason", "x"]):
        with pytest.raises(CommandError, match="NAME: no follower named 'ghost'"):
            run("wow_followers", *action)


def test_wow_follow_in_a_process_on_a_sqlite_file():
    """The sample's follower in real processes on a SQLite file: orders placed, followed, lag 0."""
    directory = tempfile.mkdtemp(prefix="wow-follow-")
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "sample_project.settings",
               "SAMPLE_SQLITE_PATH": os.path.join(directory, "sample.sqlite3"), "CELERY_EAGER": "1",
               "WOW_BUS_TRANSPORT_URL": "memory://", "WOW_FOLLOWERS_RUN": "command", "PYTHONPATH": ROOT}
        env.pop("SAMPLE_POSTGRES_DB", None)
        env.pop("WOW_MONGO_URI", None)

        def manage(*args, check=True):
            done = subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), *args], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=180)
            if check:
                assert done.returncode == 0, done.stderr
            return done.stdout

        manage("migrate", "-v", "0")
        placing = ("from decimal import Decimal; from sample_project.orders.aggregates import OrderLine, PlaceOrder; "
                   "from wow_django.application import get_runtime\n"
                   "for n in range(3): get_runtime().gateway.send(PlaceOrder(customer_id=f'c-{n}', "
                   "items=[OrderLine(sku='A', quantity=1, unit_price=Decimal('1'))]))")
        manage("shell", "-c", placing)
        before = {row["name"]: row for row in json.loads(manage("wow_followers", "--format", "json"))}
        assert before["order-activity"]["lag_events"] == 3
        assert "Stopped order-activity" in manage("wow_follow", "order-activity", "--until-caught-up")
        after = {row["name"]: row for row in json.loads(manage("wow_followers", "--format", "json"))}
        row = after["order-activity"]
        assert (row["lag_events"], row["lag_seconds"], row["lease_holder"]) == (0, 0.0, None)
        assert row["position"] == row["head"] > 0

        # Running until stopped: SIGTERM finishes the batch and releases the lease.
        follow = subprocess.Popen([sys.executable, os.path.join(ROOT, "manage.py"), "wow_follow"], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def holder():
                rows = {r["name"]: r for r in json.loads(manage("wow_followers", "--format", "json"))}
                return rows["order-activity"]["lease_holder"]

            wait_for(holder, timeout=60, what="wow_follow holds the lease")
            follow.send_signal(signal.SIGTERM)
            out, err = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
        assert follow.returncode == 0, err
        assert "SIGTERM: finishing the current batches" in out
        assert holder() is None
    finally:
        shutil.rmtree(directory, ignore_errors=True)

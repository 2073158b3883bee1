"""Snapshots written by the snapshot follower (``SNAPSHOT_MODE="follower"``, the default; issue 23, item 2):
off the command path, one write per aggregate and batch, caught up after any outage, and the ``SNAPSHOT``
wait stage meaning "a snapshot at or past this version is stored"."""

from __future__ import annotations

import logging
import threading

import pytest
from django.test import override_settings

from sample_project.orders.aggregates import ChangeDisplayName, RegisterCustomer
from wow_django.application.followers import FollowerRunner, declared_followers, snapshot_follower
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.application.snapshotting import SNAPSHOT_FOLLOWER
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.records import AggregateId
from wow_django.testing import FakeClock

from .support import fresh_wow, wait_for


def _settings(**extra):
    """The default snapshot settings; followers run only where a test runs them (by hand)."""
    return override_settings(WOW=fresh_wow("in_memory", FOLLOWERS_RUN="command", **extra))


def _register(username: str, wait=WaitStage.PROCESSED):
    return get_runtime().gateway.send(RegisterCustomer(username=username, display_name="start"), wait=wait)


def _rename(customer: str, n: int, wait=WaitStage.PROCESSED, timeout=None):
    return get_runtime().gateway.send(ChangeDisplayName(display_name=f"name {n}"), aggregate_id=customer, wait=wait,
                                      timeout=timeout)


def _snapshot(customer: str):
    return get_runtime().snapshot_store.load(AggregateId("customer", customer))


def _runner(**options) -> FollowerRunner:
    runtime = get_runtime()
    return FollowerRunner(snapshot_follower(), runtime.stream_feed, runtime.follower_store, owner="test",
                          clock=options.pop("clock", FakeClock()), **options)


def _drain(runner: FollowerRunner) -> None:
    for _ in range(50):
        cycle = runner.run_once()
        if not cycle.full:
            return
    raise AssertionError("the snapshot follower did not catch up")


def test_it_is_the_default_and_is_declared_with_the_other_followers():
    with _settings():
        declared = declared_followers()
        assert declared[SNAPSHOT_FOLLOWER] is snapshot_follower()
        assert declared[SNAPSHOT_FOLLOWER].kind == "snapshots"
    for mode, strategy in (("inline", "all"), ("celery", "all"), ("follower", "none")):
        with _settings(SNAPSHOT_MODE=mode, SNAPSHOT_STRATEGY=strategy):
            assert snapshot_follower() is None
            assert SNAPSHOT_FOLLOWER not in declared_followers()


def test_the_command_path_writes_no_snapshot():
    with _settings():
        customer = _register("off-path").aggregate_id
        _rename(customer, 1)
        assert _snapshot(customer) is None  # nothing written until the follower runs
        _drain(_runner())
        assert _snapshot(customer).version == 2


def test_a_batch_writes_one_snapshot_per_aggregate_at_its_latest_version():
    with _settings():
        customers = [_register(f"batch-{i}").aggregate_id for i in range(3)]
        for n in range(9):
            for customer in customers:
                _rename(customer, n)
        writer = snapshot_follower().handler
        before = (writer.saved, writer.loaded, writer.applied)
        _drain(_runner(min_batch=64, max_batch=64))
        assert [_snapshot(c).version for c in customers] == [10, 10, 10]
        assert _snapshot(customers[0]).state["display_name"] == "name 8"
        saved, loaded, applied = (writer.saved - before[0], writer.loaded - before[1], writer.applied - before[2])
        assert saved == 3  # 30 streams, three aggregates: three writes
        assert (loaded, applied) == (0, 30)  # created within the feed: every stream applied in memory, no read


def test_it_follows_the_strategy():
    with _settings(SNAPSHOT_STRATEGY="version_offset", SNAPSHOT_VERSION_OFFSET=3):
        customer = _register("offset").aggregate_id
        runner = _runner(min_batch=1, max_batch=1)
        writer = snapshot_follower().handler
        before = (writer.loaded, writer.applied)
        seen = []
        for n in range(2, 9):
            _rename(customer, n)
            _drain(runner)
            snapshot = _snapshot(customer)
            seen.append(snapshot.version if snapshot else None)
        assert seen == [None, 3, 3, 3, 6, 6, 6]
        assert (writer.loaded - before[0], writer.applied - before[1]) == (0, 8)  # from its creation on, in memory


def test_an_aggregate_first_seen_mid_history_is_loaded_from_the_stores():
    with _settings():
        customer = _register("mid").aggregate_id
        for n in range(4):
            _rename(customer, n)
        runtime = get_runtime()
        feed = runtime.stream_feed
        head = feed.head()
        runtime.follower_store.acquire(SNAPSHOT_FOLLOWER, "test", 30, now=FakeClock()())
        runtime.follower_store.advance(SNAPSHOT_FOLLOWER, "test", head - 1, now=FakeClock()())
        runtime.follower_store.release(SNAPSHOT_FOLLOWER, "test")
        writer = snapshot_follower().handler
        before = (writer.loaded, writer.applied)
        _drain(_runner())
        assert _snapshot(customer).version == 5
        assert (writer.loaded - before[0], writer.applied - before[1]) == (1, 0)


def test_a_store_outage_is_caught_up_without_repair(monkeypatch):
    """The loss seen with a queued snapshot and a failing broker client (1 of 41 accounts never
    snapshotted) cannot happen: the batch is handed again until the snapshot is stored."""
    with _settings():
        customer = _register("outage").aggregate_id
        _rename(customer, 1)
        store = get_runtime().snapshot_store
        real = store.save
        failures = [RecoverableStoreError("connection reset")] * 3

        def failing(snapshot):
            if failures:
                raise failures.pop()
            return real(snapshot)

        monkeypatch.setattr(store, "save", failing)
        runner = _runner()
        for _ in range(3):
            cycle = None
            try:
                cycle = runner.run_once()
            except RecoverableStoreError:
                pass
            assert cycle is None or cycle.failed
            assert _snapshot(customer) is None
            assert get_runtime().follower_store.get(SNAPSHOT_FOLLOWER).position == 0  # not checkpointed
        _drain(runner)
        assert _snapshot(customer).version == 2
        assert get_runtime().follower_store.get(SNAPSHOT_FOLLOWER).position == get_runtime().stream_feed.head()


def test_a_snapshot_that_cannot_be_stored_is_dropped_not_retried_for_ever(monkeypatch, caplog):
    with _settings():
        customer = _register("refused").aggregate_id
        store = get_runtime().snapshot_store
        monkeypatch.setattr(store, "save", lambda snapshot: (_ for _ in ()).throw(ValueError("refused")))
        with caplog.at_level(logging.ERROR, logger="wow_django.application.snapshotting"):
            _drain(_runner())
        assert "snapshot of customer" in caplog.text and "dropped" in caplog.text
        assert get_runtime().follower_store.get(SNAPSHOT_FOLLOWER).position == get_runtime().stream_feed.head()
        monkeypatch.undo()
        _rename(customer, 1)
        _drain(_runner())
        assert _snapshot(customer).version == 2  # the next due stream writes it


def test_a_rewind_rewrites_nothing_older():
    with _settings():
        customer = _register("rewind").aggregate_id
        _rename(customer, 1)
        runner = _runner()
        _drain(runner)
        writer = snapshot_follower().handler
        saved = writer.saved
        get_runtime().follower_store.rewind(SNAPSHOT_FOLLOWER, 0, now=FakeClock()())
        _drain(runner)
        assert writer.saved == saved  # its state was already past every stream handed again
        assert _snapshot(customer).version == 2


def test_processed_does_not_wait_for_the_snapshot_and_snapshot_does():
    with _settings(COMMAND_WAIT_TIMEOUT_S=0.3):
        customer = _register("waits").aggregate_id
        result = _rename(customer, 1, wait=WaitStage.PROCESSED)
        assert result.stage == WaitStage.PROCESSED and result.error_code == "Ok"
        result = _rename(customer, 2, wait=WaitStage.SNAPSHOT, timeout=0.3)  # no follower runs: it times out
        assert result.stage == WaitStage.PROCESSED and result.error_code == "RequestTimeout"
        assert SNAPSHOT_FOLLOWER in result.error_msg and "SNAPSHOT" in result.error_msg
        stop = threading.Event()
        runner = FollowerRunner(snapshot_follower(), get_runtime().stream_feed, get_runtime().follower_store,
                                owner="thread")
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        thread.start()
        try:
            result = _rename(customer, 3, wait=WaitStage.SNAPSHOT, timeout=10)
            assert result.stage == WaitStage.SNAPSHOT and result.error_code == "Ok"
            assert _snapshot(customer).version >= 4  # at or past the command's version once SNAPSHOT is reached
        finally:
            stop.set()
            runner.wake()
            thread.join(10)
            runner.close()


def test_a_stopped_snapshot_follower_is_reported_not_waited_for():
    with _settings():
        customer = _register("stopped").aggregate_id
        runtime = get_runtime()
        _drain(_runner())
        now = FakeClock()()
        runtime.follower_store.acquire(SNAPSHOT_FOLLOWER, "test", 30, now=now)
        from wow_django.persistence.followers import PoisonEvent

        state = runtime.follower_store.get(SNAPSHOT_FOLLOWER)
        runtime.follower_store.set_poison(SNAPSHOT_FOLLOWER, "test", PoisonEvent(
            position=state.position + 1, stream_id="s", aggregate=f"customer/{customer}", error="boom", at=now),
            now=now, generation=state.generation)
        result = _rename(customer, 1, wait=WaitStage.SNAPSHOT, timeout=5)
        assert result.stage == WaitStage.SNAPSHOT and result.error_code == "DispatchFailed"
        assert f"follower '{SNAPSHOT_FOLLOWER}' is stopped" in result.error_msg


@pytest.mark.parametrize("storage", ["in_memory", "mongo"])
def test_with_follower_threads_a_snapshot_wait_sees_the_snapshot(storage):
    """As a web process runs it: the follower threads start with the first command; a SNAPSHOT wait hurries
    it out of its linger (30 s here: without the hurry every wait below would time out)."""
    with override_settings(WOW=fresh_wow(storage, SNAPSHOT_FOLLOWER_LINGER_S=30)):
        customer = get_runtime().gateway.send(RegisterCustomer(username="threads", display_name="start"),
                                              wait=WaitStage.SNAPSHOT, timeout=10)
        assert customer.stage == WaitStage.SNAPSHOT and customer.error_code == "Ok"
        assert SNAPSHOT_FOLLOWER in get_runtime().follower_threads.names()
        for n in range(3):
            _rename(customer.aggregate_id, n)
        result = _rename(customer.aggregate_id, 9, wait=WaitStage.SNAPSHOT, timeout=10)
        assert result.stage == WaitStage.SNAPSHOT and result.error_code == "Ok"
        assert _snapshot(customer.aggregate_id).version == 5


def test_a_new_aggregate_needs_no_read():
    with _settings():
        customer = _register("new").aggregate_id
        writer = snapshot_follower().handler
        before = (writer.loaded, writer.applied)
        _drain(_runner())
        assert _snapshot(customer).version == 1
        assert (writer.loaded - before[0], writer.applied - before[1]) == (0, 1)


def test_it_lingers_between_batches_unless_hurried():
    """Streams arriving while it lingers are handled in one batch (one snapshot write); a hurry ends the
    linger at once."""
    with _settings(SNAPSHOT_FOLLOWER_LINGER_S=30):
        customer = _register("linger").aggregate_id
        runtime = get_runtime()
        runner = FollowerRunner(snapshot_follower(), runtime.stream_feed, runtime.follower_store, owner="thread")
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        writer = snapshot_follower().handler
        saved = writer.saved
        thread.start()
        try:
            wait_for(lambda: writer.saved == saved + 1, timeout=10, what="the first batch")
            for n in range(5):  # arrive while it lingers (30 s)
                _rename(customer, n)
            assert writer.saved == saved + 1 and _snapshot(customer).version == 1
            runner.hurry()
            wait_for(lambda: writer.saved == saved + 2, timeout=10, what="the hurried batch")
            assert _snapshot(customer).version == 6  # five commands, one write
        finally:
            stop.set()
            runner.hurry()
            runner.wake()
            thread.join(10)
            runner.close()


def test_a_repeated_request_waits_for_the_snapshot_too():
    with _settings(COMMAND_WAIT_TIMEOUT_S=0.3):
        customer = _register("repeat").aggregate_id
        first = get_runtime().gateway.send(ChangeDisplayName(display_name="again"), aggregate_id=customer,
                                           request_id="rename-1")
        again = get_runtime().gateway.send(ChangeDisplayName(display_name="again"), aggregate_id=customer,
                                           request_id="rename-1", wait=WaitStage.SNAPSHOT, timeout=0.3)
        assert again.duplicate and again.command_id == first.command_id
        assert (again.stage, again.error_code) == (WaitStage.PROCESSED, "RequestTimeout")  # no follower runs
        _drain(_runner())
        again = get_runtime().gateway.send(ChangeDisplayName(display_name="again"), aggregate_id=customer,
                                           request_id="rename-1", wait=WaitStage.SNAPSHOT, timeout=5)
        assert again.duplicate and (again.stage, again.error_code) == (WaitStage.SNAPSHOT, "Ok")


def test_follower_mode_needs_a_waiter():
    from wow_django.application.gateway import CommandGateway
    from wow_django.backends.memory.stores import InMemoryEventStore, InMemorySnapshotStore

    with pytest.raises(ValueError, match="needs a waiter"):
        CommandGateway(InMemoryEventStore(), InMemorySnapshotStore(), context_name="c", snapshot_mode="follower")


def test_a_stream_the_store_cannot_load_yet_is_retried_not_poison(monkeypatch):
    """A read that lags the feed (a replica, a router) fails the batch as a transient error: handed again."""
    with _settings():
        customer = _register("lagging").aggregate_id
        _rename(customer, 1)
        runtime = get_runtime()
        # The writer has never seen it, and a first load finds nothing (the lagging read).
        store = runtime.event_store
        real = store.load
        misses = [True]

        def lagging(*args, **kwargs):
            if misses:
                misses.pop()
                return []
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "load", lagging)
        runtime.follower_store.acquire(SNAPSHOT_FOLLOWER, "test", 30, now=FakeClock()())
        runtime.follower_store.advance(SNAPSHOT_FOLLOWER, "test", 1, now=FakeClock()())
        runtime.follower_store.release(SNAPSHOT_FOLLOWER, "test")
        runner = _runner()
        with pytest.raises(RecoverableStoreError):
            runner.run_once()
        _drain(runner)
        state = runtime.follower_store.get(SNAPSHOT_FOLLOWER)
        assert state.poison is None and _snapshot(customer).version == 2


def test_a_failing_stream_keeps_the_snapshot_asked_for_before_it(monkeypatch):
    """The strategy asked for v2's snapshot; v3 then fails to apply (poison): v2's snapshot is still written
    with the checkpoint before v3, from the state as it was, not the half-applied one."""
    from wow_django.application import snapshotting

    with _settings():
        customer = _register("poisoned").aggregate_id
        _rename(customer, 2)
        _rename(customer, 3)
        real = snapshotting.apply_stream

        def failing(aggregate, stream, events=None):
            if stream.version == 3:
                aggregate.state.display_name = "half-applied"
                raise ValueError("cannot apply v3")
            return real(aggregate, stream, events)

        monkeypatch.setattr(snapshotting, "apply_stream", failing)
        runner = _runner(min_batch=16, max_batch=16)
        runner.run_once()
        state = get_runtime().follower_store.get(SNAPSHOT_FOLLOWER)
        assert state.poison is not None and "cannot apply v3" in state.poison.error
        snapshot = _snapshot(customer)
        assert snapshot.version == 2 and snapshot.state["display_name"] == "name 2"


def test_stopping_ends_a_linger():
    with _settings(SNAPSHOT_FOLLOWER_LINGER_S=60):
        _register("stop")
        runtime = get_runtime()
        runner = FollowerRunner(snapshot_follower(), runtime.stream_feed, runtime.follower_store, owner="thread")
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        thread.start()
        wait_for(lambda: runtime.follower_store.get(SNAPSHOT_FOLLOWER) is not None
                 and runtime.follower_store.get(SNAPSHOT_FOLLOWER).position >= 1, timeout=10, what="the batch")
        stop.set()
        runner.wake()
        thread.join(5)
        assert not thread.is_alive()  # not 60 s of linger

"""The runtime: one object owning the process's stores, gateway, bus and task queue."""

from __future__ import annotations

import os
import threading
import time
from decimal import Decimal

import pytest
from django.test import override_settings

from sample_project.orders.aggregates import OrderLine, PlaceOrder
from wow_django.application import TaskQueue, WaitStage, close_runtime, get_runtime, send
from wow_django.backends.memory import MemoryBackend
from wow_django.checks import check_settings
from wow_django.domain import projection
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.batching import BatchingEventStore
from wow_django.persistence.records import AggregateId
from wow_django.testing import make_stream

from .support import fresh_wow, in_forked_child

ORDER = PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A", quantity=1, unit_price=Decimal("2"))])


class RecordingTaskQueue(TaskQueue):
    """A task queue that keeps what it was given (class-level: the runtime builds it)."""

    given: list[tuple] = []
    fail_rollups = False
    take_rollups = True

    def process_command(self, message: dict) -> None:
        self.given.append(("process_command", message["command_name"], message["request_id"]))

    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        self.given.append(("request_snapshot", aggregate_name, aggregate_id))
        return True

    def rollup(self, event_id: str) -> bool:
        if self.fail_rollups:
            raise ConnectionError("broker down")
        self.given.append(("rollup", event_id))
        return self.take_rollups


@pytest.fixture
def recording_queue():
    RecordingTaskQueue.given = []
    RecordingTaskQueue.fail_rollups = False
    RecordingTaskQueue.take_rollups = True
    settings = fresh_wow("in_memory", TASK_QUEUE=f"{__name__}.RecordingTaskQueue")
    with override_settings(WOW=settings):
        yield RecordingTaskQueue


def test_each_part_is_built_once_and_shared(wow):
    runtime = get_runtime()
    assert get_runtime() is runtime
    assert runtime.event_store is runtime.event_store
    assert runtime.gateway.event_store is runtime.event_store
    assert runtime.gateway.snapshot_store is runtime.snapshot_store
    assert runtime.bus.store is runtime.bus_store
    assert runtime.prepare_key("username") is runtime.prepare_key("username")
    assert runtime.prepare_key("username") is not runtime.prepare_key("email")


def test_concurrent_first_uses_build_one_instance(wow):
    runtime = get_runtime()
    barrier = threading.Barrier(8, timeout=60)
    seen = []

    def first_use():
        barrier.wait()
        seen.append((runtime.event_store, runtime.gateway))

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(store) for store, _ in seen}) == 1 and len({id(g) for _, g in seen}) == 1


def test_building_a_slow_part_does_not_block_the_others(wow_memory, monkeypatch):
    """Building may talk to a server (schema checks): other parts must not wait on it."""
    started, release = threading.Event(), threading.Event()
    build = MemoryBackend.prepare_key

    def slow_prepare_key(self, name):
        started.set()
        assert release.wait(10)
        return build(self, name)

    monkeypatch.setattr(MemoryBackend, "prepare_key", slow_prepare_key)
    runtime = get_runtime()
    slow = threading.Thread(target=runtime.prepare_key, args=("username",))
    slow.start()
    try:
        assert started.wait(10)
        got = []
        other = threading.Thread(target=lambda: got.append(runtime.event_store))
        other.start()
        other.join(5)
        assert got, "building the event store waited for another part's build"
    finally:
        release.set()
        slow.join(10)


def test_a_settings_change_closes_the_runtime_and_the_next_call_builds_a_new_one():
    with override_settings(WOW=fresh_wow("in_memory", EVENT_STORE_BATCH={"ENABLED": True})):
        old = get_runtime()
        store = old.event_store
        assert isinstance(store, BatchingEventStore)
        store.append(make_stream(AggregateId("order", "o-1"), 1))
        with override_settings(WOW=fresh_wow("in_memory")):
            new = get_runtime()
            assert new is not old and new.event_store is not store
            with pytest.raises(RuntimeError, match="closed"):
                _ = old.gateway
            with pytest.raises(RecoverableStoreError, match="closed"):  # its batcher was flushed and stopped
                store.append(make_stream(AggregateId("order", "o-2"), 1))
        assert get_runtime() is not old


def test_close_runtime_drains_the_dispatch_then_closes_the_parts(wow):
    # The dispatch lanes hold work with SNAPSHOT_MODE "inline" (the snapshot follower is a follower thread).
    with override_settings(WOW={**wow, "SNAPSHOT_MODE": "inline"}):
        _close_runtime_drains_the_dispatch(wow)


def _close_runtime_drains_the_dispatch(wow):
    runtime = get_runtime()
    gateway = runtime.gateway
    release = threading.Event()
    seen = []

    @projection("order")
    def slow(message):
        release.wait(5)
        seen.append((message.version, get_runtime() is runtime))

    result = send(ORDER, wait=WaitStage.PROCESSED)
    running = [t for t in gateway.dispatcher._threads if t is not None]
    assert len(running) == 1 and running[0].is_alive()
    threading.Timer(0.1, release.set).start()
    close_runtime()
    assert seen == [(1, True)]  # the queued projection ran, on the closing runtime's parts
    assert not running[0].is_alive()
    assert gateway.dispatcher._threads == [None] * gateway.dispatcher.lane_count
    assert get_runtime() is not runtime
    with pytest.raises(RuntimeError, match="closed"):
        _ = runtime.event_store
    if wow["STORAGE"] == "mongo":  # the connection is the process's: the next runtime reads what this one wrote
        assert get_runtime().event_store.last(AggregateId("order", result.aggregate_id)).version == 1


EXIT_SCRIPT = """
import sys, time
import django
from django.conf import settings

settings.configure(INSTALLED_APPS=["wow_django"], USE_TZ=True, WOW={"STORAGE": "in_memory"})
django.setup()
from decimal import Decimal
from sample_project.orders.aggregates import Order, OrderLine, PlaceOrder
from wow_django.application import get_runtime
from wow_django.domain import event_processor

@event_processor(Order)
def slow(message):
    time.sleep(0.5)
    with open(sys.argv[1], "a") as out:
        out.write(message.name + "\\n")

get_runtime().gateway.send(PlaceOrder(customer_id="c", items=[OrderLine(sku="A", quantity=1, unit_price=Decimal(1))]))
sys.exit(0)  # answered at stage PROCESSED: the processor has not run yet
"""


def test_a_process_that_exits_runs_what_its_dispatch_still_holds(tmp_path):
    """A gunicorn worker recycled right after answering a command: its event processors still run."""
    import subprocess
    import sys

    out = tmp_path / "processed.txt"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": ""}
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(out)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "order_placed\n"


def test_a_celery_pool_process_drains_its_dispatch_when_it_shuts_down(wow):
    """Pool processes leave with os._exit: ``worker_process_shutdown`` closes the runtime first."""
    from celery.signals import worker_process_shutdown

    import wow_django.tasks  # noqa: F401 - connects the signal, as the worker's autodiscovery does

    runtime = get_runtime()
    seen = []

    @projection("order")
    def slow(message):
        threading.Event().wait(0.3)
        seen.append(message.version)

    send(ORDER, wait=WaitStage.PROCESSED)
    worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
    assert seen == [1] and runtime.closed


@pytest.mark.django_db(transaction=True, databases=["default", "wow_pg"])
def test_a_follower_thread_does_not_keep_a_connection_the_database_dropped(wow_memory):
    """Between two commands the server ends the session of the thread running a projection (a restart, a
    failover): the next projection works on a new connection instead of failing on the dropped one.
    (The sample's own projection writes to ``default``, hence that database too.)"""
    import psycopg
    from django.db import connections

    seen: list = []

    @projection("order")
    def on_pg(message):
        try:
            with connections["wow_pg"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                seen.append(cursor.fetchone()[0])
        except Exception as exc:
            seen.append(exc)
            raise

    send(ORDER, wait=WaitStage.PROJECTED)
    settings = connections["wow_pg"].settings_dict
    with psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                         password=settings["PASSWORD"] or None, dbname=settings["NAME"], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [seen[0]])
    result = send(ORDER, wait=WaitStage.PROJECTED)
    assert result.succeeded, result.error_msg
    assert len(seen) == 2 and isinstance(seen[1], int) and seen[1] != seen[0]


@pytest.mark.django_db(transaction=True, databases=["default", "wow_pg"])
def test_a_follower_thread_keeps_its_connection_between_cycles(wow_memory):
    """With CONN_MAX_AGE 0 (Django's default) a follower does not reconnect at every poll: the projection
    sees the same database session across commands and the idle polls between them."""
    from django.db import connections

    assert connections["wow_pg"].settings_dict["CONN_MAX_AGE"] == 0
    seen: list = []

    @projection("order")
    def on_pg(message):
        with connections["wow_pg"].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            seen.append(cursor.fetchone()[0])

    send(ORDER, wait=WaitStage.PROJECTED)
    time.sleep(0.3)  # idle cycles of the follower
    send(ORDER, wait=WaitStage.PROJECTED)
    assert len(seen) == 2 and seen[0] == seen[1]


def test_celery_mode_snapshot_requests_queued_before_a_close_are_all_made(recording_queue):
    with override_settings(WOW=fresh_wow("in_memory", TASK_QUEUE=f"{__name__}.RecordingTaskQueue",
                                         SNAPSHOT_MODE="celery")):
        ids = [send(ORDER).aggregate_id for _ in range(3)]
    requested = [g[2] for g in recording_queue.given if g[0] == "request_snapshot"]
    assert sorted(requested) == sorted(ids)


def test_a_forked_child_builds_its_own_runtime(wow):
    parent = get_runtime()
    parent_store = parent.event_store

    def probe():
        child = get_runtime()
        return (child is not parent, child.event_store is not parent_store)

    assert in_forked_child(probe) == (True, True)
    assert get_runtime() is parent  # the parent keeps its own


def test_ids_reseed_after_fork_without_a_runtime():
    """The domain is used without Django too: its id generator reseeds itself in a forked child."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from wow_django.domain.ids import generate_id\n"
        "assert 'wow_django.application.runtime' not in sys.modules\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, generate_id().encode()); os._exit(0)\n"
        "os.close(w); child = os.read(r, 64).decode(); os.waitpid(pid, 0)\n"
        "print(child[16:] != generate_id()[16:])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_a_forked_child_does_not_repeat_the_parents_ids():
    from wow_django.domain.ids import generate_id

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then leave at once
        try:
            os.write(write, generate_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent_id = generate_id()
    # Without reseeding, both would draw the same 64 random bits next.
    assert len(child_id) == 32 and child_id[16:] != parent_id[16:]


# --- the task queue port ------------------------------------------------------------------------


def test_a_sent_command_goes_to_the_task_queue(recording_queue):
    result = send(ORDER, request_id="req-q", wait=WaitStage.SENT)
    assert result.stage is WaitStage.SENT and result.aggregate_version is None
    assert recording_queue.given == [("process_command", "place_order", "req-q")]


def test_celery_mode_snapshots_are_requested_from_the_task_queue(recording_queue):
    with override_settings(WOW=fresh_wow("in_memory", TASK_QUEUE=f"{__name__}.RecordingTaskQueue",
                                         SNAPSHOT_MODE="celery")):
        result = send(ORDER, wait=WaitStage.SNAPSHOT)
        assert ("request_snapshot", "order", result.aggregate_id) in recording_queue.given
        assert get_runtime().snapshot_store.load(AggregateId("order", result.aggregate_id)) is None


def test_bus_feedback_queues_its_rollup_and_rolls_up_inline_when_the_queue_fails(recording_queue):
    bus = get_runtime().bus
    bus.set_topic_consumer("order.purchased", "member-service")
    bus.send("order.purchased", {"orderId": "o-1"}, event_id="evt-port")
    bus.record_feedback("evt-port", "member-service", True)
    assert recording_queue.given == [("rollup", "evt-port")]
    assert bus.store.get_event("evt-port")["status"] == "SENT"  # queued, not run
    recording_queue.fail_rollups = True
    bus.record_feedback("evt-port", "member-service", True)
    assert bus.store.get_event("evt-port")["status"] == "CONSUMED"  # rolled up inline


def test_a_rollup_the_queue_does_not_take_is_rolled_up_by_the_bus_that_asked(recording_queue):
    bus = get_runtime().bus
    bus.set_topic_consumer("order.purchased", "member-service")
    bus.send("order.purchased", {"orderId": "o-2"}, event_id="evt-eager")
    recording_queue.take_rollups = False  # e.g. Celery in eager mode
    with override_settings(WOW=fresh_wow("in_memory")):  # another runtime is current now
        bus.record_feedback("evt-eager", "member-service", True)
        assert get_runtime().bus is not bus
    assert bus.store.get_event("evt-eager")["status"] == "CONSUMED"  # on this bus's own store


def test_a_task_queue_that_does_not_import_or_is_not_a_task_queue_is_a_check_error():
    with override_settings(WOW={"TASK_QUEUE": "no.such.Queue"}):
        [error] = check_settings()
        assert error.id == "wow_django.E001" and "TASK_QUEUE" in error.msg
    with override_settings(WOW={"TASK_QUEUE": "decimal.Decimal"}):
        [error] = check_settings()
        assert error.id == "wow_django.E001" and "TaskQueue subclass" in error.msg


def test_a_forked_child_sends_commands_through_its_own_batcher_and_dispatch():
    """What the removed pid checks guarded: the parent's lanes and dispatch threads do not exist in a child."""
    settings = fresh_wow("mongo", EVENT_STORE_BATCH={"ENABLED": True})
    with override_settings(WOW=settings):
        placed = send(ORDER, wait=WaitStage.SNAPSHOT)  # the parent's batcher lane and dispatch lane run
        assert placed.succeeded

        def probe():
            result = send(ORDER, wait=WaitStage.SNAPSHOT)
            snapshot = get_runtime().snapshot_store.load(AggregateId("order", result.aggregate_id))
            return (result.succeeded, result.stage is WaitStage.SNAPSHOT, snapshot is not None)

        assert in_forked_child(probe) == (True, True, True)

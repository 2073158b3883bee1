"""Celery tasks through a real worker and a real Redis broker.

The embedded Mongo engine lives in this process, so the worker runs here too,
as Celery's testing worker thread; the broker and result backend are the Redis
on 127.0.0.1 (``.ci/run`` starts it). ``WOW_TEST_REDIS_URL`` overrides.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from celery import Celery, current_app
from celery import _state as celery_state
from celery.contrib.testing.worker import start_worker
from django.core.cache import cache
from django.test import override_settings

from sample_project.orders.aggregates import ChangeDisplayName, OrderLine, PayOrder, PlaceOrder, RegisterCustomer
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.persistence.records import AggregateId

from .support import fresh_wow, wait_for
from .workers import redis_url

pytestmark = pytest.mark.integration

REDIS_URL = redis_url()


@pytest.fixture(scope="module")
def worker():
    """A Celery app of this module's own, current while it runs, with a worker thread.

    Its own app: the project's app may already hold an eager-mode broker pool
    and result backend. Its own queue: another test run on the machine (sharing
    the Redis) must not take these tasks, whose data lives in this process.
    """
    queue = f"wow-test-{uuid.uuid4().hex[:12]}"
    app = Celery("wow-tests", set_as_current=False)
    app.conf.update(broker_url=REDIS_URL, result_backend=REDIS_URL, task_default_queue=queue,
                    task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    app.autodiscover_tasks(["wow_django"], force=True)  # what a project's Celery app does
    previous_current = current_app._get_current_object()
    previous_default = celery_state.default_app
    app.set_current()
    try:
        # start_worker also makes its app the process default (seen by every
        # thread, e.g. the dispatcher's): both are put back afterwards.
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False, queues=[queue],
                          shutdown_timeout=10) as running:
            yield running
    finally:
        previous_current.set_current()
        celery_state.set_default_app(previous_default)
        app.close()


def test_sent_commands_are_processed_by_the_worker(worker):
    with override_settings(WOW=fresh_wow("mongo")):
        gateway = get_runtime().gateway
        items = [OrderLine(sku="A", quantity=2, unit_price=Decimal("5"))]
        sent = gateway.send(PlaceOrder(customer_id="c-1", items=items), request_id="celery-req-1",
                            wait=WaitStage.SENT)
        assert sent.stage is WaitStage.SENT and sent.aggregate_version is None
        key = AggregateId("order", sent.aggregate_id)
        stream = wait_for(lambda: get_runtime().event_store.last(key))
        assert stream.version == 1 and stream.request_id == "celery-req-1"
        paid = gateway.send(PayOrder(amount=Decimal("10"), payment_id="p"), aggregate_id=sent.aggregate_id,
                            wait=WaitStage.SENT)
        wait_for(lambda: get_runtime().event_store.last(key).version == 2)
        # Queue the first command again (a redelivery): recognised, nothing appended.
        from wow_django.tasks import process_command

        redelivered = process_command.apply_async(({
            "aggregate_name": "order", "command_name": "place_order",
            "body": {"customer_id": "c-1", "items": [{"sku": "A", "quantity": 2, "unit_price": "5"}],
                     "currency": "CNY"},
            "aggregate_id": sent.aggregate_id, "request_id": "celery-req-1", "command_id": sent.command_id,
            "request_id_given": True, "tenant_id": "(0)", "owner_id": "", "operator": "", "header": {},
        },), ignore_result=False).get(timeout=20)
        # The stored events are this very command's (same command id): its first result, nothing appended.
        assert redelivered["aggregateVersion"] == 1 and redelivered["errorCode"] == "Ok"
        assert redelivered["commandId"] == sent.command_id
        first, second = get_runtime().event_store.load(key)
        assert (first.version, first.command_id) == (1, sent.command_id)
        assert (second.version, second.request_id, second.command_id) == (2, paid.request_id, paid.command_id)


def test_tasks_the_application_queues_store_no_result(worker, monkeypatch):
    """A SENT command and its snapshot request leave nothing in the result backend (nobody reads them)."""
    import redis

    from wow_django import tasks

    queued = []
    for task in (tasks.process_command, tasks.save_snapshot):
        def delay(*args, _task=task):
            result = _task.apply_async(args)  # what .delay does, keeping the AsyncResult
            queued.append((_task.name, result))
            return result
        monkeypatch.setattr(task, "delay", delay)
    cache.clear()
    with override_settings(WOW=fresh_wow("mongo", SNAPSHOT_MODE="celery")):
        gateway = get_runtime().gateway
        items = [OrderLine(sku="A", quantity=1, unit_price=Decimal("5"))]
        sent = gateway.send(PlaceOrder(customer_id="c-1", items=items), wait=WaitStage.SENT)
        key = AggregateId("order", sent.aggregate_id)
        wait_for(lambda: get_runtime().snapshot_store.load(key), what="the queued command's snapshot")
    assert [name for name, _ in queued] == ["wow_django.process_command", "wow_django.save_snapshot"]
    backend = redis.Redis.from_url(REDIS_URL)
    for name, result in queued:
        assert not backend.exists(worker.app.backend.get_key_for_task(result.id)), name
    # The tasks an operator queues keep theirs (checked by test_rebuild_task_on_the_worker's .get()).
    assert tasks.rebuild_snapshots.ignore_result is False and tasks.repush_event.ignore_result is False
    assert all(t.ignore_result for t in (tasks.process_command, tasks.save_snapshot, tasks.rollup_event,
                                         tasks.relay_pending, tasks.resweep_statuses, tasks.follow))
    cache.clear()


def test_refused_queued_command_reports_its_error(worker):
    with override_settings(WOW=fresh_wow("mongo")):
        from wow_django.tasks import process_command

        result = process_command.apply_async(({
            "aggregate_name": "order", "command_name": "pay_order", "body": {"amount": "1", "payment_id": "p"},
            "aggregate_id": "missing-order", "request_id": "r-x", "command_id": "c-x", "request_id_given": True,
        },), ignore_result=False).get(timeout=20)
        assert result["errorCode"] == "NotFound" and "does not exist" in result["errorMsg"]


def test_a_sent_command_the_worker_refuses_can_be_looked_up_by_its_request_id(worker):
    """Answered SENT, refused later on the worker: the client learns it from the status lookup (issue 13)."""
    with override_settings(WOW=fresh_wow("mongo")):
        gateway = get_runtime().gateway
        sent = gateway.send(PayOrder(amount=Decimal("1"), payment_id="p"), aggregate_id="missing-order",
                            request_id="celery-refused-1", wait=WaitStage.SENT)
        assert sent.stage is WaitStage.SENT
        status = wait_for(lambda: (found := gateway.status("order", "celery-refused-1", tenant_id=sent.tenant_id))
                          and found.stage is not WaitStage.SENT and found, what="the worker's outcome")
        assert (status.stage, status.error_code) == (WaitStage.PROCESSED, "NotFound")
        assert "does not exist" in status.error_msg and status.command_id == sent.command_id
        items = [OrderLine(sku="A", quantity=1, unit_price=Decimal("5"))]
        placed = gateway.send(PlaceOrder(customer_id="c-1", items=items), request_id="celery-ok-1",
                              wait=WaitStage.SENT)
        done = wait_for(lambda: (found := gateway.status("order", "celery-ok-1", tenant_id=placed.tenant_id))
                        and found.stage is not WaitStage.SENT and found, what="the worker's outcome")
        assert done.succeeded and done.aggregate_version == 1 and done.aggregate_id == placed.aggregate_id


def test_snapshot_tasks_run_on_the_worker_and_coalesce(worker, monkeypatch):
    """Snapshot requests for one aggregate while its task is pending queue one task; the worker runs it."""
    from wow_django import tasks

    def send_to_worker(*args):  # the gateway's requests store no result: this one asks for it
        return tasks.save_snapshot.apply_async(args, ignore_result=False)

    held: list[tuple] = []  # queued tasks, held back until every request was made
    monkeypatch.setattr(tasks.save_snapshot, "delay", lambda *args: held.append(args))
    cache.clear()
    with override_settings(WOW=fresh_wow("mongo", SNAPSHOT_MODE="celery")):
        gateway = get_runtime().gateway
        # Wait stage SNAPSHOT: each send returns once its snapshot request was made.
        customer = gateway.send(RegisterCustomer(username="worker", display_name="w"),
                                wait=WaitStage.SNAPSHOT).aggregate_id
        for n in range(5):
            gateway.send(ChangeDisplayName(display_name=f"n{n}"), aggregate_id=customer, wait=WaitStage.SNAPSHOT)
        key = AggregateId("customer", customer)
        assert held == [("customer", customer)]  # six requests, one task
        assert get_runtime().snapshot_store.load(key) is None
        assert send_to_worker(*held.pop()).get(timeout=20) == 6  # the worker runs it
        snapshot = get_runtime().snapshot_store.load(key)
        assert (snapshot.version, snapshot.state["display_name"]) == (6, "n4")
        # The task cleared the marker when it started: the next request queues a new task.
        gateway.send(ChangeDisplayName(display_name="n5"), aggregate_id=customer, wait=WaitStage.SNAPSHOT)
        assert held == [("customer", customer)]
        assert send_to_worker(*held.pop()).get(timeout=20) == 7
        assert get_runtime().snapshot_store.load(key).state["display_name"] == "n5"
    cache.clear()


def test_rebuild_task_on_the_worker(worker):
    with override_settings(WOW=fresh_wow("mongo", SNAPSHOT_STRATEGY="none")):
        gateway = get_runtime().gateway
        ids = [gateway.send(RegisterCustomer(username=f"rb{n}", display_name="x")).aggregate_id for n in range(3)]
        from wow_django.tasks import rebuild_snapshots

        assert rebuild_snapshots.delay("customer").get(timeout=20) == 3
        assert all(get_runtime().snapshot_store.load(AggregateId("customer", i)).version == 1 for i in ids)


def test_recoverable_store_errors_are_retried_by_the_worker(worker, monkeypatch):
    from wow_django import tasks
    from wow_django.exceptions import RecoverableStoreError

    real = tasks.refresh_snapshot
    calls = []

    def flaky(*args):
        calls.append(args[2])
        if len(calls) < 3:
            raise RecoverableStoreError("primary stepped down")
        return real(*args)

    monkeypatch.setattr(tasks, "refresh_snapshot", flaky)
    # Keep the test fast: retry at once instead of exponential backoff.
    monkeypatch.setattr(tasks.save_snapshot, "retry_backoff", False)
    monkeypatch.setattr(tasks.save_snapshot, "default_retry_delay", 0)
    with override_settings(WOW=fresh_wow("mongo", SNAPSHOT_STRATEGY="none")):
        customer = get_runtime().gateway.send(RegisterCustomer(username="flaky", display_name="f")).aggregate_id
        assert tasks.save_snapshot.apply_async(("customer", customer), ignore_result=False).get(timeout=20) == 1
        assert len(calls) == 3
        assert get_runtime().snapshot_store.load(AggregateId("customer", customer)).version == 1


def test_the_follow_task_runs_followers_on_the_worker(worker):
    """FOLLOWERS_RUN="celery": nothing runs the projection where the command is handled; beat's task does."""
    from wow_django.domain import projection
    from wow_django.tasks import follow

    with override_settings(WOW=fresh_wow("in_memory", FOLLOWERS_RUN="celery")):
        seen: list[int] = []

        @projection("order")
        def record(message):
            seen.append(message.version)

        gateway = get_runtime().gateway
        placed = gateway.send(PlaceOrder(customer_id="c-1", items=[OrderLine(sku="A", quantity=1,
                                                                              unit_price=Decimal("5"))]))
        assert seen == [] and get_runtime().follower_threads.names() == []
        follow.delay(names=["projection-order-record"], budget_s=10)
        wait_for(lambda: seen == [1], what="the worker ran the projection")
        state = wait_for(lambda: get_runtime().follower_store.get("projection-order-record"))
        assert state.position == get_runtime().stream_feed.position_of("order", placed.aggregate_id, 1)

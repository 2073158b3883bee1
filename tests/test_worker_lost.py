"""A Celery pool process killed while it runs a queued command: the command is redelivered and runs.

``process_command`` (a command answered at ``SENT``) and the bus rollup acknowledge late; without
``reject_on_worker_lost`` a killed pool process makes Celery acknowledge the message as failed and the
command, already answered 202, never runs (issue 12, item 19). Real processes: a prefork worker with one
pool process on Redis, the sample on PostgreSQL; the first run of the task is slowed down
(``tests.worker_app``) so the test can SIGKILL the pool process in the middle of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.pg import pg_connect_kwargs, scratch_database
from tests.workers import redis_url

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = redis_url()

pytestmark = [pytest.mark.integration, pytest.mark.deep]  # a kill test: the deep tier


def test_the_queued_tasks_ask_for_redelivery_when_their_worker_is_lost():
    from wow_django.tasks import process_command, rollup_event

    for task in (process_command, rollup_event):
        assert task.acks_late and task.reject_on_worker_lost, task.name


@pytest.fixture
def lost_env(tmp_path):
    cleanup = contextlib.ExitStack()
    database = cleanup.enter_context(scratch_database("test_wow_lost"))
    queue = f"wow-lost-{uuid.uuid4().hex[:10]}"
    slow = tmp_path / "slow"
    slow.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("WOW_MONGO", "SAMPLE_", "CELERY_"))},
           "DJANGO_SETTINGS_MODULE": "tests.worker_lost_settings", "WOW_KILL_PG_DB": database,
           "WOW_TEST_QUEUE": queue, "WOW_TEST_SLOW_TASKS": str(slow), "WOW_TEST_SLOW_TASK_S": "60",
           "WOW_TEST_REDIS_URL": REDIS_URL, "PYTHONUNBUFFERED": "1"}
    try:
        yield env, database, queue, slow
    finally:
        cleanup.close()  # the database
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        client.delete(queue)
        client.close()


def manage(env, *args, timeout=120) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_until(predicate, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"{what} within {timeout}s; the worker's log:\n{log.read_text()[-5000:]}")


SEND = """
from decimal import Decimal
from sample_project.orders.aggregates import OrderLine, PlaceOrder
from wow_django.application import WaitStage, get_runtime
sent = get_runtime().gateway.send(PlaceOrder(customer_id="c-lost", items=[OrderLine(sku="A", quantity=1,
    unit_price=Decimal("2.00"))]), request_id="lost-1", wait=WaitStage.SENT)
print("SENT", sent.stage.name, sent.aggregate_id)
"""


def test_a_killed_pool_process_does_not_lose_a_sent_command(lost_env, tmp_path):
    env, database, queue, slow = lost_env
    manage(env, "migrate", "-v0")
    log_path = tmp_path / "worker.log"
    log = open(log_path, "w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "sample_project", "worker", "-P", "prefork", "-c", "1", "-Q", queue,
         "-n", f"{queue}@%h", "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "ready." in log_path.read_text(), 60, "the worker did not start", log_path)
        out = manage(env, "shell", "-c", SEND)
        stage, aggregate_id = out.split("SENT", 1)[1].split()
        assert stage == "SENT"  # answered: the command is only queued

        marker = wait_until(lambda: next(slow.iterdir(), None), 60, "the task did not start", log_path)
        pool_pid = int(wait_until(lambda: marker.read_text(), 10, "the pool process wrote no pid", log_path))
        assert pool_pid != worker.pid
        os.kill(pool_pid, signal.SIGKILL)  # mid-task: nothing appended yet, the message not acknowledged

        def stored():
            with psycopg.connect(dbname=database, autocommit=True, **pg_connect_kwargs()) as conn:
                return conn.execute("SELECT version, request_id FROM wow_event_stream WHERE aggregate_id = %s",
                                    [aggregate_id]).fetchall()

        rows = wait_until(stored, 90, "the command was not redelivered and run", log_path)
        assert rows == [(1, "lost-1")]
        assert "WorkerLostError" in log_path.read_text()  # it was the kill, and Celery saw it
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()

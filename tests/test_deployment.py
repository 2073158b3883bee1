"""The sample order service deployed as separate OS processes on PostgreSQL, Redis and RabbitMQ.

One fresh PostgreSQL database holds everything (storage ``django``); the
processes run with ``tests.deploy_settings``:

- gunicorn with two workers serving the sample project;
- a Celery worker (prefork, two children) for commands sent with wait stage
  SENT and for snapshots (``SNAPSHOT_MODE="celery"``);
- a Celery worker with one child on the bus rollup queue;
- celery beat, scheduling the relay of PENDING bus events every 2 s;
- ``manage.py wow_consume member-service`` and ``... message-service``.

Over HTTP the test places and pays orders (some with ``Command-Wait-Stage: SENT``,
processed by the worker), waits until every event of every purchase is
CONSUMED and checks each consumer's effects exactly once. Then the database
drops every session, and while more orders are paid message-service's
consumer is killed with SIGKILL; it is restarted and the same checks run
again: nothing lost, nothing applied twice. Throughout, gunicorn recycles its
workers every few requests (``--max-requests``).

Everything the test creates is named after its run (database, Celery queues,
cache keys, bus exchange and queues) and removed afterwards. ``.ci/run``
starts the servers; ``WOW_TEST_PG_*``, ``WOW_TEST_AMQP_URL`` and
``WOW_DEPLOY_REDIS_URL`` override their addresses.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from decimal import ROUND_DOWN, Decimal
from pathlib import Path

import gunicorn.config
import psycopg
import pytest
import redis

from wow_django.testing.bus import amqp_url, delete_amqp_entities, queue_depth, unique_exchange

from .pg import pg_connect_kwargs, scratch_database
from .workers import redis_url

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("WOW_DEPLOY_REDIS_URL") or redis_url()
PG = pg_connect_kwargs()
MEMBER, MESSAGE = "member-service", "message-service"
PURCHASED, POINTS_ADDED, NOTIFICATION_SENT = "order.purchased", "points.added", "notification.sent"
ADMIN = ("e2e-admin", "e2e-password")
UNIT_PRICE = Decimal("12.35")
FIRST_BATCH, SECOND_BATCH = 10, 12
STARTUP_S, SETTLE_S = 90.0, float(os.environ.get("WOW_DEPLOY_SETTLE_S", "120"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gunicorn_options() -> list[str]:
    # Newer versions open a control socket in the home directory, which concurrent runs would share.
    return ["--no-control-socket"] if "control_socket_disable" in gunicorn.config.Config().settings else []


class Deployment:
    """The processes of one run: started in their own process groups, output to a file each."""

    def __init__(self, log_dir: Path, env: dict[str, str]):
        self.log_dir = log_dir
        self.env = env
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.killed: set[str] = set()

    def run(self, name: str, args: list[str], timeout: float = 180.0) -> str:
        """Run a command to its end; its output (failing the test if it fails)."""
        log = self.log_dir / f"{name}.log"
        self.logs[name] = log
        with log.open("w") as out:
            done = subprocess.run(args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout, start_new_session=True)
        output = log.read_text()
        assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{output[-3000:]}"
        return output

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        self.logs[name] = log
        with log.open("w") as out:
            process = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.processes[name] = process
        return process

    def output(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if name not in self.killed and process.poll() is not None:
                raise AssertionError(f"{name} exited with {process.returncode}:\n{self.output(name)[-3000:]}")

    def wait_for(self, predicate, what: str, timeout: float, describe=None):
        """Poll ``predicate`` until it is truthy (its value); fail when a process died or after ``timeout``
        (saying what ``describe()`` returns)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f}s" + (f"; {describe()}" if describe else ""))
            time.sleep(0.2)

    def wait_for_output(self, name: str, text: str, timeout: float = STARTUP_S) -> None:
        self.wait_for(lambda: text in self.output(name), f"{name} printing {text!r}", timeout)

    def kill(self, name: str) -> None:
        """SIGKILL the process group of ``name`` (no chance to finish anything)."""
        process = self.processes[name]
        self.killed.add(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def stop_all(self) -> None:
        running = [p for p in self.processes.values() if p.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes.values():
            # The group too: a Celery or gunicorn child left behind by its parent.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)

    def tails(self, lines: int = 60) -> str:
        parts = []
        for name, log in self.logs.items():
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            parts.append(f"===== {name} ({log}) — last {lines} of {len(text)} lines =====")
            parts.extend(text[-lines:])
        return "\n".join(parts)


class Api:
    """JSON over HTTP to the served sample project."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        token = base64.b64encode(":".join(ADMIN).encode()).decode()
        self.auth = {"Authorization": f"Basic {token}"}

    def call(self, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        # Every call signed in as the admin: the sample deployed (DEBUG off) lets no anonymous client in.
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **self.auth, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - localhost only
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, text

    def ok(self, method: str, path: str, body=None, headers: dict | None = None):
        status, answer = self.call(method, path, body, headers)
        assert 200 <= status < 300, f"{method} {path}: {status} {answer}"
        return answer

    def ready(self) -> bool:
        try:
            return self.call("GET", "/bus/events/?size=1")[0] == 200
        except OSError:
            return False

    def events(self, topic: str) -> list[dict]:
        found, page = [], 1
        while True:
            answer = self.ok("GET", f"/bus/events/?topic={topic}&size=200&page={page}")
            found.extend(answer["list"])
            if len(found) >= answer["total"] or not answer["list"]:
                return found
            page += 1


class Shop:
    """Places and pays orders over HTTP, remembering what each payment should cause."""

    def __init__(self, api: Api, run: str):
        self.api = api
        self.run = run
        self.amounts: dict[str, Decimal] = {}  # order id → total, of every order placed
        self.paid: dict[str, Decimal] = {}  # order id → amount, of the orders paid
        self.customers: dict[str, str] = {}  # order id → customer id
        self.count = 0

    def place(self) -> str:
        n = self.count
        self.count += 1
        customer = f"user-{n % 4}"
        body = {"customer_id": customer, "currency": "EUR",
                "items": [{"sku": f"SKU-{n}", "quantity": n % 3 + 1, "unit_price": str(UNIT_PRICE)}]}
        if n % 4 == 3:  # queued: the worker creates it under the id derived from the request id
            answer = self.api.ok("POST", "/api/order/place_order", body,
                                 {"Command-Wait-Stage": "SENT", "Command-Request-Id": f"place-{self.run}-{n}"})
            assert answer["stage"] == "SENT" and answer["aggregateVersion"] is None
            order = answer["aggregateId"]
        else:
            answer = self.api.ok("POST", "/api/order/place_order", body)
            assert answer["aggregateVersion"] == 1, answer
            order = answer["aggregateId"]
        self.customers[order] = customer
        self.amounts[order] = (UNIT_PRICE * (n % 3 + 1)).quantize(Decimal("0.01"))
        return order

    def pay(self, order: str, n: int) -> None:
        amount = self.amounts[order]
        if n % 3 == 0:  # queued: processed by the Celery worker
            # A queued create may not have run yet: the payment waits for the order to exist.
            deadline = time.monotonic() + 30
            while self.api.call("GET", f"/api/order/{order}/state")[0] != 200:
                assert time.monotonic() < deadline, f"order {order} was not created"
                time.sleep(0.1)
            answer = self.api.ok("POST", f"/api/order/{order}/pay_order",
                                 {"amount": str(amount), "payment_id": f"pay-{order}"},
                                 {"Command-Wait-Stage": "SENT", "Command-Request-Id": f"pay-{self.run}-{order}"})
            assert answer["stage"] == "SENT", answer
            self.paid[order] = amount
            return
        deadline = time.monotonic() + 30
        while True:
            status, answer = self.api.call("POST", f"/api/order/{order}/pay_order",
                                           {"amount": str(amount), "payment_id": f"pay-{order}"},
                                           {"Command-Request-Id": f"pay-{self.run}-{order}"})
            if status == 404 and time.monotonic() < deadline:  # its queued create has not run yet
                time.sleep(0.1)
                continue
            assert status == 200 and answer["aggregateVersion"] == 2, (status, answer)
            self.paid[order] = amount
            return


def expected_points(amount: Decimal) -> int:
    return int(amount.to_integral_value(rounding=ROUND_DOWN))


class Database:
    """What the processes stored, read straight from PostgreSQL."""

    def __init__(self, name: str):
        self.connection = psycopg.connect(dbname=name, autocommit=True, **PG)

    def rows(self, sql: str, *params) -> list[tuple]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def status_counts(self) -> Counter:
        return Counter({(topic, status): n for topic, status, n in self.rows(
            "SELECT topic, status, count(*) FROM wow_bus_event GROUP BY topic, status")})

    def settled(self, orders: int) -> bool:
        """Every purchase of ``orders`` paid orders and all its events are CONSUMED."""
        counts = self.status_counts()
        expected = {(PURCHASED, "CONSUMED"): orders, (POINTS_ADDED, "CONSUMED"): orders,
                    (NOTIFICATION_SENT, "CONSUMED"): 2 * orders}
        return counts == expected

    def unsettled(self, paid) -> str:
        """What is missing: events not CONSUMED by status, and paid orders without their order.purchased."""
        published = {order for (order,) in self.rows(
            "SELECT payload->>'orderId' FROM wow_bus_event WHERE topic = %s", PURCHASED)}
        return (f"events by topic and status: {dict(self.status_counts())}; "
                f"paid orders without {PURCHASED}: {sorted(set(paid) - published)}")

    def close(self) -> None:
        self.connection.close()


def check_effects(api: Api, db: Database, shop: Shop) -> None:
    """Every paid order has one order.purchased, CONSUMED by both consumers, and each effect exactly once."""
    purchased = api.events(PURCHASED)
    by_order = Counter(event["payload"]["orderId"] for event in purchased)
    assert by_order == Counter(set(shop.paid)), "one order.purchased per paid order"
    for event in purchased:
        assert event["status"] == "CONSUMED" and event["consumption"]["text"] == "2/2 consumed", event
        assert event["payload"]["userId"] == shop.customers[event["payload"]["orderId"]]
        assert Decimal(event["payload"]["amount"]) == shop.paid[event["payload"]["orderId"]]
    purchase_ids = {event["eventId"] for event in purchased}

    # member-service: one points entry per order.purchased, keyed by its idempotency key.
    points = db.rows("SELECT key, source_event_id, member_id, points, order_id FROM orders_pointsentry")
    assert Counter(row[1] for row in points) == Counter(purchase_ids)
    assert all(key == f"{MEMBER}:{source}" for key, source, *_ in points)
    balances = Counter()
    for order, amount in shop.paid.items():
        balances[shop.customers[order]] += expected_points(amount)
    stored = Counter()
    for _, _, member, value, _ in points:
        stored[member] += value
    assert stored == balances

    # message-service: one notice per order.purchased and one per points.added.
    points_added = {event_id for (event_id,) in db.rows(
        "SELECT event_id FROM wow_bus_event WHERE topic = %s", POINTS_ADDED)}
    assert len(points_added) == len(purchase_ids)
    notices = db.rows("SELECT key, source_event_id, template_id FROM orders_notice")
    assert Counter((source, template) for _, source, template in notices) == Counter(
        [(e, "order-purchased") for e in purchase_ids] + [(e, "points-added") for e in points_added])
    assert all(key == f"{MESSAGE}:{source}" for key, source, _ in notices)
    # member-service remembered each notified member.
    members = {member for (member,) in db.rows("SELECT user_id FROM orders_member")}
    assert members == {shop.customers[order] for order in shop.paid}

    # Every (event, consumer) pair reported success; the inbox marks each handled once.
    unfinished = db.rows(
        "SELECT e.event_id, c.value FROM wow_bus_event e CROSS JOIN LATERAL jsonb_array_elements_text(e.consumers) c "
        "WHERE NOT EXISTS (SELECT 1 FROM wow_bus_consumption r WHERE r.event_id = e.event_id "
        "AND r.consumer_id = c.value AND r.success)")
    assert unfinished == []
    inbox = db.rows("SELECT consumer_id, event_id, state FROM wow_bus_inbox")
    assert Counter((c, e) for c, e, _ in inbox).most_common(1)[0][1] == 1
    assert {state for *_, state in inbox} == {"done"}, Counter(state for *_, state in inbox)

    # The event store: two streams per order (placed, paid), whatever was queued or retried.
    streams = Counter(order for (order,) in db.rows(
        "SELECT aggregate_id FROM wow_event_stream WHERE aggregate_name = 'order'"))
    assert streams == Counter({order: 2 for order in shop.paid})


def snapshots_caught_up(db: Database, shop: Shop) -> bool:
    """The Celery worker saved each order's snapshot at version 2 (PAID)."""
    rows = db.rows("SELECT aggregate_id, version, state->>'status' FROM wow_snapshot WHERE aggregate_name = 'order'")
    return {order: (version, status) for order, version, status in rows} == {o: (2, "PAID") for o in shop.paid}


def clean_redis(run: str) -> None:
    """Delete the run's Celery queues and cache keys, and its workers' broadcast bindings."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"*{run}*"):
            client.delete(key)
        for key in client.scan_iter(match="_kombu.binding.*"):
            if client.type(key) == b"set":
                stale = [m for m in client.smembers(key) if run.encode() in m]
                if stale:
                    client.srem(key, *stale)
    finally:
        client.close()


@pytest.mark.timeout(1200)  # many processes, each step bounded on its own; 24 s on a fast machine, 88 s on a busy one
def test_the_sample_deployed_as_processes_delivers_every_purchase_exactly_once(tmp_path):
    run = f"{os.getpid()}x{uuid.uuid4().hex[:6]}"
    cleanup = contextlib.ExitStack()
    database = cleanup.enter_context(scratch_database("test_wow_deploy"))
    exchange = unique_exchange("wow.deploy")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WOW_MONGO", "SAMPLE_", "CELERY_"))},
        # DEBUG off as the sample reads it: its API closed to anonymous clients, tenants from memberships.
        "DJANGO_SETTINGS_MODULE": "tests.deploy_settings", "DJANGO_DEBUG": "0", "PYTHONUNBUFFERED": "1",
        "WOW_DEPLOY_RUN": run, "WOW_DEPLOY_PG_DB": database, "WOW_DEPLOY_REDIS_URL": REDIS_URL,
        "WOW_DEPLOY_AMQP_URL": amqp_url(), "WOW_DEPLOY_EXCHANGE": exchange,
    }
    deployment = Deployment(tmp_path, env)
    manage = [sys.executable, "manage.py"]
    celery = [sys.executable, "-m", "celery", "-A", "sample_project", "worker", "--loglevel", "INFO",
              "--without-gossip", "--without-mingle", "--without-heartbeat"]
    port = free_port()
    db = None
    try:
        started = time.monotonic()
        deployment.run("migrate", [*manage, "migrate", "--noinput", "-v", "0"])
        deployment.run("setup", [*manage, "shell", "-c", (
            "from django.contrib.auth import get_user_model\n"
            "from sample_project.orders.integration import configure_topic_consumers\n"
            "configure_topic_consumers()\n"
            f"admin = get_user_model().objects.create_superuser({ADMIN[0]!r}, 'e2e@example.invalid', {ADMIN[1]!r})\n"
            # The tenant its API requests act for (the sample's MembershipTenantResolver when DEBUG is off).
            "from sample_project.orders.models import TenantMembership\n"
            "TenantMembership.objects.create(user=admin, tenant_id='shop')\n"
        )])
        deployment.start("gunicorn", [sys.executable, "-m", "gunicorn", "sample_project.wsgi:application",
                                      "--bind", f"127.0.0.1:{port}", "--workers", "2", "--timeout", "60",
                                      "--graceful-timeout", "5", "--access-logfile", "-", *gunicorn_options(),
                                      # Workers recycled every few requests: a worker leaves right after
                                      # answering a payment whose event processor has yet to run.
                                      "--max-requests", "6", "--max-requests-jitter", "3"])
        deployment.start("worker", [*celery, "-Q", f"wow-deploy-{run}.celery", "-c", "2", "-n", f"cmd-{run}@%h"])
        deployment.start("rollup", [*celery, "-Q", f"wow-deploy-{run}.rollup", "-c", "1", "-n", f"rollup-{run}@%h"])
        deployment.start("beat", [sys.executable, "-m", "celery", "-A", "sample_project", "beat", "--loglevel", "INFO",
                                  "--schedule", str(tmp_path / "beat-schedule")])
        deployment.start(MEMBER, [*manage, "wow_consume", MEMBER])
        deployment.start(MESSAGE, [*manage, "wow_consume", MESSAGE])
        api = Api(port)
        deployment.wait_for(api.ready, "gunicorn answering", STARTUP_S)
        for name in ("worker", "rollup"):
            deployment.wait_for_output(name, " ready.")
        deployment.wait_for_output("beat", "beat: Starting")
        for name in (MEMBER, MESSAGE):
            deployment.wait_for_output(name, "Consuming ")
        print(f"deployment up after {time.monotonic() - started:.1f}s")
        db = Database(database)
        shop = Shop(api, run)

        # --- 1: orders placed and paid over HTTP, every purchase delivered -----------------------
        orders = [shop.place() for _ in range(FIRST_BATCH)]
        for n, order in enumerate(orders):
            shop.pay(order, n)
        deployment.wait_for(lambda: db.settled(len(shop.paid)), "every event of the first batch CONSUMED",
                            SETTLE_S, lambda: db.unsettled(shop.paid))
        check_effects(api, db, shop)
        deployment.wait_for(lambda: snapshots_caught_up(db, shop), "snapshots saved by the worker", SETTLE_S)
        print(f"first batch settled after {time.monotonic() - started:.1f}s")

        # The database drops every session (a restart, a failover, an idle-session killer): each process
        # connects again, the long-lived threads too (consumers, dispatch lanes).
        db.rows("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                "pg_backend_pid()", database)

        # --- 2: message-service killed (SIGKILL) while orders are paid, then restarted --------------
        orders = [shop.place() for _ in range(SECOND_BATCH)]
        notices_before = db.rows("SELECT count(*) FROM orders_notice")[0][0]
        killed = threading.Event()
        payment_errors: list[BaseException] = []

        def pay_all():
            try:
                for n, order in enumerate(orders):
                    if n == SECOND_BATCH // 2:
                        killed.wait(SETTLE_S)  # the rest is paid while message-service is down
                    shop.pay(order, n)
            except BaseException as exc:  # reported by the main thread
                payment_errors.append(exc)

        payer = threading.Thread(target=pay_all, name="payer", daemon=True)
        payer.start()
        try:
            # Killed once it has handled some of the new purchases.
            deployment.wait_for(lambda: payment_errors or db.rows("SELECT count(*) FROM orders_notice")[0][0]
                                >= notices_before + 2, "message-service handling the second batch", SETTLE_S)
            deployment.kill(MESSAGE)
        finally:
            killed.set()
            payer.join(SETTLE_S)
        assert not payer.is_alive() and not payment_errors, payment_errors
        # Every purchase is published; what message-service has not consumed waits in its queue.
        deployment.wait_for(lambda: sum(n for (topic, status), n in db.status_counts().items()
                                        if topic == PURCHASED and status != "PENDING") == len(shop.paid),
                            "every purchase of the second batch published", SETTLE_S)
        assert queue_depth(amqp_url(), exchange, MESSAGE) > 0
        deployment.start(f"{MESSAGE}-restarted", [*manage, "wow_consume", MESSAGE])
        deployment.wait_for_output(f"{MESSAGE}-restarted", "Consuming ")
        deployment.wait_for(lambda: db.settled(len(shop.paid)), "every event CONSUMED after the restart", SETTLE_S,
                            lambda: db.unsettled(shop.paid))
        check_effects(api, db, shop)
        deployment.wait_for(lambda: snapshots_caught_up(db, shop), "snapshots saved by the worker", SETTLE_S)
        print(f"second batch settled after {time.monotonic() - started:.1f}s")
        deployment.check_alive()
    except BaseException:
        print(deployment.tails())
        raise
    finally:
        if db is not None:
            db.close()
        deployment.stop_all()
        cleanup.close()  # the database
        delete_amqp_entities(amqp_url(), exchange, (MEMBER, MESSAGE))
        clean_redis(run)

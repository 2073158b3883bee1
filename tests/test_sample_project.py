"""The sample project as a user meets it: the demo command and the served site."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from wow_django.testing.bus import amqp_url, delete_amqp_entities

from .support import fresh_wow, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_wow_demo_fills_and_reports():
    out = StringIO()
    with override_settings(WOW=fresh_wow("mongo")):
        call_command("wow_demo", "--orders", "6", stdout=out)
    text = out.getvalue()
    assert "orders by status: CANCELLED 2, PAID 1, PLACED 1, SHIPPED 2\n" in text  # seed 7
    assert "is refused: USERNAME_TAKEN" in text
    # The integration-event scenario ran, and every event was consumed by all its consumers.
    assert "Bus demo: 3 paid orders published order.purchased" in text
    assert "did not settle" not in text
    assert text.count("order.purchased    CONSUMED  2/2 consumed") == 3
    assert text.count("points.added       CONSUMED  1/1 consumed") == 3
    assert text.count("notification.sent  CONSUMED  1/1 consumed") == 6


@pytest.mark.django_db(transaction=True)
def test_wow_demo_is_idempotent_for_its_own_requests():
    with override_settings(WOW=fresh_wow("mongo")):
        call_command("wow_demo", "--orders", "3", stdout=StringIO())
        out = StringIO()
        call_command("wow_demo", "--orders", "3", stdout=out)
    assert "(already there)" in out.getvalue()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - localhost only
        return response.status, response.read().decode()


def post(url: str, body: dict) -> tuple[int, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - localhost only
        return response.status, json.loads(response.read())


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True


CLOSED = "127.0.0.1:1"  # nothing listens there: "no Redis, no RabbitMQ"
SAMPLE_CONSUMERS = ("member-service", "message-service")


@pytest.fixture
def sample_env(tmp_path):
    """The environment of a fresh checkout's sample project, on its own SQLite file.

    Its own bus exchange and Celery key prefix: other test runs and demos on this
    machine share the Redis and the RabbitMQ, and must not take this one's messages.
    What it declared there is deleted afterwards.
    """
    namespace = f"wow-sample-test-{uuid.uuid4().hex[:10]}"
    exchange, prefix = f"{namespace}.bus", f"{namespace}:"  # what the settings derive from the namespace
    env = {**os.environ, "SAMPLE_SQLITE_PATH": str(tmp_path / "sample.sqlite3"), "PYTHONUNBUFFERED": "1",
           "SAMPLE_BROKER_NAMESPACE": namespace, "SAMPLE_AMQP_URL": amqp_url()}
    for name in ("DJANGO_SETTINGS_MODULE", "CELERY_EAGER", "WOW_BUS_TRANSPORT_URL", "RUN_MAIN", "WOW_BUS_EXCHANGE",
                 "CELERY_REDIS_KEY_PREFIX"):
        env.pop(name, None)
    yield env
    if reachable("127.0.0.1", 5672):
        delete_amqp_entities(amqp_url(), exchange, SAMPLE_CONSUMERS)
    if reachable("127.0.0.1", 6379):
        import redis

        for database in (0, 1):  # Celery's, and the bus's when it falls back to Redis
            client = redis.Redis(host="127.0.0.1", port=6379, db=database)
            keys = [*client.scan_iter(f"{prefix}*"), *client.scan_iter(f"*{exchange}*")]
            if keys:
                client.delete(*keys)
            client.close()


def require_redis_and_rabbitmq() -> None:
    """The suite runs with the services .ci/run starts; missing ones are a failure that says so, not a skip."""
    missing = [name for name, port in (("Redis", 6379), ("RabbitMQ", 5672)) if not reachable("127.0.0.1", port)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not running on 127.0.0.1: start them as .ci/run does")


def manage(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


COUNT = """
import json
from sample_project.orders.models import Notice, PointsEntry
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus
store = get_runtime().gateway.event_store
print("COUNTS", json.dumps({
    "orders": sum(1 for _ in store.iter_all("order")), "customers": sum(1 for _ in store.iter_all("customer")),
    "bus events": get_bus().list_events(size=1)["total"], "points entries": PointsEntry.objects.count(),
    "notices": Notice.objects.count()}))
"""


def counts(env: dict) -> dict:
    """What a separate process (``manage.py shell``) finds in the sample's database."""
    shell = manage(env, "shell", "--no-imports", "-c", COUNT)
    assert shell.returncode == 0, shell.stderr
    line = next(line for line in shell.stdout.splitlines() if line.startswith("COUNTS "))
    return json.loads(line.removeprefix("COUNTS "))


# --- processes: what a process started, and whether any of it is still alive (Linux /proc) ---------------


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


class Served:
    """A ``manage.py`` process whose output is collected as it comes (a thread reads it)."""

    def __init__(self, env: dict, *args: str):
        self.process = subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until_serving(self, base: str, timeout: float = 90.0) -> None:
        def answers():
            assert self.process.poll() is None, f"the process ended:\n{self.output}"
            try:
                return get(f"{base}/admin/login/")[0] == 200
            except OSError:
                return False

        wait_for(answers, timeout, "the server answering")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as a supervisor stops it; SIGKILL for whatever is left after ``timeout`` (a test failure)."""
        started = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        for pid in started:  # never leave a process behind, even when the test fails
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.reader.join(10)
        return code


def place_and_pay(base: str, customer: str) -> str:
    status, placed = post(f"{base}/api/order/place_order",
                          {"customer_id": customer, "items": [{"sku": "T-1", "quantity": 2, "unit_price": "5.00"}]})
    assert status == 200 and placed["errorCode"] == "Ok", placed
    status, paid = post(f"{base}/api/order/{placed['aggregateId']}/pay_order", {"amount": "10.00", "payment_id": "p-1"})
    assert status == 200 and paid["errorCode"] == "Ok", paid
    return placed["aggregateId"]


# --- the tests -----------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_readme_demo_command_serves_the_site(sample_env):
    """``manage.py wow_demo --serve`` (the README's first command): fills, migrates and serves."""
    port = free_port()
    served = Served(sample_env, "wow_demo", "--orders", "4", "--serve", "--addrport", f"127.0.0.1:{port}")
    try:
        served.wait_until_serving(f"http://127.0.0.1:{port}")
        status, body = get(f"http://127.0.0.1:{port}/admin/login/")
        assert "Django administration" in body or "Log in" in body
        status, _ = get(f"http://127.0.0.1:{port}/api/docs/")
        assert status == 200
        status, home = get(f"http://127.0.0.1:{port}/")  # what the demo prints first: a page, not a 404
        assert status == 200
        for link in ('href="/api/docs/"', 'href="/api/schema/"', 'href="/admin/wow/"', 'href="/admin/"'):
            assert link in home, link
    finally:
        served.stop()
    assert "orders by status:" in served.output
    assert "did not settle" not in served.output


def test_the_home_page_links_the_docs_the_console_and_the_admin(client):
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    for link in ('href="/api/docs/"', 'href="/api/schema/"', 'href="/admin/wow/"', 'href="/admin/"'):
        assert link in page, link
    assert client.get(page.split('href="')[1].split('"')[0]).status_code == 200  # the API docs


def test_rerunning_the_demo_adds_nothing(sample_env):
    first = manage(sample_env, "wow_demo", "--orders", "4")
    assert first.returncode == 0, first.stderr
    before = counts(sample_env)
    assert before["orders"] == 4 + 3 and before["customers"] == 2 and before["bus events"] > 0

    again = manage(sample_env, "wow_demo", "--orders", "4")
    assert again.returncode == 0, again.stderr
    assert "(already there)" in again.stdout
    assert "4 of these 4 orders were already there (same request ids): nothing added" in again.stdout
    assert "Bus demo: 3 paid orders published order.purchased" in again.stdout
    assert "did not settle" not in again.stdout
    assert counts(sample_env) == before


NAMES = ("from django.conf import settings; print(settings.CELERY_TASK_DEFAULT_QUEUE, settings.WOW['BUS_EXCHANGE'], "
         "settings.WOW['BUS_ROLLUP_QUEUE'], settings.CELERY_REDIS_KEY_PREFIX, "
         "settings.CELERY_TASK_ROUTES['wow_django.bus.rollup']['queue'])")


def test_the_demo_has_broker_names_of_its_own_by_default(sample_env):
    bare = {k: v for k, v in sample_env.items() if k != "SAMPLE_BROKER_NAMESPACE"}
    shown = manage({**bare, "CELERY_EAGER": "1", "WOW_BUS_TRANSPORT_URL": "memory://"}, "shell", "-v", "0", "-c", NAMES)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["wow-demo.celery", "wow-demo.bus", "wow-demo.bus.rollup", "wow-demo:",
                                    "wow-demo.bus.rollup"]
    for name, value in (("SAMPLE_BROKER_NAMESPACE", ""), ("SAMPLE_BROKER_NAMESPACE", "a b"),
                        ("CELERY_REDIS_KEY_PREFIX", "wow")):  # "wow*" would take in other projects' keys
        refused = manage({**bare, "CELERY_EAGER": "1", name: value}, "check")
        assert refused.returncode != 0 and f"{name}={value!r}" in refused.stderr


@pytest.mark.integration
def test_the_demo_keeps_to_its_names_on_the_brokers_and_cleans_them_up(sample_env):
    """Filled with Redis and RabbitMQ and no worker running, the demo leaves its consumers' durable queues and
    Celery's keys behind, under its own names only; ``wow_demo --clean-brokers`` deletes them, and nothing
    else."""
    import redis
    from kombu import Connection

    from wow_django.testing.bus import queue_depth

    require_redis_and_rabbitmq()
    namespace = sample_env["SAMPLE_BROKER_NAMESPACE"]
    shown = manage(sample_env, "shell", "-v", "0", "-c", NAMES)
    assert shown.stdout.split() == [f"{namespace}.celery", f"{namespace}.bus", f"{namespace}.bus.rollup",
                                    f"{namespace}:", f"{namespace}.bus.rollup"], shown.stderr
    other = Connection(amqp_url())  # someone else's queue on the same broker, bound to the same topic
    other_queue = f"{namespace}-other.member-service"
    other.channel().queue_declare(other_queue, durable=True)
    try:
        filled = manage(sample_env, "wow_demo", "--orders", "2")
        assert filled.returncode == 0, filled.stderr
        for consumer_id in SAMPLE_CONSUMERS:  # durable: they outlive the demo (a passive declare finds them)
            assert queue_depth(amqp_url(), f"{namespace}.bus", consumer_id) >= 0
        client = redis.Redis(host="127.0.0.1", port=6379, db=0)
        assert list(client.scan_iter(f"{namespace}:*"))  # Celery's queues and bindings
        assert not [k for k in client.scan_iter("*") if namespace.encode() in k and not k.startswith(
            f"{namespace}:".encode())]  # nothing of the demo outside its prefix

        cleaned = manage(sample_env, "wow_demo", "--clean-brokers")
        assert cleaned.returncode == 0, cleaned.stderr + cleaned.stdout
        assert f"deleted {namespace}.bus.member-service, {namespace}.bus.message-service, {namespace}.bus" \
            in cleaned.stdout
        assert f"deleted the queues {namespace}.celery, {namespace}.bus.rollup" in cleaned.stdout
        for consumer_id in SAMPLE_CONSUMERS:
            with pytest.raises(Exception, match="NOT_FOUND|404"):
                queue_depth(amqp_url(), f"{namespace}.bus", consumer_id)
        assert list(client.scan_iter(f"{namespace}:*")) == []
        assert other.channel().queue_declare(other_queue, passive=True).queue == other_queue  # left alone
        again = manage(sample_env, "wow_demo", "--clean-brokers")
        assert again.returncode == 0 and "deleted nothing (nothing was there)" in again.stdout
        client.close()
    finally:
        with contextlib.suppress(Exception):
            other.channel().queue_delete(other_queue)
        other.release()


def test_a_second_process_sees_the_demo_orders_over_the_api(sample_env):
    filled = manage(sample_env, "wow_demo", "--orders", "4")
    assert filled.returncode == 0, filled.stderr
    assert counts(sample_env)["orders"] == 4 + 3  # a shell, a process of its own

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = Served(sample_env, "runserver", "--noreload", f"127.0.0.1:{port}")
    try:
        server.wait_until_serving(base)
        assert post(f"{base}/api/order/snapshot/count", {})[1] == 7
        status, orders = post(f"{base}/api/order/snapshot/list", {"limit": 20})
        assert status == 200 and len(orders) == 7
        status, body = get(f"{base}/api/order/{orders[0]['aggregateId']}/state")
        assert status == 200
        assert json.loads(body)["status"] in {"PLACED", "PAID", "SHIPPED", "CANCELLED"}
    finally:
        server.stop()


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_serve_runs_the_workers_and_consumers_and_stops_them_all(sample_env):
    """With Redis and RabbitMQ: two Celery workers and a ``wow_consume`` per consumer, children of the demo."""
    require_redis_and_rabbitmq()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    served = Served(sample_env, "wow_demo", "--orders", "2", "--serve", "--addrport", f"127.0.0.1:{port}")
    started: dict[str, str] = {}
    tree: set[int] = set()
    try:
        served.wait_until_serving(base)
        started = dict(re.findall(r"started (.+) \(pid (\d+)\)", served.output))
        assert set(started) == {"celery worker", "celery rollup worker", "consumer member-service",
                                "consumer message-service"}
        pids = {int(pid) for pid in started.values()}
        tree = descendants(served.process.pid)
        assert pids <= tree and all(alive(pid) for pid in pids)
        assert len(tree - pids) >= 1  # the autoreloader's serving child (and nothing of it survives either)

        # An order paid over the API is consumed by the wow_consume processes, which write their own rows.
        points = counts(sample_env)["points entries"]
        place_and_pay(base, "user-Q")
        wait_for(lambda: counts(sample_env)["points entries"] == points + 1, 60, "member-service's points")
    finally:
        code = served.stop()
    assert code == 0
    assert not [pid for pid in tree if alive(pid)], served.output
    for name in started:
        assert f"stopped {name} (pid {started[name]})" in served.output


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_demo_leaves_no_process_behind(sample_env):
    """SIGKILL gives the demo no chance to stop its children: each of them ends with it all the same."""
    require_redis_and_rabbitmq()
    port = free_port()
    served = Served(sample_env, "wow_demo", "--orders", "2", "--serve", "--addrport", f"127.0.0.1:{port}")
    tree: set[int] = set()
    try:
        served.wait_until_serving(f"http://127.0.0.1:{port}")
        wait_for(lambda: served.output.count("Consuming ") >= 2, 30, "the consumers started")
        tree = descendants(served.process.pid)
        assert len(tree) == 5  # two Celery workers, two consumers, the serving child
        served.process.kill()
        served.process.wait(10)
        wait_for(lambda: not [pid for pid in tree if alive(pid)], 30, "every child ended")
    finally:
        served.stop()


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_serve_with_no_broker_consumes_in_the_server_process(sample_env):
    """Nothing else on the machine: Celery eager, the bus on memory://, the consumers in the server's process."""
    env = {**sample_env, "CELERY_BROKER_URL": f"redis://{CLOSED}/0", "SAMPLE_AMQP_URL": f"amqp://guest:guest@{CLOSED}//"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    served = Served(env, "wow_demo", "--orders", "2", "--serve", "--addrport", f"127.0.0.1:{port}")
    tree: set[int] = set()
    try:
        served.wait_until_serving(base)
        assert "Celery: eager" in served.output and "bus: memory://" in served.output
        assert "started " not in served.output
        tree = descendants(served.process.pid)
        assert len(tree) == 1  # only the autoreloader's serving child
        assert f"Consuming in this process ({next(iter(tree))}): member-service, message-service" in served.output

        points = counts(env)["points entries"]
        place_and_pay(base, "user-R")
        wait_for(lambda: counts(env)["points entries"] == points + 1, 60, "member-service's points")
    finally:
        code = served.stop()
    assert code == 0
    assert not [pid for pid in tree if alive(pid)]


def test_no_model_change_lacks_a_migration(db):
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_the_admin_index_renders_for_a_superuser(db, client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.invalid", "pw")
    client.force_login(admin)
    response = client.get("/admin/")
    assert response.status_code == 200


def test_the_demo_with_followers_in_their_own_processes(sample_env):
    """``WOW_FOLLOWERS_RUN=command``: the demo runs the followers while it fills (its commands wait for their
    projections, the bus demo for the relay) and leaves every one caught up; ``--serve`` would start a
    ``wow_follow`` process for them."""
    env = {**sample_env, "WOW_FOLLOWERS_RUN": "command"}
    filled = manage(env, "wow_demo", "--orders", "4")
    assert filled.returncode == 0, filled.stderr
    assert "did not catch up" not in filled.stdout and "did not settle" not in filled.stdout
    assert "PROJECTED did not finish" not in filled.stdout + filled.stderr
    status = manage(env, "wow_followers", "--format", "json")
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    assert {"order-summaries", "order-purchased-relay"} <= set(rows)
    assert all(row["lag_events"] == 0 and row["lease_holder"] is None for row in rows.values()), rows
    parts = manage(env, "shell", "-c", "from sample_project.orders.demo_processes import follower_parts, separately\n"
                                       "print([p.argv[-1] for p in follower_parts()]); print(separately())")
    assert "['wow_follow']" in parts.stdout and "python manage.py wow_follow" in parts.stdout

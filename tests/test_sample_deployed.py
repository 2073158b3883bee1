"""The sample as deployed (``DEBUG`` off) is closed to strangers (issue 26, item 1): its own settings, served
by gunicorn, over HTTP, on SQLite and on PostgreSQL.

Anonymous clients get nothing; each user acts for the tenant of its membership and cannot pick another with
``Command-Tenant-Id``; an order takes commands from the user who placed it, or from a user with the
``wow_django.act_for_any_owner`` permission; a refused command stores nothing.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.pg import pg_database, scratch_database

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "a-long-test-password-7"
USERS = f"""
from django.contrib.auth.models import Permission, User
from sample_project.orders.models import TenantMembership
def user(name, tenant=None, **extra):
    made = User.objects.create_user(name, name + '@example.invalid', {PASSWORD!r}, **extra)
    if tenant:
        TenantMembership.objects.create(user=made, tenant_id=tenant)
    return made
user('alice', 'acme'); user('bob', 'acme'); user('carol', 'globex'); user('nobody')
staff = user('staff', 'acme', is_staff=True)
staff.user_permissions.add(Permission.objects.get(content_type__app_label='wow_django', codename='act_for_any_owner'))
"""
ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 1, "unit_price": "5.00"}]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Client:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}/api/"

    def call(self, method: str, path: str, body=None, user: str | None = None, **headers) -> tuple[int, dict]:
        sent = {"Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
        if user is not None:
            sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - localhost only
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@pytest.fixture(params=["sqlite", "postgresql"])
def deployed(request, tmp_path):
    """The sample's settings with DEBUG off, migrated, with users, served by gunicorn: a Client."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WOW_", "SAMPLE_", "CELERY_", "DJANGO_"))}
    env.update({"DJANGO_SETTINGS_MODULE": "sample_project.settings", "DJANGO_DEBUG": "0",
                "DJANGO_SECRET_KEY": "deployed-sample-test-only-not-secret-0123456789",
                "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "CELERY_EAGER": "1", "WOW_BUS_TRANSPORT_URL": "memory://",
                "WOW_FOLLOWERS_RUN": "command", "PYTHONUNBUFFERED": "1"})
    with scratch_database("test_wow_sample_deployed") if request.param == "postgresql" else _no_database() as name:
        if name is None:
            env["SAMPLE_SQLITE_PATH"] = str(tmp_path / "deployed.sqlite3")
        else:
            entry = pg_database(name)
            env.update({"SAMPLE_POSTGRES_DB": name, "SAMPLE_POSTGRES_HOST": entry["HOST"],
                        "SAMPLE_POSTGRES_PORT": str(entry["PORT"]), "SAMPLE_POSTGRES_USER": entry["USER"],
                        "SAMPLE_POSTGRES_PASSWORD": entry["PASSWORD"]})
        manage = [sys.executable, "manage.py"]
        for step in (["migrate", "--noinput", "-v", "0"], ["shell", "-c", USERS]):
            subprocess.run([*manage, *step], cwd=ROOT, env=env, check=True, timeout=120)
        port = free_port()
        log = (tmp_path / "gunicorn.log").open("w")
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "sample_project.wsgi:application", "--bind", f"127.0.0.1:{port}",
             "--workers", "1", "--threads", "4", "--timeout", "60"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            client = Client(port)
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.call("GET", "order/x/state")
                    break
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, \
                        (tmp_path / "gunicorn.log").read_text()
                    time.sleep(0.2)
            yield client
        finally:
            server.terminate()
            server.wait(30)
            log.close()


class _no_database:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def refused(answer: tuple[int, dict], status: int | tuple[int, ...], code: str) -> None:
    got, body = answer
    assert got in ((status,) if isinstance(status, int) else status), answer
    assert body["errorCode"] == code, answer


def test_the_sample_deployed_lets_no_stranger_in(deployed):
    api = deployed
    # Anonymous: nothing, neither commands nor reads nor queries (401 with Basic's challenge, or 403).
    refused(api.call("POST", "order/place_order", ORDER), (401, 403), "NotAuthenticated")
    refused(api.call("POST", "order/snapshot/count", {}), (401, 403), "NotAuthenticated")
    refused(api.call("GET", "order/x/state", Command_Tenant_Id="acme"), (401, 403), "NotAuthenticated")
    # A user of no tenant.
    refused(api.call("POST", "order/place_order", ORDER, user="nobody"), 403, "PermissionDenied")

    status, placed = api.call("POST", "order/place_order", ORDER, user="alice")
    assert status == 200, placed
    order = placed["aggregateId"]
    status, count = api.call("POST", "order/event/count", {}, user="alice")
    assert status == 200 and count == 1

    # Another user of the same tenant reads it, but cannot pay, cancel or delete it: nothing is stored.
    status, state = api.call("GET", f"order/{order}/state", user="bob")
    assert status == 200 and state["status"] == "PLACED"
    refused(api.call("POST", f"order/{order}/pay_order", {"amount": "5.00", "payment_id": "p-1"}, user="bob"),
            403, "IllegalAccessOwnerAggregate")
    refused(api.call("DELETE", f"order/{order}", user="bob"), 403, "IllegalAccessOwnerAggregate")
    # Another tenant's user finds nothing, and nobody picks a tenant by header.
    refused(api.call("GET", f"order/{order}/state", user="carol"), 404, "NotFound")
    refused(api.call("POST", f"order/{order}/pay_order", {"amount": "5.00", "payment_id": "p-1"}, user="carol"),
            404, "NotFound")
    status, count = api.call("POST", "order/event/count", {}, user="carol")
    assert status == 200 and count == 0
    refused(api.call("GET", f"order/{order}/state", user="carol", Command_Tenant_Id="acme"), 403,
            "PermissionDenied")
    status, state = api.call("GET", f"order/{order}/state", user="alice")
    assert state["status"] == "PLACED"

    # The owner pays; staff with the permission ships.
    status, paid = api.call("POST", f"order/{order}/pay_order", {"amount": "5.00", "payment_id": "p-1"},
                            user="alice")
    assert status == 200 and paid["aggregateVersion"] == 2, paid
    status, shipped = api.call("POST", f"order/{order}/ship_order", {"tracking_number": "T-1"}, user="staff")
    assert status == 200 and shipped["aggregateVersion"] == 3, shipped

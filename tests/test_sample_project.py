"""The sample project as a user meets it: the demo command and the served site."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from .support import fresh_wow

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


@pytest.mark.integration
def test_the_readme_demo_command_serves_the_site(tmp_path):
    """``manage.py wow_demo --serve``: fills, migrates and serves in one process."""
    port = free_port()
    env = {**os.environ, "SAMPLE_SQLITE_PATH": str(tmp_path / "demo.sqlite3"), "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "wow_demo", "--orders", "4", "--serve", "--addrport", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, body = get(f"http://127.0.0.1:{port}/admin/login/")
                break
            except OSError:
                time.sleep(0.25)
        assert status == 200, "the demo server did not answer"
        assert "Django administration" in body or "Log in" in body
        status, _ = get(f"http://127.0.0.1:{port}/api/docs/")
        assert status == 200
    finally:
        process.terminate()
        try:
            output, _ = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    assert "orders by status:" in output


def test_no_model_change_lacks_a_migration(db):
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


def test_the_admin_index_renders_for_a_superuser(db, client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.invalid", "pw")
    client.force_login(admin)
    response = client.get("/admin/")
    assert response.status_code == 200

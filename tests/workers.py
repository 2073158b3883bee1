"""What each test process owns when the suite runs in parallel (pytest-xdist, ``-n auto``).

Plain ``os.environ`` reads, importable before Django is configured (settings modules use them too).
Every other shared resource is already per process or per test: the test databases carry the process id
(PostgreSQL; pytest-django adds the worker's name too), SQLite files live in a temporary directory per
process, RabbitMQ exchanges, queues and Celery queue names are made unique per test (uuid), servers bind
port 0. What remains shared between workers is Redis' numbered databases: each worker takes its own.
"""

from __future__ import annotations

import os

#: Redis databases the suite may use, one per worker, highest first (0–3 stay for the demo and development).
REDIS_DATABASES = tuple(range(15, 3, -1))


def worker_index() -> int:
    """0 for the first xdist worker (``gw0``) and for a run without xdist; 1 for ``gw1``, and so on."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name[2:] if name.startswith("gw") else ""
    return int(digits) if digits.isdigit() else 0


def redis_url() -> str:
    """The Redis this worker uses: ``WOW_TEST_REDIS_URL`` when set, else 127.0.0.1:6379 on the worker's own
    database (15 for ``gw0``, 14 for ``gw1``, …; past twelve workers they are shared, and the suite's key,
    queue and prefix names are unique per test anyway)."""
    configured = os.environ.get("WOW_TEST_REDIS_URL")
    if configured:
        return configured
    database = REDIS_DATABASES[worker_index() % len(REDIS_DATABASES)]
    return f"redis://127.0.0.1:6379/{database}"

"""Settings of the follower fault tests' processes (tests/test_follower_faults.py): the sample project with
storage ``django`` on PostgreSQL (``WOW_FAULT_PG_DB``) or on a SQLite file (``WOW_FAULT_SQLITE``), the slow
follower of ``tests.fault_app``, run only by ``manage.py wow_follow``, and a short lease
(``WOW_FAULT_LEASE_S``, 1 s unless set; ``default``: the library's)."""

import os

from sample_project.settings import *  # noqa: F401,F403
from tests.pg import pg_database

if os.environ.get("WOW_FAULT_PG_DB"):
    DATABASES = {"default": pg_database(os.environ["WOW_FAULT_PG_DB"])}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["WOW_FAULT_SQLITE"]}}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.fault_app"]  # noqa: F405
CELERY_TASK_ALWAYS_EAGER = True
WOW = {
    **{key: value for key, value in WOW.items() if key != "MONGO_URI"},  # noqa: F405
    "STORAGE": "django",
    "FOLLOWERS_RUN": "command",
    "FOLLOWER_MAX_WAIT_S": 0.1,
    "FOLLOWER_MIN_BATCH": 16,
    "BUS_TRANSPORT_URL": "memory://",
    "SNAPSHOT_STRATEGY": "none",
}
if os.environ.get("WOW_FAULT_LEASE_S") != "default":  # "default": the library's FOLLOWER_LEASE_S
    WOW["FOLLOWER_LEASE_S"] = float(os.environ.get("WOW_FAULT_LEASE_S", "1.0"))

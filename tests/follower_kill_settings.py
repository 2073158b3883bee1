"""Settings of the follower SIGKILL test's processes (tests/test_follower_kill.py).

The sample project on PostgreSQL (``WOW_KILL_PG_DB``, required) with storage
``django``, the test's followers (``tests.follower_app``), followers run only
by ``manage.py wow_follow`` (``FOLLOWERS_RUN = "command"``) and a short lease,
so a killed instance's lease is taken over within seconds.
"""

import os

from sample_project.settings import *  # noqa: F401,F403
from tests.pg import pg_database

DATABASES = {"default": pg_database(os.environ["WOW_KILL_PG_DB"])}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.follower_app"]  # noqa: F405
CELERY_TASK_ALWAYS_EAGER = True
WOW = {
    **{key: value for key, value in WOW.items() if key != "MONGO_URI"},  # noqa: F405
    "STORAGE": "django",
    "FOLLOWERS_RUN": "command",
    "FOLLOWER_LEASE_S": 2.0,
    "FOLLOWER_MAX_WAIT_S": 0.2,
    "BUS_TRANSPORT_URL": "memory://",
    "SNAPSHOT_STRATEGY": "none",
}

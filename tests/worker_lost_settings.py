"""Settings of tests/test_worker_lost.py's processes: the sample project on PostgreSQL (``WOW_KILL_PG_DB``)
with storage ``django``, Celery on Redis (not eager) on the queue ``WOW_TEST_QUEUE`` only, results ignored,
and ``tests.worker_app`` (the first run of each task is slow)."""

import os

from sample_project.settings import *  # noqa: F401,F403
from tests.pg import pg_database
from tests.workers import redis_url

DATABASES = {"default": pg_database(os.environ["WOW_KILL_PG_DB"])}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.worker_app"]  # noqa: F405
WOW = {
    **{key: value for key, value in WOW.items() if key != "MONGO_URI"},  # noqa: F405
    "STORAGE": "django",
    "FOLLOWERS_RUN": "command",
    "BUS_TRANSPORT_URL": "memory://",
    "SNAPSHOT_STRATEGY": "none",
}
CELERY_BROKER_URL = redis_url()  # the test passes its own WOW_TEST_REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_DEFAULT_QUEUE = os.environ["WOW_TEST_QUEUE"]

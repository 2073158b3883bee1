"""Settings for the test suite: the sample project on embedded defaults.

Besides Django's own ``default`` (a SQLite file), two databases serve the django
storage backend's tests: ``wow_sqlite`` (a file, so that threads and processes
share it) and ``wow_pg`` (the PostgreSQL on 127.0.0.1 that ``.ci/run``
starts; ``WOW_TEST_PG_HOST``/``_PORT``/``_USER``/``_PASSWORD``/``_DB`` override).
Each test run gets its own test databases (the process id is in their names),
so concurrent runs on one machine do not collide. Neither depends on
``default`` (``TEST['DEPENDENCIES']``), so tests that use only one of them can
run alone.

The sample's settings probe for Redis and RabbitMQ; the suite does not follow
them: Celery stays eager and the bus on ``memory://`` unless ``CELERY_EAGER``
or ``WOW_BUS_TRANSPORT_URL`` say otherwise (tests that need a broker bring
their own).
"""

import os
import tempfile

from sample_project.settings import *  # noqa: F401,F403
from tests.pg import pg_database

_RUN = os.getpid()
_SQLITE_DIR = tempfile.mkdtemp(prefix="wow-tests-")

DATABASES = {
    # A file, not ":memory:": the sample's consumers write their rows from other threads.
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_SQLITE_DIR, "default.sqlite3"),
        "OPTIONS": {"timeout": 20},
        "TEST": {"NAME": os.path.join(_SQLITE_DIR, "test_default.sqlite3")},
    },
    "wow_sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_SQLITE_DIR, "wow.sqlite3"),
        "TEST": {"NAME": os.path.join(_SQLITE_DIR, "test_wow.sqlite3"), "DEPENDENCIES": []},
    },
    "wow_pg": {
        **pg_database(os.environ.get("WOW_TEST_PG_DB", "test")),
        "TEST": {"NAME": f"test_wow_{_RUN}", "DEPENDENCIES": []},
    },
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
CELERY_TASK_ALWAYS_EAGER = os.environ.get("CELERY_EAGER", "1") == "1"
WOW = {**WOW, "BUS_TRANSPORT_URL": os.environ.get("WOW_BUS_TRANSPORT_URL", "memory://")}  # noqa: F405

# A test-only app with tables shaped like the django backend's (tests/query_app).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.query_app"]  # noqa: F405

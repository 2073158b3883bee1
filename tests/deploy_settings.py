"""Settings of the sample project deployed as separate processes (tests/test_deployment.py).

The web server, the Celery workers and the ``wow_consume`` consumers all run
with ``DJANGO_SETTINGS_MODULE=tests.deploy_settings``: the sample project on
real servers, everything in one PostgreSQL database through the ORM (storage
``django``), Celery on Redis, the bus on RabbitMQ. The test names what is
unique to its run through the environment, so concurrent runs on one machine
share no database, queue, exchange or key:

- ``WOW_DEPLOY_PG_DB`` (required): the PostgreSQL database;
  ``WOW_TEST_PG_HOST``/``_PORT``/``_USER``/``_PASSWORD`` as in tests/settings.py;
- ``WOW_DEPLOY_RUN`` (required): a token in every Celery queue name, cache key
  and worker name of the run;
- ``WOW_DEPLOY_REDIS_URL``: Celery's broker and the cache (default
  ``redis://127.0.0.1:6379/13``);
- ``WOW_DEPLOY_AMQP_URL``, ``WOW_DEPLOY_EXCHANGE`` (required): the bus.
"""

import os

from sample_project.settings import *  # noqa: F401,F403
from tests.pg import pg_database

RUN = os.environ["WOW_DEPLOY_RUN"]
REDIS_URL = os.environ.get("WOW_DEPLOY_REDIS_URL", "redis://127.0.0.1:6379/13")

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
SECRET_KEY = "deployment-test-only-not-secret"
# The bus API is read with HTTP basic authentication: a fast hasher for the test's user.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

DATABASES = {"default": pg_database(os.environ["WOW_DEPLOY_PG_DB"])}

# Pending-snapshot markers are shared by every process that appends events.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "KEY_PREFIX": f"wow-deploy-{RUN}"}}

WOW = {
    **{key: value for key, value in WOW.items() if key != "MONGO_URI"},  # noqa: F405
    "STORAGE": "django",
    "SNAPSHOT_MODE": "celery",
    "BUS_TRANSPORT_URL": os.environ.get("WOW_DEPLOY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "BUS_EXCHANGE": os.environ["WOW_DEPLOY_EXCHANGE"],
    "BUS_ROLLUP_QUEUE": f"wow-deploy-{RUN}.rollup",
    "BUS_CONSUMER_BACKOFF_S": 0.1,
    # A killed consumer's claims are taken over by its successor after this long.
    "BUS_INBOX_LEASE_S": 5.0,
    "BUS_RELAY_AFTER_S": 5.0,
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None  # nothing waits for a task's result: no keys left behind
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_DEFAULT_QUEUE = f"wow-deploy-{RUN}.celery"
CELERY_TASK_ROUTES = {"wow_django.bus.rollup": {"queue": WOW["BUS_ROLLUP_QUEUE"]}}
# A sender that died between storing an event and publishing it (a consumer killed in its handler)
# leaves it PENDING: celery beat has the worker relay it, sooner than the sample's 30 s.
CELERY_BEAT_SCHEDULE = {"wow-bus-relay-pending": {"task": "wow_django.bus.relay_pending", "schedule": 2.0}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"wow_django": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}

"""Settings of the sample order service.

With no environment at all everything the demo keeps is in one SQLite file,
``sample.sqlite3`` next to ``manage.py`` (git-ignored): Django's own tables,
and — through ``WOW["STORAGE"]``'s default, the django backend — the events,
snapshots, PrepareKey reservations, bus records and the downstream services'
rows. Every process that uses these settings (``runserver``, gunicorn, a
shell, a Celery worker, ``wow_consume``) sees the same data; delete the file to
start over.

Environment variables switch to real servers:

- ``SAMPLE_POSTGRES_DB`` (and ``SAMPLE_POSTGRES_HOST``/``_USER``/``_PASSWORD``/
  ``_PORT``): PostgreSQL instead of SQLite; otherwise SQLite at
  ``SAMPLE_SQLITE_PATH`` (default ``sample.sqlite3`` here).
- ``WOW_MONGO_URI``: events, snapshots and bus records on MongoDB instead
  (``mongodb://localhost:27017/order_service``).
- ``CELERY_BROKER_URL``: the Celery broker (default ``redis://127.0.0.1:6379/0``).
- ``SAMPLE_BROKER_NAMESPACE`` (default ``wow-demo``): the demo's names on the
  shared brokers, so that it never takes another project's messages nor leaves
  its own among theirs: Celery's default queue ``<ns>.celery``, the bus's
  exchange ``<ns>.bus`` (its consumer queues ``<ns>.bus.<consumer>``), the
  rollup queue ``<ns>.bus.rollup``, and ``<ns>:`` before every key Celery
  writes to Redis. ``python manage.py wow_demo --clean-brokers`` deletes them.
- ``CELERY_REDIS_KEY_PREFIX``: that key prefix alone (default ``<ns>:``).
- ``CELERY_EAGER``: ``1`` runs tasks inline in the process that queues them,
  ``0`` sends them to the broker for a worker.
- ``WOW_BUS_TRANSPORT_URL``: the integration-event bus's broker
  (``amqp://user:password@host:5672//``); ``WOW_BUS_EXCHANGE`` its topic
  exchange alone (default ``<ns>.bus``).

**Probing what runs on this machine.** A demo should work on a fresh machine
with nothing else started, and use a broker when there is one. So when
``CELERY_EAGER`` or ``WOW_BUS_TRANSPORT_URL`` is not set, these settings open
a TCP connection (nothing is sent; at most 0.3 s, and a closed local port
answers at once) to decide:

- Celery runs **non-eagerly** when the broker's host and port accept a
  connection — tasks (bus rollups, commands sent with ``SENT``) then need a
  worker, which ``manage.py wow_demo --serve`` starts — and **eagerly**
  otherwise: each task runs inline, in the process that queued it, which is
  correct, only not in the background.
- The bus goes over **RabbitMQ** when ``SAMPLE_AMQP_URL`` (default
  ``amqp://guest:guest@127.0.0.1:5672//``) accepts a connection; else over
  **Redis** when the Celery broker's server does (kombu's ``redis://``
  transport, in the next database number — the broker's own database keeps
  Celery's queues alone); else over kombu's **memory://**, which never leaves
  a process, so the consumers must run inside the serving process (``wow_demo
  --serve`` runs them there in threads; ``wow_django.W005`` warns about it
  when ``DEBUG`` is off). The Redis transport works with the bus because
  kombu routes the topic exchange through bindings kept in Redis (seen by
  every process) and an empty exchange name straight to the queue of that
  name, which is how a consumer gives a failed message back to its own queue
  on non-AMQP transports. It has no publisher confirms and redelivers a dead
  consumer's unacknowledged messages only after kombu's visibility timeout
  (an hour): a development stand-in, RabbitMQ is the production transport.

The probes run once per process, when the settings are imported. A process
that starts others (``wow_demo --serve``) hands its answers down through
``CELERY_EAGER`` and ``WOW_BUS_TRANSPORT_URL`` so that they all agree. Set
both variables to skip probing altogether (production does: a server that is
down must be an error there, not a quiet fallback).

``SNAPSHOT_MODE`` stays the default ``follower`` (the ``wow-snapshots``
follower writes snapshots, wherever followers run), so no shared cache is
needed: the per-process default cache is enough (``wow_django.W003`` is about
``SNAPSHOT_MODE="celery"``).
"""

import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "sample-project-insecure-dev-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here (no CDN: works offline, under a strict CSP)
    "wow_django",
    "wow_django.bus",
    "sample_project.orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "sample_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "sample_project.wsgi.application"

if os.environ.get("SAMPLE_POSTGRES_DB"):
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["SAMPLE_POSTGRES_DB"],
            "HOST": os.environ.get("SAMPLE_POSTGRES_HOST", "127.0.0.1"),
            "PORT": os.environ.get("SAMPLE_POSTGRES_PORT", "5432"),
            "USER": os.environ.get("SAMPLE_POSTGRES_USER", "postgres"),
            "PASSWORD": os.environ.get("SAMPLE_POSTGRES_PASSWORD", ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SAMPLE_SQLITE_PATH", BASE_DIR / "sample.sqlite3"),
            # Several processes (and follower threads) write this file: a transaction that reads first
            # and writes later (a projection) would otherwise fail at once with "database is locked"
            # when another writer got in between, instead of waiting for it.
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# Where manage.py collectstatic gathers the admin's, the console's and Swagger UI's files for the web server
# (or a CDN) in front of gunicorn to serve at STATIC_URL: with DEBUG off Django serves none of them itself.
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- HTTP API (wow_django.http) and its OpenAPI schema -------------------------------
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}

# Logging: everything at WARNING and above to stderr (a process manager or container runtime keeps it), each
# line with its logger and, for a request's errors (django.request: every 500 with its traceback, 4xx as
# warnings), the request id the client sent (Command-Request-Id or X-Request-Id). wow_django's loggers are
# named after its modules under "wow_django" (wow_django.http, wow_django.bus, wow_django.application.*,
# wow_django.backends.*, wow_django.tasks); WOW_LOG_LEVEL=INFO shows their INFO lines too.
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "wow_django.log.RequestIdFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s [request %(request_id)s] %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["request_id"]}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    # Django's own handlers (its console under DEBUG, mail to ADMINS) give way to the one above.
    "loggers": {"django": {"handlers": [], "level": "WARNING", "propagate": True}},
}
if os.environ.get("WOW_LOG_LEVEL"):
    LOGGING["loggers"]["wow_django"] = {"level": os.environ["WOW_LOG_LEVEL"]}
SPECTACULAR_SETTINGS = {
    "TITLE": "Order service",
    "DESCRIPTION": "Commands, state, snapshots and event streams of the sample order service (wow_django).",
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",  # the command schemas are pydantic's JSON Schema 2020-12
    # Swagger UI from the drf-spectacular-sidecar package (static files, collected with collectstatic), not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}


# --- what runs on this machine (see the module docstring) --------------------------------
_PROBED: dict[tuple[str, int], bool] = {}


def _reachable(url: str, default_port: int) -> bool:
    """Whether the URL's host accepts a TCP connection on its port within 0.3 s (nothing is sent)."""
    parts = urlsplit(url)
    if not parts.hostname:  # e.g. a unix socket: configured on purpose, taken as it is
        return True
    try:
        key = (parts.hostname, parts.port or default_port)
    except ValueError:  # a malformed port: Celery or kombu will say what is wrong with it
        return True
    if key not in _PROBED:
        try:
            socket.create_connection(key, timeout=0.3).close()
            _PROBED[key] = True
        except OSError:
            _PROBED[key] = False
    return _PROBED[key]


def _next_redis_database(url: str) -> str:
    """The same Redis server as ``url``, one database number further (wrapping below 16)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    database = int(path) if path.isdigit() else 0
    return urlunsplit((parts.scheme, parts.netloc, f"/{(database + 1) % 16}", "", ""))


CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
# The demo's own names on brokers it shares with the machine's other projects (see the module docstring).
BROKER_NAMESPACE = os.environ.get("SAMPLE_BROKER_NAMESPACE", "wow-demo")
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,59}", BROKER_NAMESPACE):
    raise ImproperlyConfigured(f"SAMPLE_BROKER_NAMESPACE={BROKER_NAMESPACE!r}: 1 to 60 letters, digits, '_', '.' "
                               "or '-', starting with a letter or digit (it begins every name the demo uses)")
SAMPLE_AMQP_URL = os.environ.get("SAMPLE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
if os.environ.get("CELERY_EAGER") in ("0", "1"):
    CELERY_TASK_ALWAYS_EAGER = os.environ["CELERY_EAGER"] == "1"
else:
    CELERY_TASK_ALWAYS_EAGER = not _reachable(CELERY_BROKER_URL, 6379)

# Where the bus goes on Redis (the broker's next database); --clean-brokers looks there too.
SAMPLE_REDIS_BUS_URL = _next_redis_database(CELERY_BROKER_URL) if CELERY_BROKER_URL.startswith("redis://") else ""
if os.environ.get("WOW_BUS_TRANSPORT_URL"):
    BUS_TRANSPORT_URL = os.environ["WOW_BUS_TRANSPORT_URL"]
elif _reachable(SAMPLE_AMQP_URL, 5672):
    BUS_TRANSPORT_URL = SAMPLE_AMQP_URL
elif CELERY_BROKER_URL.startswith("redis://") and _reachable(CELERY_BROKER_URL, 6379):
    BUS_TRANSPORT_URL = SAMPLE_REDIS_BUS_URL
else:
    BUS_TRANSPORT_URL = "memory://"

WOW = {
    "CONTEXT_NAME": "order-service",
    "SERVICE_NAME": "order-service",
    "SNAPSHOT_STRATEGY": "all",
    "BUS_TRANSPORT_URL": BUS_TRANSPORT_URL,
    "BUS_EXCHANGE": os.environ.get("WOW_BUS_EXCHANGE", f"{BROKER_NAMESPACE}.bus"),
    "BUS_ROLLUP_QUEUE": f"{BROKER_NAMESPACE}.bus.rollup",
    # An operator finds the integration events of an order or a member by these payload fields.
    "BUS_SEARCH_FIELDS": ("orderId", "userId", "paymentId"),
}
if os.environ.get("WOW_MONGO_URI"):
    WOW["MONGO_URI"] = os.environ["WOW_MONGO_URI"]
# Who may do what through the API. Under DEBUG (the demo) it is open: anonymous requests, and the tenant
# from the Command-Tenant-Id header ("(0)" without it). Deployed (DEBUG off) it is closed:
# - only signed-in users (a session, or HTTP Basic);
# - each acts for the tenant of its membership (admin: Orders → Tenant memberships); a user without one is
#   refused, and so is a Command-Tenant-Id header naming another tenant;
# - an order takes commands from the user who placed it only, or from a user with the
#   wow_django.act_for_any_owner permission (superusers have it): staff acting for customers.
if not DEBUG:
    WOW["API_PERMISSION_CLASSES"] = ["rest_framework.permissions.IsAuthenticated",
                                     "wow_django.http.permissions.IsOwnerOrPermitted"]
    WOW["TENANT_RESOLVER"] = "sample_project.orders.tenancy.MembershipTenantResolver"
# Where projections, processors and the relay run: "threads" of every process (the default), or only where
# `manage.py wow_follow` / the Celery beat task run them ("command" / "celery"), as in production.
if os.environ.get("WOW_FOLLOWERS_RUN"):
    WOW["FOLLOWERS_RUN"] = os.environ["WOW_FOLLOWERS_RUN"]

# --- Celery ----------------------------------------------------------------------
# Redis is the broker (and keeps the results); eager or not: see above.
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
# Every key Celery writes to Redis (queues, results) starts with the demo's prefix: several projects (or test
# runs) can share one Redis database, and --clean-brokers finds the demo's keys.
CELERY_REDIS_KEY_PREFIX = os.environ.get("CELERY_REDIS_KEY_PREFIX") or f"{BROKER_NAMESPACE}:"
if not CELERY_REDIS_KEY_PREFIX.endswith(":"):  # --clean-brokers deletes every key that starts with it
    raise ImproperlyConfigured(f"CELERY_REDIS_KEY_PREFIX={CELERY_REDIS_KEY_PREFIX!r} must end with ':' (e.g. "
                               f"{CELERY_REDIS_KEY_PREFIX + ':'!r}): a prefix without a separator would take in "
                               "other projects' keys")
# A task that a killed worker held goes to another worker after 5 minutes, not kombu's default hour
# (manage.py check: wow_django.W008); every task of wow_django is idempotent, so a redelivery does no harm.
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": CELERY_REDIS_KEY_PREFIX, "visibility_timeout": 300}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": CELERY_REDIS_KEY_PREFIX}
CELERY_TASK_DEFAULT_QUEUE = f"{BROKER_NAMESPACE}.celery"
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The bus: rollups go to their own queue (run it with one serial worker:
# celery -A sample_project worker -Q wow-demo.bus.rollup -c 1); the relay
# republishes PENDING events every 30 s (celery -A sample_project beat).
CELERY_TASK_ROUTES = {"wow_django.bus.rollup": {"queue": WOW["BUS_ROLLUP_QUEUE"]}}
CELERY_BEAT_SCHEDULE = {
    "wow-bus-relay-pending": {"task": "wow_django.bus.relay_pending", "schedule": 30.0},
}

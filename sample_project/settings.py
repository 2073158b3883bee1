"""Settings of the sample order service.

Runs on embedded defaults with no environment at all: SQLite for Django's own
tables, the embedded MongoDB engine (mongomock://) for events and snapshots.
Environment variables switch to real servers:

- ``WOW_MONGO_URI``: e.g. ``mongodb://localhost:27017/order_service``
- PostgreSQL for Django's own tables with ``SAMPLE_POSTGRES_DB`` (and
  ``SAMPLE_POSTGRES_HOST``/``_USER``/``_PASSWORD``/``_PORT``); otherwise
  SQLite at ``SAMPLE_SQLITE_PATH`` (default ``sample.sqlite3`` here).
"""

import os
from pathlib import Path

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
    DATABASES = {
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
        }
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- HTTP API (wow_django.http) and its OpenAPI schema -------------------------------
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {
    "TITLE": "Order service",
    "DESCRIPTION": "Commands, state, snapshots and event streams of the sample order service (wow_django).",
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",  # the command schemas are pydantic's JSON Schema 2020-12
}

WOW = {
    "CONTEXT_NAME": "order-service",
    "SERVICE_NAME": "order-service",
    "SNAPSHOT_STRATEGY": "all",
}
if os.environ.get("WOW_MONGO_URI"):
    WOW["MONGO_URI"] = os.environ["WOW_MONGO_URI"]
if os.environ.get("WOW_BUS_TRANSPORT_URL"):
    WOW["BUS_TRANSPORT_URL"] = os.environ["WOW_BUS_TRANSPORT_URL"]

# --- Celery ----------------------------------------------------------------------
# Redis is the broker. On the embedded Mongo engine a worker process could not
# see this process's data, so tasks run eagerly unless CELERY_EAGER=0.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_ALWAYS_EAGER = os.environ.get("CELERY_EAGER", "0" if os.environ.get("WOW_MONGO_URI") else "1") == "1"
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The bus: rollups go to their own queue (run it with one serial worker:
# celery -A sample_project worker -Q wow.bus.rollup -c 1); the relay
# republishes PENDING events every 30 s (celery -A sample_project beat).
CELERY_TASK_ROUTES = {"wow_django.bus.rollup": {"queue": "wow.bus.rollup"}}
CELERY_BEAT_SCHEDULE = {
    "wow-bus-relay-pending": {"task": "wow_django.bus.relay_pending", "schedule": 30.0},
}

# The embedded engine lives in one process: its warning is expected here.
SILENCED_SYSTEM_CHECKS = [] if os.environ.get("WOW_MONGO_URI") else ["wow_django.W001"]

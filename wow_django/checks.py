"""System checks (``manage.py check``) for the ``WOW`` settings."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from wow_django.application.ports import TaskQueue
from wow_django.conf import IMPORT_STRINGS, validate_user_settings, wow_settings


@checks.register("wow_django")
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    user = getattr(settings, "WOW", None)
    problems = validate_user_settings(user)
    if not isinstance(user, dict | None):  # the whole setting, not one key of it
        return [checks.Error(
            f"settings.WOW must be a dict of wow_django settings, not {type(user).__name__} ({_short(user)})",
            hint="e.g. WOW = {\"CONTEXT_NAME\": \"bank-service\"}; every key is optional (see the README).",
            id="wow_django.E001")]
    messages: list[checks.CheckMessage] = [
        checks.Error(f"WOW[{key!r}] {problem}", hint=f"Fix WOW[{key!r}] in your settings.", id="wow_django.E001")
        for key, problem in problems
    ]
    if messages:
        return messages
    for name in IMPORT_STRINGS:  # a dotted path that does not import is a check error, not a 500 later
        try:
            getattr(wow_settings, name)
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), hint=f"Fix WOW[{name!r}] in your settings.", id="wow_django.E001"))
    if not messages and not (isinstance(wow_settings.TASK_QUEUE, type) and issubclass(wow_settings.TASK_QUEUE, TaskQueue)):
        messages.append(checks.Error(
            f"WOW['TASK_QUEUE'] must name a wow_django.application.TaskQueue subclass, got {wow_settings.TASK_QUEUE!r}",
            hint="Use wow_django.tasks.CeleryTaskQueue or your own TaskQueue subclass.", id="wow_django.E001",
        ))
    messages.extend(_api_policy_errors())
    if messages:
        return messages
    uses_mongo = any(wow_settings.storage_for(p) == "mongo" for p in ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE", "BUS_STORE"))
    if uses_mongo:
        from wow_django.backends.mongo import PURPOSES, configured_uri, database_name
        from wow_django.backends.mongo.client import parse_uri

        try:
            embedded, _ = parse_uri(configured_uri())
            for purpose in PURPOSES:
                database_name(purpose)
        except ImproperlyConfigured as exc:
            return [checks.Error(str(exc), hint="Set WOW['MONGO_URI'] to a URI with a database.",
                                 id="wow_django.E002")]
        if embedded and importlib.util.find_spec("mongomock") is None:
            return [checks.Error(
                "WOW['MONGO_URI'] uses the embedded engine (mongomock://) but mongomock is not installed.",
                hint="pip install 'wow-django[mongomock]', or set WOW['MONGO_URI'] to a mongodb:// URI.",
                id="wow_django.E003",
            )]
        if embedded and not _running_tests():
            messages.append(checks.Warning(
                "wow_django is using the embedded MongoDB engine (mongomock://): data is neither "
                "persisted nor shared between processes (web workers, Celery workers, consumers and "
                "management commands each see their own empty store). It is meant for tests.",
                hint="Set WOW['MONGO_URI'] to a mongodb:// or mongodb+srv:// URI, or leave MONGO_URI and "
                     "STORAGE unset to keep events in the project's database (the django backend).",
                id="wow_django.W001",
            ))
    uses_django = any(wow_settings.storage_for(p) == "django" for p in ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE", "BUS_STORE"))
    if uses_django:
        from wow_django.backends.django.connection import validate_database

        try:
            validate_database(wow_settings.DATABASE_ALIAS)
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), hint="Set WOW['DATABASE_ALIAS'] to a PostgreSQL or SQLite database.",
                                         id="wow_django.E004"))
    if not settings.DEBUG and wow_settings.TENANT_RESOLVER.__name__ == "HeaderTenantResolver":
        messages.append(checks.Warning(
            "WOW['TENANT_RESOLVER'] takes the tenant from the Command-Tenant-Id request header: any client can "
            "act for any tenant unless a trusted proxy sets that header.",
            hint="Use wow_django.http.tenancy.UserTenantResolver (tenant from the authenticated user) or your "
                 "own resolver; silence wow_django.W004 if a gateway sets the header.",
            id="wow_django.W004",
        ))
    if (not settings.DEBUG and apps.is_installed("wow_django.bus")
            and wow_settings.BUS_TRANSPORT_URL.split("://", 1)[0] == "memory"):
        messages.append(checks.Warning(
            "WOW['BUS_TRANSPORT_URL'] is kombu's memory:// transport: bus messages never leave this process, "
            "so consumers in other processes (manage.py wow_consume) receive nothing.",
            hint="Set WOW['BUS_TRANSPORT_URL'] to your RabbitMQ (amqp://user:password@host:5672//).",
            id="wow_django.W005",
        ))
    if not settings.DEBUG and _api_allows_anyone():
        messages.append(checks.Warning(
            "The command and query API lets anonymous clients in (its permission classes are AllowAny, DRF's "
            "default): anyone who reaches it can send commands, delete aggregates and read snapshots.",
            hint="Set WOW['API_PERMISSION_CLASSES'] (e.g. ['rest_framework.permissions.IsAuthenticated']) or "
                 "REST_FRAMEWORK['DEFAULT_PERMISSION_CLASSES']; silence wow_django.W006 if that is intended.",
            id="wow_django.W006",
        ))
    celery_problem = _celery_unconfigured()
    if celery_problem:
        messages.append(checks.Warning(
            celery_problem,
            hint="Define your Celery app and import it in your project package's __init__.py (CELERY_BROKER_URL "
                 "in settings, app.config_from_object('django.conf:settings', namespace='CELERY')); to run tasks "
                 "inline instead, set CELERY_TASK_ALWAYS_EAGER = True, which only that app reads from settings.",
            id="wow_django.W007",
        ))
    slow = _slow_redelivery()
    if slow:
        messages.append(checks.Warning(
            slow,
            hint="Set CELERY_BROKER_TRANSPORT_OPTIONS = {'visibility_timeout': 300} (longer than your longest task "
                 "runs; wow_django's tasks are idempotent, so a task redelivered while it still runs does no harm), "
                 "or use RabbitMQ, which redelivers as soon as the worker's connection drops.",
            id="wow_django.W008",
        ))
    for what, url in _broker_urls():
        problem = _transport_problem(url)
        if problem:
            scheme = url.split("://", 1)[0]
            base = scheme.split("+", 1)[0]
            extra = "wow-django[redis]" if base in ("redis", "rediss") else f"celery[{base}]"
            messages.append(checks.Error(
                f"{what} ({scheme}://…): {problem}",
                hint=f'Install its transport\'s requirements: pip install "{extra}".',
                id="wow_django.E005",
            ))
    if wow_settings.SNAPSHOT_MODE == "celery" and _cache_is_process_local():
        messages.append(checks.Warning(
            "WOW['SNAPSHOT_MODE'] is 'celery' but the default cache is local to each process: the marker that "
            "coalesces snapshot requests is set in the web process and cleared in the worker, so they do not see "
            "each other and snapshots lag by up to the marker's lifetime.",
            hint="Use a shared cache (e.g. django.core.cache.backends.redis.RedisCache) for CACHES['default'].",
            id="wow_django.W003",
        ))
    in_memory = [p for p in ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE", "BUS_STORE") if wow_settings.storage_for(p) == "in_memory"]
    if in_memory and not _running_tests():
        messages.append(checks.Warning(
            f"{', '.join(in_memory)} use the in-memory backend: data is neither persisted nor shared "
            "between processes. It is meant for tests.",
            hint="Set WOW['STORAGE'] (or the per-store setting) to 'django' (the project's database) or "
                 "'mongo'.",
            id="wow_django.W002",
        ))
    return messages


def _api_policy_errors() -> list[checks.CheckMessage]:
    """A dotted path in the API's DRF policy that does not import is an error now, not a 500 per request."""
    errors: list[checks.CheckMessage] = []
    for name in ("API_AUTHENTICATION_CLASSES", "API_PERMISSION_CLASSES"):
        for value in getattr(wow_settings, name) or ():
            if not isinstance(value, str):
                continue
            try:
                import_string(value)
            except ImportError as exc:
                errors.append(checks.Error(f"WOW[{name!r}]: {value!r} does not import ({exc})",
                                           hint=f"Fix WOW[{name!r}] in your settings.", id="wow_django.E001"))
    return errors


def _api_allows_anyone() -> bool:
    """Whether the API's effective permission classes (WOW's, else DRF's defaults) are all AllowAny."""
    from rest_framework.permissions import AllowAny
    from rest_framework.settings import api_settings

    from wow_django.http.base import import_classes

    configured = wow_settings.API_PERMISSION_CLASSES
    try:
        classes = (import_classes(configured) if configured is not None
                   # DRF's stub types the setting as dotted paths; api_settings gives the imported classes.
                   else list(api_settings.DEFAULT_PERMISSION_CLASSES))  # type: ignore[arg-type]
    except ImportError:
        return False  # reported as an error above
    return all(isinstance(c, type) and issubclass(c, AllowAny) for c in classes)


def _celery_unconfigured() -> str | None:
    """Why Celery tasks would go nowhere useful, or None: the task queue is Celery's, tasks are not eager and
    the current Celery app names no broker (a SENT command would wait on Celery's default amqp://localhost)."""
    from wow_django.tasks import CeleryTaskQueue

    queue = wow_settings.TASK_QUEUE
    if not (isinstance(queue, type) and issubclass(queue, CeleryTaskQueue)):
        return None
    from celery import current_app

    conf = current_app.conf
    if conf.task_always_eager or conf.broker_url:
        return None
    return ("WOW['TASK_QUEUE'] sends tasks through Celery, but the current Celery app names no broker and is not "
            "eager: commands sent with Command-Wait-Stage SENT, Celery-mode snapshots and bus rollups would go to "
            "Celery's default broker (amqp://guest@localhost//).")


#: The longest visibility timeout (s) of a Redis or SQS broker W008 keeps quiet about.
MAX_VISIBILITY_TIMEOUT_S = 900


def _slow_redelivery() -> str | None:
    """Why a task held by a killed Celery worker would wait long to run again: Celery's broker is Redis (or SQS)
    and its visibility timeout is kombu's default hour, or longer than MAX_VISIBILITY_TIMEOUT_S; None otherwise."""
    for what, url in _broker_urls():
        if what != "Celery's broker" or url.split("://", 1)[0].split("+", 1)[0] not in ("redis", "rediss", "sqs"):
            continue
        from celery import current_app

        options = current_app.conf.broker_transport_options or {}
        timeout = options.get("visibility_timeout")
        if timeout is None or not isinstance(timeout, (int, float)) or timeout > MAX_VISIBILITY_TIMEOUT_S:
            shown = "kombu's default of an hour" if timeout is None else f"{timeout!r} s"
            return (f"Celery's broker ({url.split('://', 1)[0]}://…) gives a task that a killed worker was running "
                    f"(process_command of a command sent with SENT, a bus rollup) to another worker only after its "
                    f"visibility timeout: {shown}. Until then that command stays SENT.")
    return None


def _broker_urls() -> list[tuple[str, str]]:
    """(what, URL) of each broker this process talks to with kombu: the current Celery app's (when WOW sends
    tasks through Celery and they are not eager) and the bus's (WOW['BUS_TRANSPORT_URL'])."""
    from wow_django.tasks import CeleryTaskQueue

    found: list[tuple[str, str]] = []
    queue = wow_settings.TASK_QUEUE
    if isinstance(queue, type) and issubclass(queue, CeleryTaskQueue):
        from celery import current_app

        conf = current_app.conf
        url = conf.broker_url
        if isinstance(url, str) and url and not conf.task_always_eager:
            found.append(("Celery's broker", url.split(";")[0].strip()))
    bus = wow_settings.BUS_TRANSPORT_URL
    if isinstance(bus, str) and bus:
        found.append(("WOW['BUS_TRANSPORT_URL']", bus.split(";")[0].strip()))
    return found


def _transport_problem(url: str) -> str | None:
    """Why kombu cannot load the transport of ``url`` in this environment (a module its transport imports is not
    installed: Celery's Redis transport needs redis and packaging, which ``celery[redis]`` brings), or None."""
    from kombu import Connection

    scheme = url.split("://", 1)[0] if "://" in url else url
    connection = None
    try:
        connection = Connection(url)
        connection.transport  # noqa: B018 - imports the transport and builds it (its driver check); no I/O
    except KeyError:
        return f"kombu has no transport named {scheme!r}"
    except Exception as exc:  # noqa: BLE001 - a module missing shows as ImportError or, in kombu's Redis
        # transport without redis-py, as an AttributeError while its module is imported
        return f"its transport does not load ({type(exc).__name__}: {exc})"
    finally:
        if connection is not None:
            connection.release()
    return None


def _running_tests() -> bool:
    """Whether Django's test environment is set up (the test runner, pytest-django): the one-process
    backends are what tests are meant to use, so they are not warned about there."""
    from django.core import mail

    return hasattr(mail, "outbox")


def _cache_is_process_local() -> bool:
    from django.conf import settings

    backend = getattr(settings, "CACHES", {}).get("default", {}).get(
        "BACKEND", "django.core.cache.backends.locmem.LocMemCache"
    )
    return backend.rsplit(".", 1)[-1] in ("LocMemCache", "DummyCache")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The ``WOW`` settings dict, read lazily with defaults.

Usage::

    from wow_django.conf import wow_settings
    wow_settings.CONTEXT_NAME

Nothing is read at import time; the object reloads in place when Django's
``setting_changed`` signal reports a change to ``WOW`` (``override_settings``
works in tests).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

DEFAULT_MONGO_URI = "mongomock://localhost/wow"

STORAGE_CHOICES = ("mongo", "in_memory", "django")
FOLLOWERS_RUN_CHOICES = ("threads", "command", "celery")
REQUEST_ID_INDEX_MODES = ("aggregate", "global")
SNAPSHOT_STRATEGIES = ("all", "version_offset", "time_offset", "none")
SNAPSHOT_MODES = ("follower", "inline", "celery")

DEFAULTS: dict[str, Any] = {
    # --- identity -----------------------------------------------------
    # The bounded context this project is. A MongoDB database belongs to one
    # context (see wow_database_metadata).
    "CONTEXT_NAME": "default",
    # The context's alias in the API's paths, as Wow's clients send it ({alias}/{aggregate}/…); None: the
    # routes have no alias prefix (a client with an empty contextAlias).
    "CONTEXT_ALIAS": None,
    # --- storage selection ----------------------------------------------
    # Default backend for everything: "mongo", "in_memory" or "django" (the
    # project's database through the ORM, see DATABASE_ALIAS). None (the
    # default) means "mongo" when MONGO_URI is set, "django" otherwise.
    "STORAGE": None,
    # Per-purpose overrides (None means: use STORAGE).
    "EVENT_STORE": None,
    "SNAPSHOT_STORE": None,
    "PREPARE_STORE": None,
    "BUS_STORE": None,
    # --- the Django ORM (storage "django") -------------------------------
    # The database (a key of settings.DATABASES, PostgreSQL or SQLite) that
    # holds the django backend's tables: migrate it with
    # ``manage.py migrate --database=<alias>``.
    "DATABASE_ALIAS": "default",
    # The time limit of each query of the query API (the condition DSL) on the
    # django backend: PostgreSQL's statement_timeout; on SQLite a progress
    # handler that interrupts the statement past it. Then QueryTooExpensive (400).
    "DATABASE_QUERY_TIMEOUT_MS": 10_000,
    # --- MongoDB ----------------------------------------------------------
    # mongodb://, mongodb+srv:// or mongomock:// (the embedded engine).
    # None means the embedded engine on database "wow".
    "MONGO_URI": None,
    # Per-purpose databases; None means the URI's database.
    "EVENT_STREAM_DATABASE": None,
    "SNAPSHOT_DATABASE": None,
    "PREPARE_DATABASE": None,
    "BUS_DATABASE": None,
    # Create collections and indexes on first use of each collection.
    "AUTO_INIT_SCHEMA": True,
    # "aggregate": unique {aggregateId, requestId} (shard-safe, default);
    # "global": unique {requestId} across the collection.
    "REQUEST_ID_INDEX": "aggregate",
    # Server-side time limit for every query (maxTimeMS).
    "MONGO_MAX_TIME_MS": 10_000,
    # Followers on MongoDB learn of other processes' appends from one change stream per process (a replica
    # set or sharded cluster; a standalone server or the embedded engine: they poll with backoff).
    "MONGO_CHANGE_STREAMS": True,
    # How long an operation waits for a MongoDB server it can use (pymongo's default is 30 s); a URI's own
    # serverSelectionTimeoutMS wins. Past it the store is unreachable: a 503, not retried inside the request.
    "MONGO_SERVER_SELECTION_TIMEOUT_MS": 5_000,
    # --- batching of concurrent appends -----------------------------------
    # The django event store writes concurrent appends of one process to one context (outside a transaction)
    # together, by one of the appending threads on its connection; False: each append alone.
    "EVENT_STORE_COMBINE": True,
    "EVENT_STORE_BATCH": {
        "ENABLED": False,
        "MAX_SIZE": 128,
        "MAX_DELAY_MS": 1.0,
        "MAX_PENDING": 4096,
        "LANE_COUNT": 1,
    },
    # --- aggregates and the command gateway -------------------------------
    "COMMAND_RETRY_LIMIT": 8,
    "COMMAND_RETRY_BACKOFF_MS": 5.0,
    "COMMAND_WAIT_TIMEOUT_S": 30.0,
    # The storage work of one command attempt (load, prepared keys, append) on MongoDB must finish within
    # this (pymongo's client-side operation timeout), and no retry starts after it: a failover cannot hold
    # a request, and its aggregate's lock, for minutes. None: unbounded (each operation still has
    # MONGO_MAX_TIME_MS server-side and the server-selection timeout).
    "COMMAND_STORAGE_TIMEOUT_S": 10.0,
    # How long the outcome of a command sent with wait stage SENT can be looked up by its request id.
    "COMMAND_STATUS_TTL_S": 7 * 24 * 3600,
    # --- snapshots ----------------------------------------------------------
    "SNAPSHOT_STRATEGY": "all",
    "SNAPSHOT_VERSION_OFFSET": 5,
    "SNAPSHOT_TIME_OFFSET_S": 60.0,
    "SNAPSHOT_MODE": "follower",
    # The snapshot follower waits this long after a batch before reading on (a SNAPSHOT wait of this process
    # hurries it), so that one snapshot write covers more commands to an aggregate.
    "SNAPSHOT_FOLLOWER_LINGER_S": 0.05,
    # --- background work ---------------------------------------------------------
    # The task queue the application hands work to (commands sent with stage
    # SENT, snapshots in "celery" mode, bus rollups): a class implementing
    # wow_django.application.ports.TaskQueue. The default sends Celery tasks.
    "TASK_QUEUE": "wow_django.tasks.CeleryTaskQueue",
    # --- queries --------------------------------------------------------------
    "QUERY_ALLOW_RAW": False,
    "QUERY_MAX_PAGE_SIZE": 200,
    "QUERY_MAX_LIMIT": 1000,
    "QUERY_MAX_DEPTH": 16,
    "TENANT_RESOLVER": "wow_django.http.tenancy.HeaderTenantResolver",
    "API_AUTHENTICATION_CLASSES": None,
    "API_PERMISSION_CLASSES": None,
    # --- integration-event bus ---------------------------------------------
    "SERVICE_NAME": None,
    "BUS_TRANSPORT_URL": "memory://",
    "BUS_EXCHANGE": "wow.bus",
    "BUS_RELAY_AFTER_S": 30.0,
    "BUS_REPUSH_TIMEOUT_S": 300.0,
    "BUS_REPUSH_MAX_COUNT": 5,
    # Top-level payload fields each sent event is found by (its search keys, with the envelope's own
    # ``keys``): e.g. ("orderId", "userId") finds every event whose payload names that order or user.
    "BUS_SEARCH_FIELDS": (),
    "BUS_CONSUMER_MAX_ATTEMPTS": 3,
    "BUS_CONSUMER_BACKOFF_S": 0.5,
    "BUS_ROLLUP_QUEUE": "wow.bus.rollup",
    # Coalesce rollup requests: each feedback adds its eventId to a pending set
    # in the default cache's Redis and queues one rollup task only when none is
    # queued; that task rolls up every pending event. Only with Django's
    # RedisCache as CACHES['default'] (shared by every process); with any other
    # cache, or False, each feedback queues its own task.
    "BUS_ROLLUP_COALESCE": True,
    "BUS_CALLBACK_TOKENS": {},
    # A consumer's claim on an event in its inbox lasts this long; a crashed
    # worker's claim is taken over after it.
    "BUS_INBOX_LEASE_S": 60.0,
    # Connect and publisher-confirm timeout of one publish.
    "BUS_PUBLISH_TIMEOUT_S": 5.0,
    # Unacknowledged messages a consumer worker holds at once.
    "BUS_CONSUMER_PREFETCH": 16,
    # Retention (the bus purge: Celery task wow_django.bus.purge, manage.py wow_bus_purge). None keeps
    # events forever. BUS_RETENTION_DAYS: CONSUMED events are deleted, with their feedback, inbox entries
    # and re-push audit, this many days after they settled. BUS_EXPIRED_RETENTION_DAYS: events whose
    # expireAt passed are deleted this many days after it, whatever their status. Events still in flight
    # or failed (PENDING, SENT, RETRYING, PARTIAL, FAILED) are kept until they settle or expire.
    "BUS_RETENTION_DAYS": None,
    "BUS_EXPIRED_RETENTION_DAYS": None,
    # The longest an append waits for its context's lock (held by another writer until it commits):
    # PostgreSQL's lock_timeout for the append statement, SQLite's busy timeout; on MongoDB the retries of
    # a transaction meeting another append's on the context's position counter (a replica set), or the
    # embedded engine's position lock. Then ContextLockTimeout (retryable, HTTP 503). None: wait without
    # limit (120 s for MongoDB's retries).
    "APPEND_LOCK_TIMEOUT_S": 5.0,
    # --- followers (wow_follow) ---------------------------------------------
    # How long a follower waits for a position missing below a visible one
    # (a late commit) before it passes it and records the gap. Backends whose
    # gaps are final (in_memory, django) never wait.
    "FOLLOWER_GAP_TIMEOUT_S": 10.0,
    # A running instance's lease on its follower; a dead instance's is taken
    # over after it. Renewed once a third of it has passed, and by a heartbeat
    # while a handler runs, so it can be short: a standby takes over in seconds.
    "FOLLOWER_LEASE_S": 6.0,
    # Streams per read: doubled while reads come back full, halved when live.
    "FOLLOWER_MIN_BATCH": 16,
    "FOLLOWER_MAX_BATCH": 1000,
    # The longest wait between reads of a live follower (backoff from 10 ms).
    "FOLLOWER_MAX_WAIT_S": 1.0,
    # Where the followers (projections, event processors, @follower) run:
    # "threads" — as threads of every process that handles commands (web,
    # Celery worker), started on its first command; leases pick one instance
    # of each follower across the processes. "command" — only in
    # ``manage.py wow_follow`` processes. "celery" — only from the Celery
    # beat task ``wow_django.follow`` (see ``wow_django.tasks.beat_schedule``)
    # and wow_follow.
    "FOLLOWERS_RUN": "threads",
}

# Settings holding a dotted path that is imported on first use.
IMPORT_STRINGS = ("TENANT_RESOLVER", "TASK_QUEUE")

# Nested dicts whose keys are validated and merged over their defaults.
NESTED = ("EVENT_STORE_BATCH",)


def _validate_positive(value: Any, *, integer: bool) -> str | None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        return "must be an integer" if integer else "must be a number"
    if value <= 0:
        return "must be greater than 0"
    return None


def _choice(choices: tuple[str, ...], optional: bool = False):
    def check(value: Any) -> str | None:
        if optional and value is None:
            return None
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            return f"must be one of {allowed}" + (" or None" if optional else "")
        return None

    return check


def _optional_str(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        return "must be a non-empty string or None"
    return None


def _str(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    return None


def _context_alias(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        return "must be None or a path segment of letters, digits, '_', '.' or '-' (at most 64)"
    if value in ("tenant", "owner"):
        return "must not be 'tenant' or 'owner' (the API's attribution prefixes)"
    return None


def _database_alias(value: Any) -> str | None:
    problem = _str(value)
    if problem:
        return problem
    from django.conf import settings

    databases = getattr(settings, "DATABASES", None) or {}
    if value not in databases:
        configured = ", ".join(repr(alias) for alias in databases) or "none"
        return f"must name a database in settings.DATABASES (configured: {configured})"
    return None


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be True or False"


def _pos_int(value: Any) -> str | None:
    return _validate_positive(value, integer=True)


def _pos_num(value: Any) -> str | None:
    return _validate_positive(value, integer=False)


def _non_negative_num(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return "must be a number ≥ 0"
    return None


def _optional_pos_num(value: Any) -> str | None:
    return None if value is None else _pos_num(value) and "must be None or a number > 0"


def _optional_non_negative_num(value: Any) -> str | None:
    if value is None:
        return None
    return "must be None or a number ≥ 0" if _non_negative_num(value) else None


def _optional_class_list(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return "must be None or a list of dotted paths"
    return None


#: A bus search key's name (a field of BUS_SEARCH_FIELDS, a key of an envelope's ``keys``): what an operator
#: knows an event by (``orderId``, ``aggregateId``); and how many keys one event has at most.
KEY_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
MAX_KEYS = 16


def _search_fields(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and KEY_NAME_RE.fullmatch(v) for v in value):
        return ("must be a list of payload field names (letters, digits, '_', '.' or '-', starting with a letter, "
                "at most 64)")
    if len(value) > MAX_KEYS:
        return f"must name at most {MAX_KEYS} fields"
    return None


def _str_dict(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in value.items()
    ):
        return "must be a dict of consumer id → non-empty token string"
    return None


VALIDATORS = {
    "CONTEXT_NAME": _str,
    "CONTEXT_ALIAS": _context_alias,
    "STORAGE": _choice(STORAGE_CHOICES, optional=True),
    "EVENT_STORE": _choice(STORAGE_CHOICES, optional=True),
    "SNAPSHOT_STORE": _choice(STORAGE_CHOICES, optional=True),
    "PREPARE_STORE": _choice(STORAGE_CHOICES, optional=True),
    "BUS_STORE": _choice(STORAGE_CHOICES, optional=True),
    "DATABASE_ALIAS": _database_alias,
    "DATABASE_QUERY_TIMEOUT_MS": _pos_int,
    "MONGO_URI": _optional_str,
    "EVENT_STREAM_DATABASE": _optional_str,
    "SNAPSHOT_DATABASE": _optional_str,
    "PREPARE_DATABASE": _optional_str,
    "BUS_DATABASE": _optional_str,
    "AUTO_INIT_SCHEMA": _bool,
    "REQUEST_ID_INDEX": _choice(REQUEST_ID_INDEX_MODES),
    "MONGO_MAX_TIME_MS": _pos_int,
    "MONGO_CHANGE_STREAMS": _bool,
    "MONGO_SERVER_SELECTION_TIMEOUT_MS": _pos_int,
    "EVENT_STORE_COMBINE": _bool,
    "EVENT_STORE_BATCH.ENABLED": _bool,
    "EVENT_STORE_BATCH.MAX_SIZE": _pos_int,
    "EVENT_STORE_BATCH.MAX_DELAY_MS": _non_negative_num,
    "EVENT_STORE_BATCH.MAX_PENDING": _pos_int,
    "EVENT_STORE_BATCH.LANE_COUNT": _pos_int,
    "COMMAND_RETRY_LIMIT": _pos_int,
    "COMMAND_RETRY_BACKOFF_MS": _non_negative_num,
    "COMMAND_WAIT_TIMEOUT_S": _pos_num,
    "COMMAND_STORAGE_TIMEOUT_S": _optional_pos_num,
    "COMMAND_STATUS_TTL_S": _pos_num,
    "SNAPSHOT_STRATEGY": _choice(SNAPSHOT_STRATEGIES),
    "SNAPSHOT_VERSION_OFFSET": _pos_int,
    "SNAPSHOT_TIME_OFFSET_S": _pos_num,
    "SNAPSHOT_MODE": _choice(SNAPSHOT_MODES),
    "SNAPSHOT_FOLLOWER_LINGER_S": _non_negative_num,
    "TASK_QUEUE": _str,
    "QUERY_ALLOW_RAW": _bool,
    "QUERY_MAX_PAGE_SIZE": _pos_int,
    "QUERY_MAX_LIMIT": _pos_int,
    "QUERY_MAX_DEPTH": _pos_int,
    "TENANT_RESOLVER": _str,
    "API_AUTHENTICATION_CLASSES": _optional_class_list,
    "API_PERMISSION_CLASSES": _optional_class_list,
    "SERVICE_NAME": _optional_str,
    "BUS_TRANSPORT_URL": _str,
    "BUS_EXCHANGE": _str,
    "BUS_RELAY_AFTER_S": _pos_num,
    "BUS_REPUSH_TIMEOUT_S": _non_negative_num,
    "BUS_REPUSH_MAX_COUNT": _pos_int,
    "BUS_SEARCH_FIELDS": _search_fields,
    "BUS_CONSUMER_MAX_ATTEMPTS": _pos_int,
    "BUS_CONSUMER_BACKOFF_S": _non_negative_num,
    "BUS_ROLLUP_QUEUE": _str,
    "BUS_ROLLUP_COALESCE": _bool,
    "BUS_CALLBACK_TOKENS": _str_dict,
    "BUS_INBOX_LEASE_S": _pos_num,
    "BUS_PUBLISH_TIMEOUT_S": _pos_num,
    "BUS_CONSUMER_PREFETCH": _pos_int,
    "BUS_RETENTION_DAYS": _optional_non_negative_num,
    "BUS_EXPIRED_RETENTION_DAYS": _optional_non_negative_num,
    "FOLLOWER_GAP_TIMEOUT_S": _non_negative_num,
    "APPEND_LOCK_TIMEOUT_S": _optional_non_negative_num,
    "FOLLOWER_LEASE_S": _pos_num,
    "FOLLOWER_MIN_BATCH": _pos_int,
    "FOLLOWER_MAX_BATCH": _pos_int,
    "FOLLOWER_MAX_WAIT_S": _pos_num,
    "FOLLOWERS_RUN": _choice(FOLLOWERS_RUN_CHOICES),
}


def _suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def redact_url(url: str) -> str:
    """``url`` with the password of its user info replaced by ``***``, with or without a scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    slash = rest.find("/")
    at = rest.rfind("@", 0, slash if slash != -1 else len(rest))
    if at == -1:
        at = rest.rfind("@")  # a password with an unescaped '/': hide up to the last '@'
    if at == -1:
        return url
    user, colon, _password = rest[:at].partition(":")
    return f"{scheme}{sep}{user}{':***' if colon else ''}@{rest[at + 1:]}"


# Settings that hold secrets: a message shows them only through these.
SECRET_SETTINGS = {
    "BUS_CALLBACK_TOKENS": lambda value: (
        "{" + ", ".join(f"{key!r}: {'***' if isinstance(token, str) and token else type(token).__name__}"
                        for key, token in value.items()) + "}"
        if isinstance(value, dict) else f"a {type(value).__name__}"
    ),
    "MONGO_URI": lambda value: repr(redact_url(value)) if isinstance(value, str) else repr(value),
    "BUS_TRANSPORT_URL": lambda value: repr(redact_url(value)) if isinstance(value, str) else repr(value),
}


def shown_value(key: str, value: Any) -> str:
    """``value`` of setting ``key`` for a message: secrets redacted."""
    show = SECRET_SETTINGS.get(key)
    return show(value) if show is not None else repr(value)


def validate_user_settings(user: Any) -> list[tuple[str, str]]:
    """Return ``(key, problem)`` pairs for a user's ``WOW`` dict; empty when valid."""
    if user is None:
        return []
    if not isinstance(user, dict):
        return [("WOW", f"must be a dict, not {type(user).__name__}")]
    problems: list[tuple[str, str]] = []
    for key, value in user.items():
        if key not in DEFAULTS:
            problems.append((key, "is not a wow_django setting." + _suggest(str(key), DEFAULTS)))
            continue
        if key in NESTED:
            if not isinstance(value, dict):
                problems.append((key, "must be a dict"))
                continue
            for sub, sub_value in value.items():
                full = f"{key}.{sub}"
                if sub not in DEFAULTS[key]:
                    problems.append((full, "is not a known option." + _suggest(str(sub), DEFAULTS[key])))
                    continue
                problem = VALIDATORS[full](sub_value)
                if problem:
                    problems.append((full, f"{problem} (got {sub_value!r})"))
            continue
        problem = VALIDATORS[key](value)
        if problem:
            problems.append((key, f"{problem} (got {shown_value(key, value)})"))
    if not any(key in ("FOLLOWER_MIN_BATCH", "FOLLOWER_MAX_BATCH") for key, _ in problems):
        low = user.get("FOLLOWER_MIN_BATCH", DEFAULTS["FOLLOWER_MIN_BATCH"])
        high = user.get("FOLLOWER_MAX_BATCH", DEFAULTS["FOLLOWER_MAX_BATCH"])
        if low > high:
            problems.append(("FOLLOWER_MIN_BATCH", f"must be ≤ FOLLOWER_MAX_BATCH ({high}) (got {low!r})"))
    return problems


class WowSettings:
    """Lazy view of ``settings.WOW`` merged over :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cached: dict[str, Any] = {}
        self._user: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        if self._user is None:
            from django.conf import settings

            self._user = getattr(settings, "WOW", None) or {}
        return self._user

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(
                f"{name!r} is not a wow_django setting." + _suggest(name, DEFAULTS)
            )
        if name in self._cached:
            return self._cached[name]
        user = self.user_settings
        problems = [p for p in validate_user_settings(user) if p[0].split(".")[0] == name]
        if problems:
            key, problem = problems[0]
            raise ImproperlyConfigured(f"WOW[{key!r}] {problem}")
        if name in NESTED:
            value = {**DEFAULTS[name], **user.get(name, {})}
        else:
            value = user.get(name, DEFAULTS[name])
        if name == "STORAGE" and value is None:
            value = default_storage(user)
        if name in IMPORT_STRINGS and isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(f"WOW[{name!r}] cannot import {value!r}: {exc}") from exc
        self._cached[name] = value
        return value

    def storage_for(self, purpose: str) -> str:
        """The backend name for ``"EVENT_STORE"``, ``"SNAPSHOT_STORE"``, ``"PREPARE_STORE"`` or ``"BUS_STORE"``."""
        return getattr(self, purpose) or self.STORAGE

    def reload(self) -> None:
        self._cached.clear()
        self._user = None


def default_storage(user: dict[str, Any]) -> str:
    """The backend of an unset ``STORAGE``: MongoDB when a ``MONGO_URI`` is given, else the project's database."""
    return "mongo" if user.get("MONGO_URI") else "django"


wow_settings = WowSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "WOW":
        wow_settings.reload()


setting_changed.connect(_reload, dispatch_uid="wow_django.conf.reload")

"""The WOW settings object and the system checks."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from wow_django.application.runtime import get_runtime
from wow_django.backends.memory.stores import InMemoryEventStore, InMemoryPrepareKey, InMemorySnapshotStore
from wow_django.checks import check_settings
from wow_django.conf import DEFAULTS, validate_user_settings, wow_settings
from wow_django.persistence.batching import BatchingEventStore


def ids(messages):
    return [m.id for m in messages]


@pytest.fixture(autouse=True)
def debug_on(settings):
    """The tenant-resolver warning (W004) only speaks outside DEBUG; its own test turns DEBUG off."""
    settings.DEBUG = True


def test_defaults_apply_under_user_values():
    assert wow_settings.CONTEXT_NAME == "order-service"  # from the sample project's WOW
    assert DEFAULTS["STORAGE"] is None
    assert wow_settings.STORAGE == "django"  # the sample sets no MONGO_URI
    assert wow_settings.EVENT_STORE_BATCH == DEFAULTS["EVENT_STORE_BATCH"]


def test_override_settings_reloads_in_place():
    with override_settings(WOW={"CONTEXT_NAME": "billing", "EVENT_STORE_BATCH": {"MAX_SIZE": 8}}):
        assert wow_settings.CONTEXT_NAME == "billing"
        assert wow_settings.EVENT_STORE_BATCH["MAX_SIZE"] == 8
        assert wow_settings.EVENT_STORE_BATCH["MAX_DELAY_MS"] == 1.0
    assert wow_settings.CONTEXT_NAME == "order-service"


def test_unknown_attribute_names_the_setting_and_suggests():
    with pytest.raises(AttributeError, match="'CONTEXT_NAM' is not a wow_django setting. Did you mean 'CONTEXT_NAME'"):
        _ = wow_settings.CONTEXT_NAM


def test_malformed_value_is_an_error_naming_the_key():
    with override_settings(WOW={"STORAGE": "redis"}):
        with pytest.raises(ImproperlyConfigured, match=r"WOW\['STORAGE'\] must be one of 'mongo', 'in_memory'"):
            _ = wow_settings.STORAGE
        messages = check_settings()
        assert ids(messages) == ["wow_django.E001"]
        assert "WOW['STORAGE']" in messages[0].msg and "'redis'" in messages[0].msg


@pytest.mark.parametrize(
    "user, key",
    [
        ({"CONTEXT_NAME": ""}, "CONTEXT_NAME"),
        ({"MONGO_MAX_TIME_MS": 0}, "MONGO_MAX_TIME_MS"),
        ({"AUTO_INIT_SCHEMA": "yes"}, "AUTO_INIT_SCHEMA"),
        ({"REQUEST_ID_INDEX": "tenant"}, "REQUEST_ID_INDEX"),
        ({"EVENT_STORE_COMBINE": "no"}, "EVENT_STORE_COMBINE"),
        ({"EVENT_STORE_BATCH": {"MAX_SIZE": -1}}, "EVENT_STORE_BATCH.MAX_SIZE"),
        ({"EVENT_STORE_BATCH": {"MAX_SZE": 3}}, "EVENT_STORE_BATCH.MAX_SZE"),
        ({"EVENT_STORE_BATCH": 5}, "EVENT_STORE_BATCH"),
        ({"STORAGEE": "mongo"}, "STORAGEE"),
        ({"FOLLOWER_GAP_TIMEOUT_S": -1}, "FOLLOWER_GAP_TIMEOUT_S"),
        ({"FOLLOWER_LEASE_S": 0}, "FOLLOWER_LEASE_S"),
        ({"FOLLOWER_MAX_BATCH": 1.5}, "FOLLOWER_MAX_BATCH"),
        ({"FOLLOWER_MAX_WAIT_S": "1"}, "FOLLOWER_MAX_WAIT_S"),
        ({"FOLLOWER_MIN_BATCH": 2000}, "FOLLOWER_MIN_BATCH"),  # above the default maximum, 1000
        ({"FOLLOWER_MIN_BATCH": 8, "FOLLOWER_MAX_BATCH": 4}, "FOLLOWER_MIN_BATCH"),
        ({"BUS_RETENTION_DAYS": -1}, "BUS_RETENTION_DAYS"),
        ({"COMMAND_STORAGE_TIMEOUT_S": 0}, "COMMAND_STORAGE_TIMEOUT_S"),
        ({"BUS_EXPIRED_RETENTION_DAYS": "30"}, "BUS_EXPIRED_RETENTION_DAYS"),
    ],
)
def test_each_malformed_setting_is_reported_by_key(user, key):
    problems = validate_user_settings(user)
    assert [k for k, _ in problems] == [key]
    with override_settings(WOW=user):
        assert any(f"WOW[{key!r}]" in m.msg for m in check_settings())


def test_unknown_key_suggests_the_close_one():
    [(key, problem)] = validate_user_settings({"STORAGEE": "mongo"})
    assert key == "STORAGEE"
    assert "Did you mean 'STORAGE'" in problem


def test_wow_must_be_a_dict():
    with override_settings(WOW=["nope"]):
        assert "must be a dict" in check_settings()[0].msg
    with override_settings(WOW="bank-service"):  # a context name where the dict goes
        [error] = check_settings()
        assert error.msg == "settings.WOW must be a dict of wow_django settings, not str ('bank-service')"
        assert "CONTEXT_NAME" in error.hint and "WOW['WOW']" not in error.msg


def test_storage_defaults_to_the_project_database_unless_a_mongo_uri_is_set():
    with override_settings(WOW={}):
        assert wow_settings.STORAGE == "django"
        assert [wow_settings.storage_for(p) for p in ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE",
                                                      "BUS_STORE")] == ["django"] * 4
    with override_settings(WOW={"MONGO_URI": "mongodb://db.example:27017/orders"}):
        assert wow_settings.STORAGE == "mongo"
    with override_settings(WOW={"MONGO_URI": "mongodb://db.example:27017/orders", "STORAGE": "django"}):
        assert wow_settings.STORAGE == "django"
    with override_settings(WOW={"STORAGE": None}):
        assert wow_settings.STORAGE == "django"


def test_embedded_engine_is_a_warning_outside_tests(outside_tests):
    with override_settings(WOW={"MONGO_URI": "mongomock://localhost/demo"}):
        messages = check_settings()
    assert ids(messages) == ["wow_django.W001"]
    assert "neither persisted nor shared between processes" in messages[0].msg
    assert isinstance(messages[0], checks.Warning)


def test_one_process_backends_are_not_warned_about_in_tests():
    with override_settings(WOW={"MONGO_URI": "mongomock://localhost/demo"}):
        assert check_settings() == []
    with override_settings(WOW={"STORAGE": "in_memory"}):
        assert check_settings() == []


def test_the_default_storage_gives_no_warning(outside_tests):
    with override_settings(WOW={"CONTEXT_NAME": "orders"}):
        assert check_settings() == []


def test_real_server_uri_gives_no_warning():
    with override_settings(WOW={"MONGO_URI": "mongodb://db.example:27017/orders"}):
        assert check_settings() == []


def test_uri_without_database_is_an_error():
    with override_settings(WOW={"MONGO_URI": "mongodb://db.example:27017"}):
        messages = check_settings()
    assert ids(messages) == ["wow_django.E002"]
    assert "names no database" in messages[0].msg


def test_uri_without_database_is_fine_when_every_database_is_set():
    wow = {"MONGO_URI": "mongodb://db.example:27017", "EVENT_STREAM_DATABASE": "ev", "SNAPSHOT_DATABASE": "sn",
           "PREPARE_DATABASE": "pr", "BUS_DATABASE": "bus"}
    with override_settings(WOW=wow):
        assert check_settings() == []


def test_in_memory_storage_is_a_warning(outside_tests):
    with override_settings(WOW={"STORAGE": "in_memory"}):
        messages = check_settings()
    assert ids(messages) == ["wow_django.W002"]


def test_manage_py_check_fails_on_a_malformed_setting():
    with override_settings(WOW={"EVENT_STORE": "cassandra"}):
        with pytest.raises(SystemCheckError, match=r"WOW\['EVENT_STORE'\]"):
            call_command("check")


def test_store_factory_follows_settings():
    with override_settings(WOW={"STORAGE": "in_memory"}):
        assert isinstance(get_runtime().event_store, InMemoryEventStore)
        assert get_runtime().event_store is get_runtime().event_store
        assert isinstance(get_runtime().snapshot_store, InMemorySnapshotStore)
        assert isinstance(get_runtime().prepare_key("username"), InMemoryPrepareKey)
    with override_settings(WOW={"STORAGE": "in_memory", "EVENT_STORE_BATCH": {"ENABLED": True, "LANE_COUNT": 2}}):
        store = get_runtime().event_store
        assert isinstance(store, BatchingEventStore)
        assert store.lane_count == 2
        assert isinstance(store.inner, InMemoryEventStore)


def test_store_factory_refuses_unknown_storage():
    with override_settings(WOW={"SNAPSHOT_STORE": "sqlite"}):
        with pytest.raises(ImproperlyConfigured, match=r"WOW\['SNAPSHOT_STORE'\]"):
            _ = get_runtime().snapshot_store


def test_celery_snapshots_with_a_process_local_cache_are_a_warning():
    with override_settings(WOW={"SNAPSHOT_MODE": "celery", "MONGO_URI": "mongodb://db/x"}):
        assert ids(check_settings()) == ["wow_django.W003"]
        with override_settings(CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                                   "LOCATION": "redis://127.0.0.1:6379/1"}}):
            assert check_settings() == []


AUTHENTICATED = ["rest_framework.permissions.IsAuthenticated"]


def test_the_header_tenant_resolver_is_a_warning_outside_debug():
    amqp = "amqp://guest:guest@rabbit:5672//"
    with override_settings(DEBUG=False, WOW={"MONGO_URI": "mongodb://db/x", "BUS_TRANSPORT_URL": amqp,
                                             "API_PERMISSION_CLASSES": AUTHENTICATED}):
        assert ids(check_settings()) == ["wow_django.W004"]
    with override_settings(DEBUG=False, WOW={"MONGO_URI": "mongodb://db/x", "BUS_TRANSPORT_URL": amqp,
                                             "API_PERMISSION_CLASSES": AUTHENTICATED,
                                             "TENANT_RESOLVER": "wow_django.http.tenancy.UserTenantResolver"}):
        assert check_settings() == []
    with override_settings(DEBUG=True, WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []


def test_the_memory_bus_transport_is_a_warning_outside_debug():
    user_resolver = "wow_django.http.tenancy.UserTenantResolver"
    with override_settings(DEBUG=False, WOW={"MONGO_URI": "mongodb://db/x", "TENANT_RESOLVER": user_resolver,
                                             "API_PERMISSION_CLASSES": AUTHENTICATED}):
        [warning] = check_settings()
        assert warning.id == "wow_django.W005" and "memory://" in warning.msg
    with override_settings(DEBUG=True, WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []


def test_a_mongomock_uri_without_mongomock_installed_is_a_check_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mongomock" else real(name, *a))
    with override_settings(WOW={"MONGO_URI": "mongomock://localhost/x"}):
        [error] = check_settings()
        assert error.id == "wow_django.E003" and "wow-django[mongomock]" in error.hint


def test_an_api_open_to_anyone_is_a_warning_outside_debug():
    quiet = {"MONGO_URI": "mongodb://db/x", "BUS_TRANSPORT_URL": "amqp://guest:guest@rabbit:5672//",
             "TENANT_RESOLVER": "wow_django.http.tenancy.UserTenantResolver"}
    with override_settings(DEBUG=False, WOW=quiet):  # DRF's default: AllowAny
        [warning] = check_settings()
        assert warning.id == "wow_django.W006" and "delete aggregates" in warning.msg
    with override_settings(DEBUG=False, WOW={**quiet, "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}):
        assert ids(check_settings()) == ["wow_django.W006"]
    with override_settings(DEBUG=False, WOW={**quiet, "API_PERMISSION_CLASSES": AUTHENTICATED}):
        assert check_settings() == []
    with override_settings(DEBUG=False, WOW=quiet,
                           REST_FRAMEWORK={"DEFAULT_PERMISSION_CLASSES": AUTHENTICATED}):
        assert check_settings() == []
    with override_settings(DEBUG=True, WOW=quiet):
        assert check_settings() == []


def test_api_policy_paths_that_do_not_import_are_errors():
    with override_settings(WOW={"API_PERMISSION_CLASSES": ["myproject.perms.Nope"],
                                "API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.NoSuchAuth"]}):
        messages = check_settings()
    assert ids(messages) == ["wow_django.E001", "wow_django.E001"]
    assert "WOW['API_AUTHENTICATION_CLASSES']: 'rest_framework.authentication.NoSuchAuth' does not import" in messages[0].msg
    assert "WOW['API_PERMISSION_CLASSES']: 'myproject.perms.Nope' does not import" in messages[1].msg


def test_celery_without_a_broker_is_a_warning(monkeypatch):
    from celery import current_app

    conf = current_app.conf
    monkeypatch.setitem(conf, "task_always_eager", False)
    monkeypatch.setitem(conf, "broker_url", None)
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
        [warning] = check_settings()
        assert warning.id == "wow_django.W007" and "names no broker" in warning.msg
    monkeypatch.setitem(conf, "broker_url", "redis://127.0.0.1:6379/0")
    monkeypatch.setitem(conf, "broker_transport_options", {"visibility_timeout": 300})
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []
    monkeypatch.setitem(conf, "broker_url", None)
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x", "TASK_QUEUE": "tests.test_runtime.RecordingTaskQueue"}):
        assert check_settings() == []  # not Celery's queue: nothing to say


def test_a_redis_broker_that_redelivers_a_killed_workers_task_after_an_hour_is_a_warning(monkeypatch):
    """A new user's run (issue 25): tasks a kill -9'd worker held on a Redis broker came back only after kombu's
    visibility timeout, an hour by default, and nothing said so."""
    from celery import current_app

    conf = current_app.conf
    monkeypatch.setitem(conf, "task_always_eager", False)
    monkeypatch.setitem(conf, "broker_url", "redis://127.0.0.1:6379/0")
    for options, shown in (({}, "kombu's default of an hour"), ({"visibility_timeout": 3600}, "3600 s"),
                           ({"global_keyprefix": "x:"}, "an hour")):
        monkeypatch.setitem(conf, "broker_transport_options", options)
        with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
            [warning] = check_settings()
        assert warning.id == "wow_django.W008" and shown in warning.msg and "visibility_timeout" in warning.hint
    monkeypatch.setitem(conf, "broker_transport_options", {"visibility_timeout": 300})
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []
    monkeypatch.setitem(conf, "broker_transport_options", {})
    monkeypatch.setitem(conf, "broker_url", "amqp://guest:guest@127.0.0.1:5672//")  # RabbitMQ: at once
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []
    monkeypatch.setitem(conf, "broker_url", "redis://127.0.0.1:6379/0")
    monkeypatch.setitem(conf, "task_always_eager", True)  # no broker in use
    with override_settings(WOW={"MONGO_URI": "mongodb://db/x"}):
        assert check_settings() == []


def test_a_broker_whose_transport_does_not_import_is_a_check_error(monkeypatch):
    """Celery's Redis transport imports packaging, which only celery[redis] declares (issue 25, item 7): without
    it a worker crashed at start. manage.py check now says so, naming what to install."""
    import sys

    from celery import current_app

    conf = current_app.conf
    monkeypatch.setitem(conf, "task_always_eager", False)
    monkeypatch.setitem(conf, "broker_url", "redis://127.0.0.1:6379/0")
    quiet = {"MONGO_URI": "mongodb://db/x"}
    with override_settings(WOW=quiet):
        assert check_settings() == []  # installed here (the test extra takes celery[redis])
    import kombu.transport

    monkeypatch.setattr(kombu.transport, "_transport_cache", {})  # kombu keeps each transport class it loaded
    for name in [m for m in sys.modules if m == "kombu.transport.redis" or m.startswith("packaging")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "packaging", None)  # "No module named 'packaging'", as on a bare install
    with override_settings(WOW=quiet):
        [error] = check_settings()
    assert error.id == "wow_django.E005" and error.msg.startswith("Celery's broker (redis://…)")
    assert "packaging" in error.msg and 'pip install "wow-django[redis]"' in error.hint
    monkeypatch.setitem(conf, "task_always_eager", True)  # eager: no broker is used
    with override_settings(WOW=quiet):
        assert check_settings() == []
    # The bus's transport too, and a scheme kombu does not know.
    with override_settings(WOW={**quiet, "BUS_TRANSPORT_URL": "redis://127.0.0.1:6379/1"}):
        [error] = check_settings()
    assert error.id == "wow_django.E005" and error.msg.startswith("WOW['BUS_TRANSPORT_URL'] (redis://…)")
    with override_settings(WOW={**quiet, "BUS_TRANSPORT_URL": "nosuch://host"}):
        assert any(m.id == "wow_django.E005" and "nosuch" in m.msg for m in check_settings())


def test_a_broker_without_its_driver_is_a_check_error_and_plus_schemes_are_known(monkeypatch):
    """kombu's Redis transport imports redis-py lazily (its Transport refuses to start without it): the check
    builds the transport, so a missing driver is reported too; ``redis+socket://`` is a valid URL."""
    import sys

    from celery import current_app

    conf = current_app.conf
    monkeypatch.setitem(conf, "task_always_eager", False)
    quiet = {"MONGO_URI": "mongodb://db/x"}
    monkeypatch.setitem(conf, "broker_url", "redis+socket:///tmp/redis.sock")
    with override_settings(WOW=quiet):
        assert check_settings() == []
    monkeypatch.setitem(conf, "broker_url", "redis://127.0.0.1:6379/0")
    import kombu.transport

    monkeypatch.setattr(kombu.transport, "_transport_cache", {})
    for name in [m for m in sys.modules if m == "kombu.transport.redis" or m == "redis" or m.startswith("redis.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "redis", None)
    with override_settings(WOW=quiet):
        [error] = check_settings()
    assert error.id == "wow_django.E005" and "redis" in error.msg and "wow-django[redis]" in error.hint


def test_the_readme_settings_table_matches_the_defaults():
    """Every setting of DEFAULTS has a row in the README's table, no row names another, and each default the table
    shows (the first literal of each part of the default cell) is the one in DEFAULTS."""
    import ast
    import re
    from pathlib import Path

    from wow_django.conf import DEFAULTS

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    start = text.index("| setting | default | meaning |")
    rows = text[start:text.index("\n\n", start)].splitlines()[2:]
    documented: dict[str, str] = {}
    for row in rows:
        first, default, *_ = [cell.strip() for cell in row.strip().strip("|").split(" | ")]
        names = re.findall(r"`([A-Z_]+)`", first)
        if not names:  # a row about something else (the URI's readPreference)
            continue
        parts = default.split(", ") if len(names) > 1 else [default]
        if len(parts) == 1:  # one default shared by the row's settings
            parts = parts * len(names)
        assert len(parts) == len(names), f"{names}: one default per setting, or one for all, in {default!r}"
        for name, part in zip(names, parts, strict=True):
            assert name not in documented, f"{name} has two rows"
            documented[name] = part
    assert set(documented) == set(DEFAULTS)
    for name, cell in documented.items():
        literal = re.match(r"`([^`]*)`", cell.strip())
        if literal is None:  # prose: a nested setting (EVENT_STORE_BATCH)
            assert isinstance(DEFAULTS[name], dict), f"{name}: its default is not shown as a literal"
            continue
        shown = ast.literal_eval(literal.group(1))
        assert shown == DEFAULTS[name] and type(shown) in (type(DEFAULTS[name]), int), (name, shown, DEFAULTS[name])

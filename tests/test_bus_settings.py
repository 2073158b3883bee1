"""WOW['BUS_STORE']: validation, the fallback to WOW['STORAGE'], the system checks and the process's bus store."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from wow_django.application.runtime import get_runtime
from wow_django.backends.memory.bus_store import InMemoryBusStore
from wow_django.backends.mongo.bus_store import MongoBusStore
from wow_django.backends.mongo.client import disconnect
from wow_django.bus import get_bus
from wow_django.checks import check_settings
from wow_django.conf import DEFAULTS, validate_user_settings, wow_settings

from .support import fresh_wow, in_forked_child


@pytest.fixture(autouse=True)
def debug_on(settings):
    """The tenant-resolver warning (W004) only speaks outside DEBUG; these checks are about the bus."""
    settings.DEBUG = True


def ids(messages):
    return [m.id for m in messages]


def test_bus_store_defaults_to_storage():
    assert DEFAULTS["BUS_STORE"] is None
    with override_settings(WOW={"STORAGE": "in_memory"}):
        assert wow_settings.storage_for("BUS_STORE") == "in_memory"
    with override_settings(WOW={"STORAGE": "in_memory", "BUS_STORE": "mongo"}):
        assert wow_settings.storage_for("BUS_STORE") == "mongo"
    with override_settings(WOW={"BUS_STORE": "in_memory"}):
        assert wow_settings.storage_for("BUS_STORE") == "in_memory"
        assert wow_settings.storage_for("EVENT_STORE") == "django"
    with override_settings(WOW={"BUS_STORE": "in_memory", "MONGO_URI": "mongodb://db.example:27017/orders"}):
        assert wow_settings.storage_for("EVENT_STORE") == "mongo"


def test_a_bad_bus_store_is_refused_with_the_setting_named():
    [(key, problem)] = validate_user_settings({"BUS_STORE": "redis"})
    assert key == "BUS_STORE" and problem == "must be one of 'mongo', 'in_memory', 'django' or None (got 'redis')"
    with override_settings(WOW={"BUS_STORE": "redis"}):
        with pytest.raises(ImproperlyConfigured, match=r"WOW\['BUS_STORE'\] must be one of 'mongo', 'in_memory'"):
            _ = get_runtime().bus_store
        assert ids(check_settings()) == ["wow_django.E001"]
        with pytest.raises(SystemCheckError, match=r"WOW\['BUS_STORE'\]"):
            call_command("check")


def test_the_in_memory_bus_store_is_a_warning(outside_tests):
    with override_settings(WOW={"MONGO_URI": "mongodb://db.example:27017/orders", "BUS_STORE": "in_memory"}):
        messages = check_settings()
    assert ids(messages) == ["wow_django.W002"]
    assert messages[0].msg.startswith("BUS_STORE use the in-memory backend")
    with override_settings(WOW={"STORAGE": "in_memory"}):
        [warning] = check_settings()
    assert warning.msg.startswith("EVENT_STORE, SNAPSHOT_STORE, PREPARE_STORE, BUS_STORE use the in-memory backend")


def test_a_bus_store_on_the_embedded_engine_is_warned_about_alone(outside_tests):
    with override_settings(WOW={"STORAGE": "in_memory", "BUS_STORE": "mongo", "MONGO_URI": "mongomock://localhost/b"}):
        assert ids(check_settings()) == ["wow_django.W001", "wow_django.W002"]


def test_the_process_keeps_one_bus_store_until_the_settings_change():
    settings = fresh_wow("mongo", BUS_STORE="in_memory")
    with override_settings(WOW=settings):
        store = get_bus().store
        assert isinstance(store, InMemoryBusStore) and get_bus().store is store
        store.set_topic_consumer("order.purchased", "member-service", enabled=True, description=None,
                                 updated_by=None)
        assert get_bus().store.enabled_consumers("order.purchased") == ["member-service"]
        with override_settings(WOW={**settings, "BUS_REPUSH_MAX_COUNT": 9}):
            fresh = get_bus().store
            assert isinstance(fresh, InMemoryBusStore) and fresh is not store
            assert fresh.enabled_consumers("order.purchased") == []
    with override_settings(WOW={**settings, "BUS_STORE": "mongo"}):
        assert isinstance(get_bus().store, MongoBusStore)
    disconnect(settings["MONGO_URI"])


def test_a_forked_child_builds_its_own_bus_and_store():
    settings = fresh_wow("mongo", BUS_STORE="in_memory")
    with override_settings(WOW=settings):
        parent = get_bus()
        parent.store.set_topic_consumer("order.purchased", "member-service", enabled=True, description=None,
                                        updated_by=None)

        def probe():
            child = get_bus()
            return (child is not parent, child.store is not parent.store,
                    child.store.enabled_consumers("order.purchased") == [])

        assert in_forked_child(probe) == (True, True, True)
        assert get_bus() is parent and parent.store.enabled_consumers("order.purchased") == ["member-service"]
    disconnect(settings["MONGO_URI"])


def test_services_share_one_bus_database_but_not_their_own():
    """The bus database is common to the services on the bus (seed 004 §2.1); their event databases are not."""
    import uuid
    from io import StringIO

    from wow_django.application.runtime import get_runtime
    from wow_django.backends.mongo import get_connection
    from wow_django.exceptions import DatabaseOwnershipError
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_stream

    uri = f"mongomock://localhost/own_{uuid.uuid4().hex[:8]}"
    shared = {"MONGO_URI": uri, "BUS_DATABASE": "shared_bus", "STORAGE": "mongo"}
    try:
        with override_settings(WOW={**shared, "CONTEXT_NAME": "order-service", "EVENT_STREAM_DATABASE": "orders"}):
            bus = get_bus()
            bus.set_topic_consumer("order.purchased", "member-service")
            assert bus.send("order.purchased", {"n": 1}, event_id="evt-from-orders").stored
            get_runtime().event_store.append(make_stream(AggregateId("order", "o-1"), 1))
        with override_settings(WOW={**shared, "CONTEXT_NAME": "member-service", "EVENT_STREAM_DATABASE": "members"}):
            bus = get_bus()
            assert bus.store.get_event("evt-from-orders")["topic"] == "order.purchased"
            bus.set_topic_consumer("points.added", "message-service")
            assert bus.send("points.added", {"n": 2}, event_id="evt-from-members").stored
            call_command("wow_init_schema", stdout=StringIO(), stderr=StringIO())  # the shared bus is no conflict
        with override_settings(WOW={**shared, "CONTEXT_NAME": "member-service", "EVENT_STREAM_DATABASE": "orders"}):
            with pytest.raises(DatabaseOwnershipError):  # another service's event database stays refused
                get_runtime().event_store.load(AggregateId("order", "o-1"))
        with override_settings(WOW=shared):
            # The events databases are claimed; the shared bus database is not.
            claims = {name: get_connection().database(name)["wow_database_metadata"].find_one()
                      for name in ("orders", "shared_bus")}
        assert claims["orders"]["contextName"] == "order-service" and claims["shared_bus"] is None
    finally:
        disconnect(uri)

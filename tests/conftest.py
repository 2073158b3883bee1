"""Fixtures: a fresh wow_django environment per test, on each local backend."""

from __future__ import annotations

import contextlib

import pytest
from django.test import override_settings

from wow_django.backends.mongo.client import disconnect
from wow_django.bus import get_bus
from wow_django.testing import IsolatedWowMixin, isolated_registry, isolated_wow
from wow_django.testing.bus import delete_amqp_entities, unique_exchange

from .pg import drop_database_later, drop_leftovers, pg_connect_kwargs
from .support import CONSUMERS, TOKENS, fresh_wow


def _drop_test_database_later(self, test_database_name: str, verbosity: int) -> None:
    """Django's drop of a PostgreSQL test database (pytest-django's, at the end of the session), made not to wait
    for the checkpoint that ``DROP DATABASE`` forces: see :func:`tests.pg.drop_database_later`. As Django's own,
    on the server of the connection's settings, its pool closed first."""
    self.connection.close_pool()
    drop_database_later(test_database_name, pg_connect_kwargs(self.connection.settings_dict))


def pytest_configure(config) -> None:
    from django.db.backends.postgresql.creation import DatabaseCreation

    DatabaseCreation._destroy_test_db = _drop_test_database_later
    if not hasattr(config, "workerinput"):  # once per run: in the controller, or in a run without xdist
        drop_leftovers()

#: The fixture wow_isolation (every wow_django store isolated per test), as a project enables it.
pytest_plugins = ["wow_django.testing.pytest_plugin"]


@contextlib.contextmanager
def isolated(settings: dict):
    """``settings`` as the test's ``WOW``, every store isolated by wow_django.testing (as a project's tests
    are); the embedded engine of the settings' own database is let go afterwards."""
    try:
        with override_settings(WOW=settings), isolated_wow():
            yield settings
    finally:
        disconnect(settings["MONGO_URI"])


@pytest.fixture(params=["in_memory", "mongo"])
def wow(request):
    """Settings with a fresh store on the in-memory backend and on mongomock://."""
    with isolated(fresh_wow(request.param)) as settings:
        yield settings


ON_SQLITE = pytest.mark.django_db(databases=["default", "wow_sqlite"], transaction=True)


@pytest.fixture(params=["in_memory", "mongo", pytest.param("django", marks=ON_SQLITE)])
def every_backend(request):
    """Settings with a fresh store on each backend: in-memory, mongomock:// and django (the wow_sqlite
    database)."""
    if request.param == "django":
        settings = fresh_wow("django", DATABASE_ALIAS="wow_sqlite")
    else:
        settings = fresh_wow(request.param)
    with isolated(settings):
        yield settings


@pytest.fixture(params=["mongo", "in_memory"])
def bus_store(request):
    """WOW['BUS_STORE'] of a bus test: the Mongo store (on mongomock://) and the in-memory store."""
    return request.param


@pytest.fixture
def wow_memory():
    with isolated(fresh_wow("in_memory")) as settings:
        yield settings


@pytest.fixture
def wow_mongo():
    with isolated(fresh_wow("mongo")) as settings:
        yield settings


@pytest.fixture
def outside_tests(monkeypatch):
    """Django's test environment looks torn down to the system checks (as in ``manage.py check``)."""
    from django.core import mail

    monkeypatch.delattr(mail, "outbox")


@pytest.fixture
def queued_commands(monkeypatch):
    """Commands sent with wait stage SENT: recorded, then run in-line instead of through Celery.

    An eager Celery call would leave a broker pool and a result backend cached
    on the app, pointing later tests that reconfigure Celery at the wrong Redis.
    """
    from wow_django.tasks import process_command

    queued: list[dict] = []

    def enqueue(message: dict):
        queued.append(message)
        return process_command.run(message)

    monkeypatch.setattr(process_command, "delay", enqueue)
    return queued


#: The sample's projection writes its read model with the ORM: only tests whose database is really
#: committed (transactional_db, live_server, TransactionTestCase) can see a follower thread do that, and
#: tests isolated by wow_django.testing, whose followers run in the test's own thread when it has a transaction.
ORM_PROJECTIONS = ("order-summaries",)


@pytest.fixture(autouse=True)
def _isolated_declarations(request):
    """Aggregates, events, projections and consumers a test declares vanish after it.

    The sample's ORM projection is left out of tests without a committed database (unless they use the
    isolation of wow_django.testing): its follower would fail there on "Database access not allowed"
    (pytest-django) and stop on a poison event.
    """
    with isolated_registry() as (registry, _consumers):
        if not _commits_to_database(request) and not _isolated_by_wow(request):
            for name in ORM_PROJECTIONS:
                registry.discard_handler(name)
        yield


def _isolated_by_wow(request) -> bool:
    cls = getattr(request.node, "cls", None)
    return "wow_isolation" in request.fixturenames or (cls is not None and issubclass(cls, IsolatedWowMixin))


def _commits_to_database(request) -> bool:
    if {"transactional_db", "live_server", "django_db_serialized_rollback"} & set(request.fixturenames):
        return True
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])):
        return True
    cls = getattr(request.node, "cls", None)
    from django.test import TestCase, TransactionTestCase

    return cls is not None and issubclass(cls, TransactionTestCase) and not issubclass(cls, TestCase)


@pytest.fixture
def bus_http_env(bus_store):
    """The bus over HTTP: consumers member-service and message-service on order.purchased, with callback tokens."""
    settings = fresh_wow("mongo", SERVICE_NAME="order-service", BUS_EXCHANGE=unique_exchange(),
                         BUS_CALLBACK_TOKENS=TOKENS, BUS_STORE=bus_store)
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        yield settings
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], CONSUMERS)
    disconnect(settings["MONGO_URI"])

"""Per-test isolation of every wow_django store, for a project's own tests.

::

    from django.test import TestCase
    from wow_django.testing import IsolatedWowMixin

    class CartTests(IsolatedWowMixin, TestCase):      # or TransactionTestCase; or WowTestCase
        def test_opening_a_cart(self):
            send(OpenCart(customer="c-1"), request_id="req-1")

    # pytest-django: in conftest.py
    pytest_plugins = ["wow_django.testing.pytest_plugin"]

    def test_opening_a_cart(wow_isolation):
        send(OpenCart(customer="c-1"), request_id="req-1")

**Why a test sees the previous test's events without it.** The stores do not
live in the test's database transaction, nor in anything Django resets:

* the process has one runtime (:func:`~wow_django.application.get_runtime`),
  built on first use and kept until ``WOW`` changes. The ``in_memory`` stores
  live in it, so the second test finds the first one's request id;
* the embedded engine (``mongomock://``) keeps its data in a client that lives
  as long as the process, and a MongoDB server keeps it until it is dropped;
* on the ``django`` backend the stores use the test's database, but part of
  the work runs in threads — the snapshot step after each command, the
  followers that run projections and event processors (``FOLLOWERS_RUN =
  "threads"``), the append batcher — and each thread has its own database
  connection. Inside a ``TestCase`` those writes are outside the test's
  transaction: on PostgreSQL they commit and outlive the rollback (a snapshot
  of an aggregate whose events were rolled back), on SQLite they fail with
  "database table is locked". The same goes for a projection's read-model rows
  on any backend.

**What the isolation does**, around each test (and, for the mixin, around the
class, so that ``setUpTestData`` is covered too):

* closes the runtime before and after the test (lanes, follower threads and
  batches finish first), so every test builds its own: the ``in_memory``
  stores start empty;
* MongoDB (``mongomock://`` or a server): empties every collection of the
  databases the ``WOW`` settings give the event streams (with the followers'
  checkpoints), snapshots, prepare keys and bus records, before and after the
  test. On a server those databases get Django's ``test_`` prefix
  (``mongodb://db/shop`` → ``test_shop``), so the tests never touch the
  project's own data;
* the ``django`` backend: the test's transaction (``TestCase``, pytest-django's
  ``db``) or Django's flush after it (``TransactionTestCase``,
  ``transactional_db``) resets the tables. Inside a transaction, the runtime is
  **inline** (:func:`~wow_django.application.runtime.inline_background`): the
  snapshot step runs before ``send`` returns, this process's followers run in
  the test's thread right after each command (so ``PROJECTED`` and read models
  are there when ``send`` returns), appends are not batched — everything goes
  through the test's connection and is rolled back with it. Outside a
  transaction the background work runs as in production and is finished
  before Django flushes;
* the bus on ``memory://``: drops the messages left in the queues of
  ``WOW['BUS_EXCHANGE']``.

Data a ``TestCase`` creates in ``setUpTestData`` stays visible to each test on
the ``django`` backend (the class's transaction holds it); on ``in_memory``
and MongoDB each test starts empty — create it in ``setUp`` there. The stores
isolated are those of the ``WOW`` settings in force when the test starts
(``@override_settings`` on the class or in the test settings, not inside the
test). Declarations a test makes are another matter: see
:func:`~wow_django.testing.isolated_registry`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.test import TestCase, TransactionTestCase, override_settings

from wow_django.application.runtime import close_runtime, inline_background
from wow_django.backends.mongo import configured_uri, connect, database_name, parse_uri
from wow_django.conf import wow_settings
from wow_django.testing._case import TestCaseMixin

#: The prefix a MongoDB server's databases get under isolation (Django's, for its test databases).
TEST_DATABASE_PREFIX = "test_"

# (database purpose, store setting): which Mongo database holds which store's data.
_MONGO_PURPOSES = (("EVENT_STREAM", "EVENT_STORE"), ("SNAPSHOT", "SNAPSHOT_STORE"), ("PREPARE", "PREPARE_STORE"),
                   ("BUS", "BUS_STORE"))


@dataclass(frozen=True)
class WowIsolation:
    """What :func:`isolated_wow` set up for a test."""

    #: The runtime does its background work in the test's thread (see the module docstring).
    inline: bool
    #: The MongoDB databases emptied before and after the test (none unless a store is on MongoDB).
    mongo_databases: tuple[str, ...] = ()


def in_test_transaction() -> bool:
    """Whether the calling thread's connection of some database is inside a transaction — as in a Django
    ``TestCase`` or a pytest-django test with ``db``."""
    return any(connection.in_atomic_block for connection in connections.all(initialized_only=True))


@contextlib.contextmanager
def isolated_wow(*, inline: bool | None = None) -> Iterator[WowIsolation]:
    """Inside the block wow_django's stores start empty and what it writes is gone afterwards.

    ``inline``: the runtime's background work runs in the calling thread (None: when the calling
    thread is inside a database transaction, :func:`in_test_transaction`). See the module docstring.
    """
    if inline is None:
        inline = in_test_transaction()
    wow, databases = _isolated_settings()
    with inline_background(inline), override_settings(WOW=wow):
        isolation = WowIsolation(inline=bool(inline), mongo_databases=tuple(name for _uri, name in databases))
        _clear(databases)
        try:
            yield isolation
        finally:
            try:
                close_runtime()  # what is still in flight (lanes, follower threads, batches) lands first
            finally:
                _clear(databases)


class IsolatedWowMixin(TestCaseMixin):
    """Isolation of every wow_django store for each test of a Django ``TestCase`` or ``TransactionTestCase``
    (put it before the test case class); the test's :class:`WowIsolation` is ``self.wow_isolation``.

    ``wow_inline`` forces the runtime's mode (None: inline for a ``TestCase``, whose tests run inside a
    transaction; as in production for a ``TransactionTestCase``). A ``setUp`` of your own must call
    ``super().setUp()`` first.
    """

    wow_inline: bool | None = None

    @classmethod
    def setUpClass(cls) -> None:
        inline = cls.wow_inline if cls.wow_inline is not None else issubclass(cls, TestCase)
        # Entered before Django's own class set-up, so what setUpTestData sends is isolated too.
        cls.enterClassContext(isolated_wow(inline=inline))
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        close_runtime()  # inside the class's transaction still (a TestCase rolls it back below)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.wow_isolation = self.enterContext(isolated_wow(inline=self.wow_inline))


class WowTestCase(IsolatedWowMixin, TestCase):
    """Django's ``TestCase`` with every wow_django store isolated per test (:class:`IsolatedWowMixin`)."""


class WowTransactionTestCase(IsolatedWowMixin, TransactionTestCase):
    """Django's ``TransactionTestCase`` with every wow_django store isolated per test (:class:`IsolatedWowMixin`)."""


def uses_django_storage() -> bool:
    """Whether some store of the current ``WOW`` settings is on the ``django`` backend."""
    try:
        return any(wow_settings.storage_for(store) == "django" for _purpose, store in _MONGO_PURPOSES)
    except ImproperlyConfigured:
        return False


# --- helpers ---------------------------------------------------------------------------------------------


def _isolated_settings() -> tuple[dict, list[tuple[str, str]]]:
    """The ``WOW`` settings of an isolated test, and the ``(uri, database)`` pairs on MongoDB to empty."""
    wow = dict(getattr(settings, "WOW", None) or {})
    databases: list[tuple[str, str]] = []
    for purpose, store in _MONGO_PURPOSES:
        try:
            if wow_settings.storage_for(store) != "mongo":
                continue
            uri = configured_uri()
            embedded, _default = parse_uri(uri)
            name = database_name(purpose)
        except ImproperlyConfigured:
            continue  # a malformed setting: the runtime names it when the store is built
        if not embedded and not name.startswith(TEST_DATABASE_PREFIX):
            name = TEST_DATABASE_PREFIX + name
            wow[f"{purpose}_DATABASE"] = name
        if (uri, name) not in databases:
            databases.append((uri, name))
    return wow, databases


def _clear(databases: list[tuple[str, str]]) -> None:
    for uri, name in databases:
        database = connect(uri).database(name)
        for collection in database.list_collection_names():
            if not collection.startswith("system."):
                database[collection].delete_many({})  # indexes (and AUTO_INIT_SCHEMA=False schemas) stay
    _purge_memory_transport()


def _purge_memory_transport() -> None:
    """Drop the messages left in kombu's ``memory://`` queues of the bus exchange (one process's broker)."""
    url = wow_settings.BUS_TRANSPORT_URL
    if not (isinstance(url, str) and url.startswith("memory://")):
        return
    from kombu.transport import memory

    prefix = f"{wow_settings.BUS_EXCHANGE}."
    for name, queue in list(getattr(memory.Channel, "queues", {}).items()):
        if isinstance(name, str) and name.startswith(prefix):
            with queue.mutex:
                queue.queue.clear()


__all__ = ["IsolatedWowMixin", "TEST_DATABASE_PREFIX", "WowIsolation", "WowTestCase", "WowTransactionTestCase",
           "in_test_transaction", "isolated_wow", "uses_django_storage"]

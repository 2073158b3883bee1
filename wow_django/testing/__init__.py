"""What a backend author and a project's tests need: conformance suites and test harness.

Conformance: mix a contract into ``unittest.TestCase`` and say how to build the backend::

    class TestMyEventStore(EventStoreContract, unittest.TestCase):
        def make_store(self):
            return MyEventStore(...)

pytest and ``manage.py test`` both run them. Harness:

* :class:`AggregateSpec` — given events, when a command, expect events or an
  error and the resulting state, through a real gateway on stores of its own;
* :class:`IsolatedWowMixin` (:class:`WowTestCase`, :class:`WowTransactionTestCase`),
  :func:`isolated_wow` and the pytest fixture ``wow_isolation``
  (:mod:`wow_django.testing.pytest_plugin`) — every store of the project's
  runtime empty at the start of each test and what it wrote gone after it, on
  every backend (:mod:`wow_django.testing.isolation` says why a test needs it);
* :func:`isolated_registry` — declarations made in a test vanish after it;
* :class:`FakeClock` — a clock the test moves, for stores that take a ``clock``;
* :mod:`wow_django.testing.followers` — the follower contracts (feed, store,
  runner) and :class:`HidingFeed`, which hides positions to play a late commit;
* :class:`EmbeddedMongoDatabase` / :class:`RealMongoDatabase` — a fresh Mongo
  database per test (``WOW_TEST_MONGO_URI`` for the real server);
* :mod:`wow_django.testing.bus` — RabbitMQ names and clean-up, a broker outage
  proxy (:func:`~wow_django.testing.bus.proxied_broker`), recording consumers
  (:class:`~wow_django.testing.bus.ConsumerRecorder`), consumer threads.
"""

from wow_django.testing.bus_store import BusStoreContract, make_event
from wow_django.testing.clock import FakeClock
from wow_django.testing.event_store import EventStoreContract, make_stream
from wow_django.testing.followers import FollowerRunnerContract, FollowerStoreContract, HidingFeed, StreamFeedContract
from wow_django.testing.isolation import (
    IsolatedWowMixin,
    WowIsolation,
    WowTestCase,
    WowTransactionTestCase,
    isolated_wow,
)
from wow_django.testing.mongo import (
    REAL_MONGO_REASON,
    EmbeddedMongoDatabase,
    RealMongoDatabase,
    real_mongo_uri,
    requires_real_mongo,
    temporary_database,
)
from wow_django.testing.prepare_key import PrepareKeyContract
from wow_django.testing.registry import isolated_registry
from wow_django.testing.snapshot_store import SnapshotStoreContract, make_snapshot
from wow_django.testing.spec import AggregateSpec

__all__ = [
    "AggregateSpec",
    "BusStoreContract",
    "EmbeddedMongoDatabase",
    "EventStoreContract",
    "FakeClock",
    "FollowerRunnerContract",
    "FollowerStoreContract",
    "HidingFeed",
    "IsolatedWowMixin",
    "PrepareKeyContract",
    "REAL_MONGO_REASON",
    "RealMongoDatabase",
    "SnapshotStoreContract",
    "StreamFeedContract",
    "WowIsolation",
    "WowTestCase",
    "WowTransactionTestCase",
    "isolated_registry",
    "isolated_wow",
    "make_event",
    "make_snapshot",
    "make_stream",
    "real_mongo_uri",
    "requires_real_mongo",
    "temporary_database",
]

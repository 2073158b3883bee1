"""The follower contracts and the runner on every backend: in-memory, MongoDB (the embedded engine, and a real
server when ``WOW_TEST_MONGO_URI`` is set), the django backend on SQLite and on PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
import unittest
import uuid
from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.test import TransactionTestCase, override_settings

from sample_project.orders.aggregates import OrderLine, PlaceOrder
from tests.mongo_replica import SimulatedReplicaSetDatabase
from wow_django.application import WaitStage
from wow_django.application.followers import Follower, FollowerRunner
from wow_django.application.runtime import get_runtime
from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed
from wow_django.backends.django.models import PrepareKeyRow
from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
from wow_django.backends.memory.stores import InMemoryEventStore
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.followers import MongoFollowerStore, MongoStreamFeed
from wow_django.exceptions import DuplicateAggregateId
from wow_django.persistence.records import AggregateId
from wow_django.testing import FakeClock, make_stream
from wow_django.testing.followers import FollowerRunnerContract, FollowerStoreContract, StreamFeedContract
from wow_django.testing.mongo import EmbeddedMongoDatabase, RealMongoDatabase, requires_real_mongo

from .support import fresh_wow, wait_for


class InMemory:
    def make_event_store(self):
        return InMemoryEventStore()

    def make_feed(self, store, context_name):
        return InMemoryStreamFeed(store, context_name)

    def make_follower_store(self):
        return InMemoryFollowerStore()


class TestInMemoryStreamFeed(InMemory, StreamFeedContract, unittest.TestCase):
    pass


class TestInMemoryFollowerStore(InMemory, FollowerStoreContract, unittest.TestCase):
    pass


class TestInMemoryFollowerRunner(InMemory, FollowerRunnerContract, unittest.TestCase):
    pass


class OnMongo:
    """The MongoDB backend: each test its own database (dropped afterwards)."""

    def make_event_store(self):
        connection, name, guard = self.mongo()
        return MongoEventStore(connection, name, schema=guard)

    def make_feed(self, store, context_name):
        return MongoStreamFeed(store, context_name)

    def make_follower_store(self):
        connection, name, guard = self.mongo()
        return MongoFollowerStore(connection, name, schema=guard)


class TestMongoStreamFeed(OnMongo, EmbeddedMongoDatabase, StreamFeedContract, unittest.TestCase):
    pass


class TestMongoFollowerStore(OnMongo, EmbeddedMongoDatabase, FollowerStoreContract, unittest.TestCase):
    pass


class TestMongoFollowerRunner(OnMongo, EmbeddedMongoDatabase, FollowerRunnerContract, unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoStreamFeed(OnMongo, RealMongoDatabase, StreamFeedContract, unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoFollowerStore(OnMongo, RealMongoDatabase, FollowerStoreContract, unittest.TestCase):
    pass


@requires_real_mongo
class TestRealMongoFollowerRunner(OnMongo, RealMongoDatabase, FollowerRunnerContract, unittest.TestCase):
    pass


class OnDjango:
    """The django backend; a ``TransactionTestCase``: the contracts' threads use their own connections."""

    available_apps = ["wow_django"]

    def make_event_store(self):
        return DjangoEventStore(using=self.alias, lock_timeout_s=2.0)

    def make_feed(self, store, context_name):
        return DjangoStreamFeed(store, context_name)

    def make_follower_store(self):
        return DjangoFollowerStore(using=self.alias)

    @contextlib.contextmanager
    def hung_writer(self, stream):
        """A writer thread appends ``stream`` in a transaction it keeps open (holding the context's lock)."""
        appended, release, errors = threading.Event(), threading.Event(), []

        def write():
            try:
                with transaction.atomic(using=self.alias):
                    self.events.append(stream)
                    appended.set()
                    release.wait(20)
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                appended.set()
                connections[self.alias].close()

        thread = threading.Thread(target=write)
        thread.start()
        appended.wait(20)
        try:
            yield
        finally:
            release.set()
            thread.join(20)
        self.assertEqual(errors, [])


class OnSQLite(OnDjango):
    databases = {"default", "wow_sqlite"}
    alias = "wow_sqlite"


class OnPostgreSQL(OnDjango):
    databases = {"default", "wow_pg"}
    alias = "wow_pg"


class TestSQLiteStreamFeed(OnSQLite, StreamFeedContract, TransactionTestCase):
    pass


class TestSQLiteFollowerStore(OnSQLite, FollowerStoreContract, TransactionTestCase):
    pass


class TestSQLiteFollowerRunner(OnSQLite, FollowerRunnerContract, TransactionTestCase):
    pass


class TestPostgreSQLStreamFeed(OnPostgreSQL, StreamFeedContract, TransactionTestCase):
    pass


class TestPostgreSQLFollowerStore(OnPostgreSQL, FollowerStoreContract, TransactionTestCase):
    pass


class TestPostgreSQLFollowerRunner(OnPostgreSQL, FollowerRunnerContract, TransactionTestCase):
    pass


# --- transactional followers on the django backend: the handler's writes and the checkpoint commit together ---


class TransactionalFollower:
    """A handler that writes a row per stream into the follower store's database (a reserved key)."""

    def setUp(self):
        super().setUp()
        self.clock = FakeClock()
        self.context = f"ctx-{uuid.uuid4().hex[:8]}"
        self.events = DjangoEventStore(using=self.alias)
        self.feed = DjangoStreamFeed(self.events, self.context)
        self.followers = DjangoFollowerStore(using=self.alias)
        self.fail_at: set[int] = set()

    def handle(self, item):
        PrepareKeyRow.objects.using(self.alias).create(name="follower-test", key=str(item.position), value=1,
                                                       ttl_at=0)
        if item.position in self.fail_at:
            raise ValueError(f"cannot handle {item.position}")

    def written(self) -> list[int]:
        keys = PrepareKeyRow.objects.using(self.alias).filter(name="follower-test").values_list("key", flat=True)
        return sorted(int(key) for key in keys)

    def runner(self, cls=FollowerRunner, owner="one"):
        declared = Follower("tx", self.handle, transactional=True)
        return cls(declared, self.feed, self.followers, owner=owner, clock=self.clock, lease_s=30, min_batch=8,
                   max_batch=8)

    def append(self, count):
        for _ in range(count):
            self.events.append(make_stream(AggregateId("order", uuid.uuid4().hex, self.context, "t"), 1))
        return [item.position for item in self.feed.read(0, 1000)]

    def test_a_crash_before_the_checkpoint_rolls_the_handler_writes_back(self):
        positions = self.append(3)

        class Crashing(FollowerRunner):
            def checkpoint(self, position, gaps):
                super().checkpoint(position, gaps)
                raise RuntimeError("the process died before the commit")

        with self.assertRaisesRegex(RuntimeError, "died"):
            self.runner(cls=Crashing).run_once()
        self.assertEqual(self.written(), [])
        self.assertEqual(self.followers.get("tx").position, 0)
        self.runner().run_once()
        self.assertEqual(self.written(), positions)  # exactly once
        self.assertEqual(self.followers.get("tx").position, positions[-1])

    def test_a_lost_lease_rolls_the_handler_writes_back(self):
        positions = self.append(2)
        stale = self.runner(owner="stale")
        stale.run_once()
        self.append(2)
        self.clock.advance(31)
        self.followers.acquire("tx", "fresh", 30, now=self.clock())
        stale._lease_until = self.clock() + timedelta(seconds=30)
        self.assertFalse(stale.run_once().leader)
        self.assertEqual(self.written(), positions)

    def test_a_poison_event_keeps_the_streams_before_it_and_none_of_its_writes(self):
        p1, p2, p3 = self.append(3)
        self.fail_at = {p2}
        self.assertTrue(self.runner().run_once().failed)
        self.assertEqual(self.written(), [p1])
        state = self.followers.get("tx")
        self.assertEqual((state.position, state.poison.position), (p1, p2))

    def test_a_transactional_follower_needs_a_database_follower_store(self):
        with self.assertRaisesRegex(ImproperlyConfigured, "transactional"):
            FollowerRunner(Follower("tx", self.handle, transactional=True), self.feed, InMemoryFollowerStore())


class TestSQLiteTransactionalFollower(OnSQLite, TransactionalFollower, TransactionTestCase):
    pass


class TestPostgreSQLTransactionalFollower(OnPostgreSQL, TransactionalFollower, TransactionTestCase):
    pass


# --- the runtime's parts ------------------------------------------------------------------------------------


def _place(runtime, customer="c-1"):
    return runtime.gateway.send(PlaceOrder(customer_id=customer, items=[
        OrderLine(sku="A", quantity=1, unit_price=Decimal("2.50"))]), wait=WaitStage.SNAPSHOT)


def test_the_runtime_serves_followers_on_the_in_memory_backend():
    with override_settings(WOW=fresh_wow("in_memory", EVENT_STORE_BATCH={"ENABLED": True})):
        runtime = get_runtime()
        assert isinstance(runtime.stream_feed, InMemoryStreamFeed)
        assert runtime.stream_feed.context_name == "order-service"
        assert isinstance(runtime.follower_store, InMemoryFollowerStore)
        seen: list[str] = []
        declared = Follower("orders", lambda item: seen.append(item.stream.aggregate_id.id))
        runner = FollowerRunner(declared, runtime.stream_feed, runtime.follower_store, max_wait_s=0.05)
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,))
        thread.start()
        try:
            placed = _place(runtime)
            wait_for(lambda: seen, what="the follower handled the new order")
        finally:
            stop.set()
            runner.wake()
            thread.join()
        assert seen == [placed.aggregate_id]
        assert runtime.follower_store.get("orders").position == 1


class TestRuntimeFollowersOnSQLite(OnSQLite, TransactionTestCase):
    def test_the_runtime_serves_followers_on_the_django_backend(self):
        with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django",
                                    "DATABASE_ALIAS": "wow_sqlite"}):
            runtime = get_runtime()
            self.assertIsInstance(runtime.stream_feed, DjangoStreamFeed)
            self.assertIsInstance(runtime.follower_store, DjangoFollowerStore)
            self.assertEqual(runtime.follower_store.database_alias, "wow_sqlite")
            placed = _place(runtime)
            [item] = runtime.stream_feed.read(0, 10)
            self.assertEqual(item.stream.aggregate_id.id, placed.aggregate_id)
            self.assertEqual(runtime.stream_feed.head(), item.position)


class TestMongoPositionCost(EmbeddedMongoDatabase, unittest.TestCase):
    """A position costs one extra round trip per append, and one per context for a batched append."""

    def test_round_trips_for_positions(self):
        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard)
        calls: list[tuple] = []
        allocate = store.allocate_positions

        def counting(context_name, count):
            calls.append((context_name, count))
            return allocate(context_name, count)

        store.allocate_positions = counting
        for _ in range(3):
            store.append(make_stream(AggregateId("order", uuid.uuid4().hex, "ctx-a", "t"), 1))
        assert calls == [("ctx-a", 1)] * 3
        calls.clear()
        batch = [make_stream(AggregateId("order", uuid.uuid4().hex, ctx, "t"), 1)
                 for ctx in ("ctx-a", "ctx-b", "ctx-a", "ctx-a", "ctx-b")]
        assert store.append_many(batch) == [None] * 5
        assert sorted(calls) == [("ctx-a", 3), ("ctx-b", 2)]
        feed = MongoStreamFeed(store, "ctx-a")
        assert [item.position for item in feed.read(0, 10)] == [1, 2, 3, 4, 5, 6]

    def test_a_refused_append_leaves_a_void_position_not_a_gap(self):
        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard)
        first = make_stream(AggregateId("order", uuid.uuid4().hex, "ctx-a", "t"), 1)
        store.append(first)
        with self.assertRaises(DuplicateAggregateId):
            store.append(make_stream(first.aggregate_id, 1))
        results = store.append_many([make_stream(first.aggregate_id, 1),
                                     make_stream(AggregateId("order", uuid.uuid4().hex, "ctx-a", "t"), 1)])
        assert results[0] is not None and results[1] is None
        feed = MongoStreamFeed(store, "ctx-a")
        assert [item.position for item in feed.read(0, 10)] == [1, 4]
        assert list(feed.void_positions(0, 4)) == [2, 3]
        assert feed.head() == 4


def test_a_closing_process_hands_over_its_followers_caught_up():
    """``FollowerThreads.close`` (process exit, a recycled worker) lets each leader catch up first, then
    releases the leases: a script that sends a command and exits still has it projected."""
    from wow_django.application.followers import FollowerThreads, follower
    from wow_django.domain import registry
    from wow_django.persistence.followers import AppendNotifier
    from wow_django.testing import isolated_registry

    class OnlyNotified(AppendNotifier):
        def wait(self, seen, timeout):  # no timed polling: only a notification ends a wait
            return super().wait(seen, 3600)

    store = InMemoryEventStore()
    feed = InMemoryStreamFeed(store, "ctx")
    feed.notifier = OnlyNotified()  # the store's appends do not reach it: the runner sleeps through them
    followers = InMemoryFollowerStore()
    handled: list[int] = []
    with isolated_registry():
        domain = registry.current()
        for handler in domain.handlers():
            domain.discard_handler(handler.name)

        @follower("closing-ledger")
        def ledger(item):
            handled.append(item.position)

        threads = FollowerThreads(lambda: feed, lambda: followers)
        threads.ensure()
        wait_for(lambda: followers.get("closing-ledger") is not None, timeout=5, what="the first cycle")
        for _ in range(3):
            store.append(make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1))
        threads.close(timeout=10)
    assert handled == [1, 2, 3]
    state = followers.get("closing-ledger")
    assert state.position == 3 and state.lease_owner is None


class MongoLateInsert:
    """A late insert is never skipped (issue 22, item 6). An append stalls between taking its position and
    inserting (a slow primary, a paused process) while another append of the context goes on, and a follower
    with no gap timeout at all reads meanwhile: the stalled stream must still be handed.

    The embedded engine (one process, no transactions) orders its inserts by position under a per-context
    lock that reads take too. A replica set takes the position and inserts in one transaction (the other
    append meets a write conflict until it commits) and the feed reads only up to the committed counter.
    A standalone server gives no such guarantee (documented: gaps are held for ``FOLLOWER_GAP_TIMEOUT_S``),
    so the real-server run needs a replica set.
    """

    def test_a_stalled_insert_is_handed_not_passed_as_a_gap(self):
        connection, name, guard = self.mongo()
        if not (connection.embedded or connection.transactional):
            self.skipTest("a standalone server has no transactions: its gaps are held for FOLLOWER_GAP_TIMEOUT_S "
                          "only (documented); point WOW_TEST_MONGO_URI at a replica set")
        store = MongoEventStore(connection, name, schema=guard)
        feed = MongoStreamFeed(store, "ctx")
        followers = MongoFollowerStore(connection, name, schema=guard)
        handled: list[int] = []
        clock = FakeClock()
        runner = FollowerRunner(Follower("late", lambda item: handled.append(item.position)), feed, followers,
                                owner="o", clock=clock, gap_timeout_s=0.0, min_batch=4, max_batch=16,
                                max_wait_s=0.05)
        allocate = store.allocate_positions
        taken, release = threading.Event(), threading.Event()

        def stalling(context_name, count, **session):
            first = allocate(context_name, count, **session)
            if not taken.is_set():
                taken.set()
                release.wait(10)  # the first append stalls after taking its position
            return first

        store.allocate_positions = stalling
        late = make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1)
        other = make_stream(AggregateId("customer", uuid.uuid4().hex, "ctx", "t"), 1)
        threads = [threading.Thread(target=store.append, args=(late,))]
        threads[0].start()
        assert taken.wait(5)
        threads.append(threading.Thread(target=store.append, args=(other,)))
        threads[1].start()
        threads[1].join(0.3)  # the other append goes as far as it can
        reading = threading.Thread(target=lambda: [runner.run_once(), clock.advance(60), runner.run_once()])
        reading.start()
        reading.join(0.3)  # the follower reads while the first insert has not landed
        release.set()
        for thread in (*threads, reading):
            thread.join(10)
        for _ in range(5):
            clock.advance(1)
            runner.run_once()
        positions = [item.position for item in feed.read(0, 10)]
        assert len(positions) == 2
        assert handled == positions  # the stalled stream too, in position order
        assert followers.get("late").gaps_skipped == 0

    def test_a_read_across_collections_never_passes_a_position_committed_meanwhile(self):
        """The feed reads the collections one after another. Streams committed between two of those reads,
        a lower position in a collection already read and a higher one in a collection not yet read, must not
        make the lower one look missing below a visible one (where gaps are final it would be passed for
        good): the feed reads only up to the counter it read first."""
        connection, name, guard = self.mongo()
        if not (connection.embedded or connection.transactional):
            self.skipTest("a standalone server has no transactions (see the class docstring)")
        store = MongoEventStore(connection, name, schema=guard)
        store.collection("customer")  # listed by the feed, and read before the order streams
        store.append(make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1))
        feed = MongoStreamFeed(store, "ctx")
        listed = feed._collections
        meanwhile = [make_stream(AggregateId("customer", uuid.uuid4().hex, "ctx", "t"), 1),
                     make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1)]

        writers: list[threading.Thread] = []

        def collections(session=None):
            found = listed(session)
            assert [c.name for c in found][:1] == ["customer_event_stream"]
            yield found[0]
            if meanwhile and not writers:
                # Both commit after the customer streams were read and before the order streams are, where they
                # can: the embedded engine's writers wait for the reader's position lock.
                writers.append(threading.Thread(target=lambda: [store.append(s) for s in meanwhile]))
                writers[0].start()
                writers[0].join(1)
            yield from found[1:]

        feed._collections = collections
        followers = MongoFollowerStore(connection, name, schema=guard)
        handled: list[int] = []
        runner = FollowerRunner(Follower("across", lambda item: handled.append(item.position)), feed, followers,
                                owner="o", clock=FakeClock(), gap_timeout_s=0.0, min_batch=4, max_batch=16,
                                max_wait_s=0.05)
        for _ in range(2):
            runner.run_once()
        writers[0].join(10)
        for _ in range(2):
            runner.run_once()
        assert handled == [1, 2, 3]
        assert followers.get("across").gaps_skipped == 0


class TestMongoLateInsert(MongoLateInsert, EmbeddedMongoDatabase, unittest.TestCase):
    """On the embedded engine (its position lock)."""

    def test_an_insert_that_failed_voids_its_position_at_once(self):
        """Any failed insert on the embedded engine (in this process: nothing can land later) voids its position,
        so followers do not wait for it; on a server only an outcome that surely wrote nothing does (a write
        error, no server selected), never a network error after sending."""
        from pymongo import errors as pymongo_errors

        from wow_django.exceptions import RecoverableStoreError, StoreUnreachable

        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard)
        real = store.collection("order")

        class Failing:
            def __getattr__(self, attribute):
                return getattr(real, attribute)

            def insert_one(self, document, *args, **kwargs):
                raise pymongo_errors.AutoReconnect("connection reset")

        store._collections["order"] = Failing()
        with self.assertRaises(RecoverableStoreError):
            store.append(make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1))
        store._collections["order"] = real
        store.append(make_stream(AggregateId("order", uuid.uuid4().hex, "ctx", "t"), 1))
        feed = MongoStreamFeed(store, "ctx")
        assert list(feed.void_positions(0, 2)) == [1]
        assert [item.position for item in feed.read(0, 10)] == [2]
        store.connection = type("Server", (), {"embedded": False})()
        assert store._not_written(StoreUnreachable("no server"))
        assert store._not_written(pymongo_errors.WriteError("validation", code=121))
        assert not store._not_written(pymongo_errors.AutoReconnect("reset after sending"))


def test_a_gap_says_when_its_first_position_was_first_seen_missing():
    """A gap of positions first seen missing at different times records the earliest (issue 27: a mutation of
    min to max in the gap's seen_at lived)."""
    from datetime import UTC, datetime, timedelta

    from wow_django.application.followers import _ranges

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    now = t0 + timedelta(seconds=30)
    seen = {2: t0 + timedelta(seconds=5), 3: t0, 4: t0 + timedelta(seconds=9), 7: t0 + timedelta(seconds=1)}
    gaps = _ranges([2, 3, 4, 7], seen, now)
    assert [(g.first, g.last, g.seen_at, g.skipped_at) for g in gaps] == [(2, 4, t0, now),
                                                                          (7, 7, t0 + timedelta(seconds=1), now)]


class TestSimulatedReplicaSetLateInsert(MongoLateInsert, SimulatedReplicaSetDatabase, unittest.TestCase):
    """On the transactional path (``tests.mongo_replica``: MongoDB's write conflicts, played)."""


@requires_real_mongo
class TestRealMongoLateInsert(MongoLateInsert, RealMongoDatabase, unittest.TestCase):
    """On the server of ``WOW_TEST_MONGO_URI`` (skipped on a standalone server, see the base class)."""


class TestSimulatedReplicaSetStreamFeed(OnMongo, SimulatedReplicaSetDatabase, StreamFeedContract, unittest.TestCase):
    """The feed over the transactional path: every contract case, with gaps final."""


class TestSimulatedReplicaSetFollowerRunner(OnMongo, SimulatedReplicaSetDatabase, FollowerRunnerContract,
                                            unittest.TestCase):
    pass

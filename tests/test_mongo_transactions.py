"""The MongoDB event store's transactional append path (issue 22, item 6): what decides it, how it retries a
write conflict, how long it waits, and that a refused stream gives its position back.

The deployment-dependent parts run on ``tests.mongo_replica`` (the embedded engine playing a replica set's
transactions) here, and on MongoDB itself in the conformance suites whenever ``WOW_TEST_MONGO_URI`` names a
replica set.
"""

from __future__ import annotations

import threading
import time
import unittest
import uuid

from pymongo import errors as pymongo_errors

from tests.mongo_replica import SimulatedReplicaSetDatabase
from wow_django.backends.mongo.client import is_transactional
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.followers import MongoStreamFeed
from wow_django.exceptions import ContextLockTimeout, DuplicateAggregateId
from wow_django.persistence.records import AggregateId
from wow_django.testing import EmbeddedMongoDatabase, make_stream


def _agg(name: str = "order", context: str = "ctx") -> AggregateId:
    return AggregateId(name, uuid.uuid4().hex, context, "t")


class TestWhatIsTransactional(unittest.TestCase):
    def test_the_hello_answer_decides(self):
        base = {"logicalSessionTimeoutMinutes": 30, "maxWireVersion": 21}
        self.assertTrue(is_transactional({**base, "setName": "rs0"}))  # a replica set member
        self.assertTrue(is_transactional({**base, "msg": "isdbgrid"}))  # mongos
        self.assertFalse(is_transactional(base))  # a standalone server
        self.assertFalse(is_transactional({"maxWireVersion": 21, "setName": "rs0"}))  # no sessions
        self.assertFalse(is_transactional({**base, "maxWireVersion": 7, "setName": "rs0"}))  # MongoDB 4.0
        self.assertTrue(is_transactional({**base, "maxWireVersion": 8, "setName": "rs0"}))  # 4.2

    def test_the_embedded_engine_is_not(self):
        from wow_django.testing.mongo import embedded_connection

        connection = embedded_connection()
        self.addCleanup(connection.close)
        self.assertFalse(connection.transactional)


class _Session:
    """A session whose transactions fail as told (at commit); what committed is recorded."""

    def __init__(self, failures: list[BaseException | None], commit_failures: list[BaseException] | None = None):
        self.failures = failures
        self.commit_failures = list(commit_failures or ())
        self.committed = 0
        self.attempts = 0
        self.commits = 0
        self.in_transaction = False

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def start_transaction(self):
        self.attempts += 1
        self.in_transaction = True

    def abort_transaction(self):
        self.in_transaction = False

    def commit_transaction(self):
        self.commits += 1
        if self.commit_failures:
            raise self.commit_failures.pop(0)
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            self.in_transaction = False
            raise failure
        self.in_transaction = False
        self.committed += 1


def _conflict() -> pymongo_errors.OperationFailure:
    return pymongo_errors.OperationFailure("WriteConflict", 112, {
        "code": 112, "codeName": "WriteConflict", "errorLabels": ["TransientTransactionError"]})


class TestTheRetryLoop(EmbeddedMongoDatabase, unittest.TestCase):
    def store(self, session: _Session, lock_timeout_s: float | None = 5.0) -> MongoEventStore:
        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard, lock_timeout_s=lock_timeout_s)
        store.connection = type("Server", (), {"client": type("Client", (), {
            "start_session": staticmethod(lambda **_: session)})()})()
        return store

    def test_a_write_conflict_runs_the_transaction_again_until_it_commits(self):
        session = _Session([_conflict(), _conflict(), None])
        runs: list[object] = []
        self.store(session)._transaction(runs.append)
        self.assertEqual((len(runs), session.committed), (3, 1))

    def test_conflicts_past_the_lock_timeout_end_in_context_lock_timeout(self):
        session = _Session([_conflict()] * 1000)
        started = time.monotonic()
        with self.assertRaises(ContextLockTimeout) as caught:
            self.store(session, lock_timeout_s=0.2)._transaction(lambda _session: None)
        self.assertLess(time.monotonic() - started, 2)
        self.assertEqual(session.committed, 0)
        self.assertIsInstance(caught.exception.__cause__, pymongo_errors.OperationFailure)
        self.assertGreater(session.attempts, 3)  # retried with short pauses, not once

    def test_a_commit_whose_outcome_is_unknown_is_committed_again(self):
        unknown = pymongo_errors.AutoReconnect("reply lost")
        unknown._add_error_label("UnknownTransactionCommitResult")
        session = _Session([], commit_failures=[unknown, unknown])
        runs: list[object] = []
        self.store(session)._transaction(runs.append)
        self.assertEqual((len(runs), session.commits, session.committed), (1, 3, 1))  # run once, committed again

    def test_an_error_in_the_work_aborts_and_is_not_retried(self):
        session = _Session([])

        def failing(_session):
            raise ValueError("bad document")

        with self.assertRaises(ValueError):
            self.store(session)._transaction(failing)
        self.assertEqual((session.attempts, session.committed, session.in_transaction), (1, 0, False))

    def test_any_other_error_is_not_retried(self):
        session = _Session([pymongo_errors.OperationFailure("bad value", 2, {"code": 2})])
        with self.assertRaises(pymongo_errors.OperationFailure):
            self.store(session)._transaction(lambda _session: None)
        self.assertEqual((session.attempts, session.committed), (1, 0))


class TestOnAReplicaSet(SimulatedReplicaSetDatabase, unittest.TestCase):
    """The store and the feed on the transactional path."""

    def setUp(self):
        connection, name, guard = self.mongo()
        self.store = MongoEventStore(connection, name, schema=guard, lock_timeout_s=0.3)
        self.feed = MongoStreamFeed(self.store, "ctx")

    def positions(self) -> list[int]:
        return [item.position for item in self.feed.read(0, 100)]

    def test_gaps_are_final(self):
        self.assertTrue(self.feed.gaps_are_final)

    def test_a_refused_append_gives_its_position_back(self):
        first = make_stream(_agg(), 1)
        self.store.append(first)
        with self.assertRaises(DuplicateAggregateId):
            self.store.append(make_stream(first.aggregate_id, 1))
        self.store.append(make_stream(_agg(), 1))
        self.assertEqual(self.positions(), [1, 2])  # no void position to record, none to wait for
        self.assertEqual(list(self.feed.void_positions(0, 10)), [])

    def test_a_batch_with_a_refused_stream_stores_the_others_with_dense_positions(self):
        first = make_stream(_agg(), 1)
        self.store.append(first)
        twin = _agg()
        batch = [make_stream(_agg(), 1), make_stream(first.aggregate_id, 1), make_stream(twin, 1),
                 make_stream(twin, 1), make_stream(_agg("customer"), 1)]
        results = self.store.append_many(batch)
        self.assertIsNone(results[0])
        self.assertIsInstance(results[1], DuplicateAggregateId)
        self.assertIsNone(results[2])
        self.assertIsInstance(results[3], DuplicateAggregateId)  # refused for its twin in the same batch
        self.assertIsNone(results[4])
        self.assertEqual(self.positions(), [1, 2, 3, 4])
        stored = {item.stream.id for item in self.feed.read(0, 100)}
        self.assertEqual(stored, {first.id, batch[0].id, batch[2].id, batch[4].id})

    def test_an_append_held_up_past_the_lock_timeout_stores_nothing(self):
        allocate = self.store.allocate_positions
        taken, release = threading.Event(), threading.Event()

        def holding(context_name, count, **session):
            first = allocate(context_name, count, **session)
            if threading.current_thread().name == "holder":
                taken.set()
                release.wait(10)
            return first

        self.store.allocate_positions = holding
        held = make_stream(_agg(), 1)
        holder = threading.Thread(target=self.store.append, args=(held,), name="holder")
        holder.start()
        self.assertTrue(taken.wait(5))
        try:
            blocked = make_stream(_agg("customer"), 1)
            with self.assertRaises(ContextLockTimeout):
                self.store.append(blocked)
            self.assertEqual(self.store.load(blocked.aggregate_id), [])
            results = self.store.append_many([make_stream(_agg(), 1)])
            self.assertIsInstance(results[0], ContextLockTimeout)
        finally:
            release.set()
            holder.join(10)
        self.assertEqual([item.stream.id for item in self.feed.read(0, 10)], [held.id])
        self.assertEqual(self.positions(), [1])

    def test_an_error_inside_the_transaction_stores_nothing_and_takes_no_position(self):
        real = self.store.collection("order")

        class Refusing:
            def __getattr__(self, attribute):
                return getattr(real, attribute)

            def insert_many(self, *args, **kwargs):
                raise pymongo_errors.OperationFailure("not allowed", 2, {"code": 2})

        self.store._collections["order"] = Refusing()
        with self.assertRaises(pymongo_errors.OperationFailure):
            self.store.append(make_stream(_agg(), 1))
        self.store._collections["order"] = real
        self.store.append(make_stream(_agg(), 1))
        self.assertEqual(self.positions(), [1])


class TestTheEmbeddedPositionLockIsBounded(EmbeddedMongoDatabase, unittest.TestCase):
    def test_a_writer_holding_it_past_the_timeout_ends_in_context_lock_timeout(self):
        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard, lock_timeout_s=0.2)
        feed = MongoStreamFeed(store, "ctx")
        acquired, release = threading.Event(), threading.Event()

        def hold():
            with connection.positions_lock(name, ["ctx"]):
                acquired.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        self.assertTrue(acquired.wait(5))
        try:
            with self.assertRaises(ContextLockTimeout):
                store.append(make_stream(_agg(), 1))
            self.assertIsInstance(store.append_many([make_stream(_agg(), 1)])[0], ContextLockTimeout)
            from wow_django.exceptions import RecoverableStoreError

            with self.assertRaises(RecoverableStoreError):
                feed.read(0, 10)
        finally:
            release.set()
            holder.join(10)
        store.append(make_stream(_agg(), 1))
        self.assertEqual([item.position for item in feed.read(0, 10)], [1])


class TestTheTransactionRunsWithinTheWriteLimit(SimulatedReplicaSetDatabase, unittest.TestCase):
    def test_appends_and_batches(self):
        """The whole transaction, its retries included, runs within ``write_limit`` (pymongo's operation
        timeout of ``COMMAND_STORAGE_TIMEOUT_S`` on a server), as every other write does."""
        import contextlib

        connection, name, guard = self.mongo()
        store = MongoEventStore(connection, name, schema=guard)
        inside: list[bool] = []
        limited = [False]

        @contextlib.contextmanager
        def write_limit():
            limited[0] = True
            try:
                yield
            finally:
                limited[0] = False

        allocate = store.allocate_positions

        def recording(context_name, count, **session):
            inside.append(limited[0])
            return allocate(context_name, count, **session)

        connection.write_limit = write_limit
        store.allocate_positions = recording
        store.append(make_stream(_agg(), 1))
        self.assertEqual(store.append_many([make_stream(_agg(), 1), make_stream(_agg("customer"), 1)]), [None, None])
        self.assertEqual(inside, [True, True, True])

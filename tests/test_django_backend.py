"""The django storage backend beyond the conformance suites, on the file SQLite and on PostgreSQL.

Error mapping by constraint name, recoverable errors on a killed connection
or a locked database, SQLite's WAL and busy timeout (also across processes),
the one-statement snapshot guard, per-thread connections, the batch path
without RETURNING, the runtime on ``STORAGE = "django"``.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from unittest import mock

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import (
    DatabaseError,
    IntegrityError,
    InternalError,
    OperationalError,
    ProgrammingError,
    connections,
    transaction,
)
from django.db.transaction import TransactionManagementError
from django.test import TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext

from sample_project.orders.aggregates import OrderLine, PlaceOrder, RegisterCustomer, username_key
from wow_django.application import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.backends.django import DjangoBackend
from wow_django.backends.django.connection import SQLITE_BUSY_TIMEOUT_MS, database, fetch, validate_database
from wow_django.backends.django.errors import is_recoverable, violated_constraint
from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.models import (
    CodePointTextField,
    EventStreamRow,
    EventStreamWriteRefused,
    PrepareKeyRow,
    SnapshotRow,
    store_writes,
)
from wow_django.backends.django.prepare_key import DjangoPrepareKey
from wow_django.backends.django.snapshot_store import DjangoSnapshotStore
from wow_django.checks import check_settings
from wow_django.exceptions import (
    ContextLockTimeout,
    DuplicateAggregateId,
    DuplicateEventStreamId,
    DuplicateRequestId,
    EventStoreError,
    EventVersionConflict,
    RecoverableStoreError,
    SchemaConflictError,
)
from wow_django.persistence.batching import BatchingEventStore
from wow_django.persistence.records import DEFAULT_TENANT_ID, AggregateId
from wow_django.testing import EventStoreContract, FakeClock, make_snapshot, make_stream

from .support import in_forked_child


class OnSQLite:
    databases = {"default", "wow_sqlite"}  # Django sets a non-default test database up after "default"
    available_apps = ["wow_django"]
    alias = "wow_sqlite"


class OnPostgreSQL:
    databases = {"default", "wow_pg"}
    available_apps = ["wow_django"]
    alias = "wow_pg"


def agg(id: str | None = None, name: str = "order") -> AggregateId:
    return AggregateId(name, id or uuid.uuid4().hex, "test-context", "tenant-a")


def stream_row(stream, *, request_scope: str | None = None) -> EventStreamRow:
    """A row written past the store (to provoke one constraint at a time)."""
    a = stream.aggregate_id
    return EventStreamRow(
        stream_id=stream.id, context_name=a.context_name, aggregate_name=a.aggregate_name, aggregate_id=a.id,
        tenant_id=a.tenant_id, request_id=stream.request_id,
        request_scope=a.id if request_scope is None else request_scope, command_id=stream.command_id,
        version=stream.version, header={}, body=[], size=1, create_time=stream.create_time,
    )


# --- on both engines ------------------------------------------------------------------------------


class DjangoBackendBehaviour:
    """Tests that run on the engine of ``alias``."""

    alias = ""

    def store(self, **kwargs) -> DjangoEventStore:
        return DjangoEventStore(using=self.alias, **kwargs)

    # --- the snapshot and its tail in one statement ------------------------------------------------

    def test_the_snapshot_and_the_streams_after_it_are_read_together(self):
        events, snapshots = self.store(), DjangoSnapshotStore(using=self.alias)
        without, behind, current = agg(), agg(), agg()
        for key in (without, behind, current):
            for version in range(1, 5):
                events.append(make_stream(key, version))
        snapshots.save(make_snapshot(behind, 2))
        snapshots.save(make_snapshot(current, 4))
        for key in (without, behind, current):
            snapshot = snapshots.load(key)
            expected = (snapshot, events.load(key, snapshot.version + 1 if snapshot else 1))
            self.assertEqual(snapshots.load_with_tail(key, events), expected)
        self.assertEqual([s.version for s in snapshots.load_with_tail(behind, events)[1]], [3, 4])
        self.assertEqual(snapshots.load_with_tail(current, events)[1], [])
        # Another tenant's aggregate: nothing at all; an aggregate with no events and no snapshot: nothing.
        intruder = AggregateId(behind.aggregate_name, behind.id, behind.context_name, "tenant-b")
        self.assertEqual(snapshots.load_with_tail(intruder, events), (None, []))
        self.assertEqual(snapshots.load_with_tail(agg(), events), (None, []))
        # An event store of another database (or kind) is read separately.
        self.assertIsNone(snapshots.load_with_tail(behind, DjangoEventStore(using="default")))
        self.assertIsNone(snapshots.load_with_tail(behind, object()))

    # --- error mapping ---------------------------------------------------------------------------

    def hung_writer_process(self, context: str) -> subprocess.Popen:
        """Another OS process that takes ``context``'s append lock in a transaction and stops itself (SIGSTOP)
        without committing: a writer paused in a debugger, a stuck ``ATOMIC_REQUESTS`` request."""
        settings = connections[self.alias].settings_dict
        if connections[self.alias].vendor == "postgresql":
            code = textwrap.dedent(f"""
                import os, signal, psycopg
                conn = psycopg.connect(host={settings['HOST']!r}, port={int(settings['PORT'])}, user={settings['USER']!r},
                                       password={settings['PASSWORD']!r}, dbname={settings['NAME']!r})
                conn.execute("INSERT INTO wow_stream_context (context_name, appends) VALUES (%s, 1) "
                             "ON CONFLICT (context_name) DO UPDATE SET appends = wow_stream_context.appends + 1",
                             [{context!r}])
                print("locked", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            """)
        else:
            code = textwrap.dedent(f"""
                import os, signal, sqlite3
                conn = sqlite3.connect({settings['NAME']!r}, isolation_level=None)
                conn.execute("BEGIN IMMEDIATE")
                print("locked", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            """)
        writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (writer.kill(), writer.wait(10)))
        self.assertEqual(writer.stdout.readline().strip(), "locked")
        return writer

    def test_a_hung_writer_process_makes_appends_of_its_context_fail_retryable_within_the_bound(self):
        store = self.store(lock_timeout_s=0.5)
        stream = make_stream(agg(), 1)
        writer = self.hung_writer_process(stream.aggregate_id.context_name)
        result: list = []

        def append():  # a thread: before the bound existed, this waited for ever
            try:
                store.append(stream)
                result.append(None)
            except Exception as exc:
                result.append(exc)
            finally:
                connections[self.alias].close()

        thread = threading.Thread(target=append, daemon=True)
        thread.start()
        thread.join(20)
        self.assertFalse(thread.is_alive(), "the append still waits for the hung writer's lock")
        self.assertIsInstance(result[0], ContextLockTimeout)
        self.assertIsInstance(result[0], RecoverableStoreError)  # the gateway retries it; HTTP 503 StoreUnavailable
        self.assertIn("APPEND_LOCK_TIMEOUT_S", str(result[0]))
        self.assertIsInstance(result[0].__cause__, OperationalError)  # what the database said
        writer.kill()  # its transaction ends with the process: the context is free again
        writer.wait(10)
        store.append(stream)
        self.assertEqual(store.load(stream.aggregate_id, 1, 1)[0].id, stream.id)

    # --- concurrent appends written together ------------------------------------------------------

    def gated_store(self, **kwargs):
        """A store whose first combined write (a batch of one) waits for ``gate``; the size of each such write."""
        store = self.store(**kwargs)
        sizes: list[int] = []
        entered, gate = threading.Event(), threading.Event()
        write = store._write_combined

        def gated(items):
            sizes.append(len(items))
            if len(sizes) == 1:
                entered.set()
                self.assertTrue(gate.wait(20), "the test never opened the gate")
            return write(items)

        store._write_combined = gated  # before the first append: its combiner is made with this write
        return store, sizes, entered, gate

    def append_in_threads(self, store, streams, outcomes: dict) -> list[threading.Thread]:
        def run(stream):
            try:
                store.append(stream)
                outcomes[stream.id] = None
            except Exception as exc:
                outcomes[stream.id] = exc
            finally:
                connections[self.alias].close()

        threads = [threading.Thread(target=run, args=(stream,), daemon=True) for stream in streams]
        for thread in threads:
            thread.start()
        return threads

    def batch_of(self, store, first, streams) -> tuple[dict, list[int]]:
        """``first`` appended in a thread and held in its write while ``streams`` queue behind it (each from
        its own thread); then all of it written. Each stream's outcome (None or its error), the batch sizes."""
        store, sizes, entered, gate = store
        outcomes: dict = {}
        threads = self.append_in_threads(store, [first], outcomes)
        self.assertTrue(entered.wait(20))
        threads += self.append_in_threads(store, streams, outcomes)
        combiner = store._combiner(first.aggregate_id.context_name, connections[self.alias])
        deadline = time.monotonic() + 20
        while len(combiner._queue) < len(streams):
            self.assertLess(time.monotonic(), deadline, "the appends did not queue behind the first")
            time.sleep(0.001)
        gate.set()
        for thread in threads:
            thread.join(20)
            self.assertFalse(thread.is_alive())
        return outcomes, sizes

    def test_concurrent_appends_are_written_as_one_batch_each_refused_or_stored_as_if_alone(self):
        existing = make_stream(agg(), 1)
        other = self.store()
        other.append(existing)
        other.append(make_stream(existing.aggregate_id, 2))
        race = agg()
        fine = [make_stream(agg(), 1), make_stream(agg(), 1, events=3)]
        version_taken = make_stream(existing.aggregate_id, 2)
        aggregate_taken = make_stream(existing.aggregate_id, 1)
        request_repeated = make_stream(existing.aggregate_id, 3, request_id=existing.request_id)
        id_repeated = replace(make_stream(agg(), 1), id=existing.id)
        racers = [make_stream(race, 1), make_stream(race, 1)]
        queued = [*fine, version_taken, aggregate_taken, request_repeated, id_repeated, *racers]
        first = make_stream(agg(), 1)
        outcomes, sizes = self.batch_of(self.gated_store(), first, queued)
        self.assertEqual(sizes, [1, len(queued)])  # the eight queued appends: one write
        self.assertIsNone(outcomes[first.id])
        for stream in fine:
            self.assertIsNone(outcomes[stream.id])
        self.assertIsInstance(outcomes[version_taken.id], EventVersionConflict)
        self.assertIsInstance(outcomes[aggregate_taken.id], DuplicateAggregateId)
        self.assertIsInstance(outcomes[request_repeated.id], DuplicateRequestId)
        self.assertIsInstance(outcomes[id_repeated.id], DuplicateEventStreamId)
        won = [s for s in racers if outcomes[s.id] is None]
        self.assertEqual(len(won), 1)
        self.assertIsInstance(outcomes[next(s for s in racers if s is not won[0]).id], DuplicateAggregateId)
        errors = [outcomes[s.id] for s in queued if outcomes[s.id] is not None]
        self.assertEqual(len({id(e) for e in errors}), len(errors))  # each caller its own exception
        store = self.store()
        for stream in [first, *fine, *won]:
            self.assertEqual(store.load(stream.aggregate_id), [stream])
        self.assertEqual([s.version for s in store.load(existing.aggregate_id)], [1, 2])
        self.assertEqual(EventStreamRow.objects.using(self.alias).count(), 2 + 1 + len(fine) + 1)

    def test_a_combined_write_whose_answer_is_lost_gives_each_caller_its_own_recoverable_error(self):
        # The batch is committed, then its answer lost (the connection dropped): no caller can know whether
        # its stream is stored, as with a lone append's lost answer; none retries on its own (it would meet
        # its own row and call it a conflict).
        store = self.gated_store()
        insert_together = store[0]._insert_together
        lost: list = []

        def committed_then_lost(connection, streams, indexes, results, values=None):
            insert_together(connection, streams, indexes, results, values)
            error = RecoverableStoreError("the connection dropped before the answer came back")
            error.__cause__ = OperationalError("server closed the connection unexpectedly")
            lost.append(error)
            for index in indexes:
                results[index] = error

        store[0]._insert_together = committed_then_lost
        queued = [make_stream(agg(), 1) for _ in range(3)] + [make_stream(agg(), 1, events=2)]
        outcomes, sizes = self.batch_of(store, make_stream(agg(), 1), queued)
        self.assertEqual(sizes, [1, 4])
        self.assertEqual(len(lost), 1)
        errors = [outcomes[s.id] for s in queued]
        for error in errors:
            self.assertIs(type(error), RecoverableStoreError)
            self.assertIs(error.__cause__, lost[0].__cause__)  # what the database said
        self.assertEqual(len({id(e) for e in errors}), len(errors))  # each caller its own
        for stream in queued:
            self.assertEqual(self.store().load(stream.aggregate_id), [stream])  # stored once, by the batch

    def test_a_combined_write_that_fails_as_a_whole_gives_each_caller_the_same_error_as_alone(self):
        store = self.gated_store()

        def misconfigured(connection, streams, indexes, results, values=None):
            raise ImproperlyConfigured("the table wow_event_stream does not exist: run manage.py migrate")

        store[0]._insert_together = misconfigured
        queued = [make_stream(agg(), 1) for _ in range(3)]
        outcomes, sizes = self.batch_of(store, make_stream(agg(), 1), queued)
        self.assertEqual(sizes, [1, 3])
        errors = [outcomes[s.id] for s in queued]
        for error in errors:  # not a "retry" for what retrying cannot fix
            self.assertIs(type(error), ImproperlyConfigured)
            self.assertIn("manage.py migrate", str(error))
        self.assertEqual(len({id(e) for e in errors}), 3)

    def test_connections_of_different_schemas_are_never_written_together(self):
        store = self.store()
        plain, tenant_a, tenant_b, again_a = (mock.Mock(spec=[]), mock.Mock(schema_name="a"),
                                              mock.Mock(schema_name="b"), mock.Mock(schema_name="a"))
        combiners = [store._combiner("ctx", connection) for connection in (plain, tenant_a, tenant_b, again_a)]
        self.assertEqual(len({id(c) for c in combiners[:3]}), 3)
        self.assertIs(combiners[1], combiners[3])
        self.assertIsNot(store._combiner("other", tenant_a), combiners[1])

    def test_an_append_waits_in_the_queue_at_most_the_lock_timeout_and_is_then_not_written(self):
        store, sizes, entered, gate = self.gated_store(lock_timeout_s=0.3)
        first, late = make_stream(agg(), 1), [make_stream(agg(), 1) for _ in range(2)]
        outcomes: dict = {}
        threads = self.append_in_threads(store, [first], outcomes)
        self.assertTrue(entered.wait(20))
        waiting = self.append_in_threads(store, late, outcomes)
        for thread in waiting:  # back while the write ahead of them still runs
            thread.join(20)
            self.assertFalse(thread.is_alive(), "a queued append waited past APPEND_LOCK_TIMEOUT_S")
        for stream in late:
            self.assertIsInstance(outcomes[stream.id], ContextLockTimeout)
            self.assertIn("APPEND_LOCK_TIMEOUT_S", str(outcomes[stream.id]))
        gate.set()
        for thread in threads:
            thread.join(20)
        self.assertIsNone(outcomes[first.id])
        self.assertEqual(sizes, [1])  # taken back out of the queue: never written
        for stream in late:
            self.assertEqual(self.store().load(stream.aggregate_id), [])

    def test_a_stream_the_database_refuses_in_a_combined_write_fails_alone_and_the_rest_is_stored(self):
        refused = replace(make_stream(agg(), 1), header={"note": "a NUL \u0000 inside"})
        fine = [make_stream(agg(), 1), make_stream(agg(), 1)]
        outcomes, sizes = self.batch_of(self.gated_store(), make_stream(agg(), 1), [refused, *fine])
        self.assertEqual(sizes, [1, 3])
        for stream in fine:
            self.assertIsNone(outcomes[stream.id])
            self.assertEqual(self.store().load(stream.aggregate_id), [stream])
        if connections[self.alias].vendor == "postgresql":  # PostgreSQL's jsonb refuses \u0000; SQLite keeps it
            self.assertIsInstance(outcomes[refused.id], EventStoreError)
            self.assertIn("cannot be stored", str(outcomes[refused.id]))
            self.assertEqual(self.store().load(refused.aggregate_id), [])

    def locked_before_the_batch(self, store, context: str) -> list:
        """``store`` (from :meth:`gated_store`) with another process taking ``context``'s lock just before a
        write of more than one append (taken from the queue by then: only the lock's bound applies)."""
        writers: list = []
        write = store[0]._write_combined

        def locking(items):
            if len(items) > 1 and not writers:
                writers.append(self.hung_writer_process(context))
            return write(items)

        store[0]._write_combined = locking
        return writers

    def test_every_caller_of_a_batch_gets_its_own_timeout_when_the_context_stays_locked(self):
        store = self.gated_store(lock_timeout_s=0.5)
        first = make_stream(agg(), 1)
        queued = [make_stream(agg(), 1) for _ in range(3)]
        writers = self.locked_before_the_batch(store, first.aggregate_id.context_name)
        outcomes, sizes = self.batch_of(store, first, queued)
        self.assertEqual(sizes, [1, 3])
        errors = [outcomes[s.id] for s in queued]
        for error in errors:
            self.assertIsInstance(error, ContextLockTimeout)
            self.assertIn("APPEND_LOCK_TIMEOUT_S", str(error))
            self.assertIsInstance(error.__cause__, OperationalError)  # what the database said
        self.assertEqual(len({id(e) for e in errors}), 3)
        writers[0].kill()
        writers[0].wait(10)
        for stream in queued:
            self.assertEqual(self.store().load(stream.aggregate_id), [])

    def test_a_combined_write_split_stream_by_stream_still_waits_for_the_lock_within_the_bound(self):
        store = self.gated_store(lock_timeout_s=0.5)
        first = make_stream(agg(), 1)
        refused = replace(make_stream(agg(), 1), header={"note": "a NUL \u0000 inside"})
        queued = [refused, make_stream(agg(), 1), make_stream(agg(), 1)]
        writers = self.locked_before_the_batch(store, first.aggregate_id.context_name)
        outcomes, sizes = self.batch_of(store, first, queued)
        self.assertEqual(sizes, [1, 3])
        for stream in queued[1:]:  # each waited for the lock within the bound, as alone
            self.assertIsInstance(outcomes[stream.id], ContextLockTimeout)
        # PostgreSQL refuses the NUL before taking any lock (if it comes first), SQLite keeps it.
        self.assertIsInstance(outcomes[refused.id], (EventStoreError, ContextLockTimeout))
        writers[0].kill()
        writers[0].wait(10)

    def counting_writes(self, store) -> list[int]:
        """The size of each combined write of ``store`` from now on (before its first append)."""
        written: list[int] = []
        write = store._write_combined
        store._write_combined = lambda items: written.append(len(items)) or write(items)
        return written

    def test_appends_inside_a_transaction_are_not_written_with_other_threads(self):
        store = self.store()
        written = self.counting_writes(store)
        inside = make_stream(agg(), 1)
        with self.assertRaises(RuntimeError), transaction.atomic(using=self.alias):
            store.append(inside)
            self.assertEqual(store.load(inside.aggregate_id), [inside])
            raise RuntimeError("the caller's transaction fails after the append")
        self.assertEqual(written, [])
        self.assertEqual(store.load(inside.aggregate_id), [])  # rolled back with the caller's transaction
        outside = make_stream(agg(), 1)
        store.append(outside)
        self.assertEqual(written, [1])
        self.assertEqual(store.load(outside.aggregate_id), [outside])

    def test_the_backend_combines_appends_unless_the_setting_turns_it_off(self):
        with override_settings(WOW={"DATABASE_ALIAS": self.alias}):
            self.assertTrue(DjangoBackend().event_store(request_id_index="aggregate").combine)
        with override_settings(WOW={"DATABASE_ALIAS": self.alias, "EVENT_STORE_COMBINE": False}):
            store = DjangoBackend().event_store(request_id_index="aggregate")
        self.assertFalse(store.combine)
        written = []
        store._write_combined = lambda items: written.append(items) or [None] * len(items)
        stream = make_stream(agg(), 1)
        store.append(stream)
        self.assertEqual(written, [])
        self.assertEqual(store.load(stream.aggregate_id), [stream])

    def test_appends_with_autocommit_off_stay_in_the_callers_transaction(self):
        store = self.store()
        written = self.counting_writes(store)
        stream = make_stream(agg(), 1)
        transaction.set_autocommit(False, using=self.alias)
        try:
            store.append(stream)
            transaction.rollback(using=self.alias)
        finally:
            transaction.set_autocommit(True, using=self.alias)
        self.assertEqual(written, [])
        self.assertEqual(store.load(stream.aggregate_id), [])

    def test_the_orm_model_of_event_streams_refuses_writes_outside_the_store(self):
        # Such a row takes no context lock: committed late, below a position a follower passed, it was never
        # delivered and no gap was recorded. Only the event store writes the table.
        store = self.store()
        store.append(make_stream(agg(), 1))
        rows = EventStreamRow.objects.using(self.alias)
        row = stream_row(make_stream(agg(), 1))
        attempts = {
            "save": lambda: row.save(using=self.alias),
            "create": lambda: rows.create(**vars_of(stream_row(make_stream(agg(), 1)))),
            "bulk_create": lambda: rows.bulk_create([stream_row(make_stream(agg(), 1))]),
            "update": lambda: rows.update(size=9),
            "delete": lambda: rows.all().delete(),
            "instance delete": lambda: rows.first().delete(),
        }
        for name, attempt in attempts.items():
            with self.subTest(name), self.assertRaisesRegex(EventStreamWriteRefused, "only the event store"):
                attempt()
        self.assertEqual([r.size for r in rows.all()], [1])  # nothing written, nothing deleted
        store.append(make_stream(agg(), 1))  # the store itself still writes
        self.assertEqual(rows.count(), 2)

    def test_each_unique_violation_names_its_constraint(self):
        first = make_stream(agg(), 1)
        with store_writes():  # the table's constraints themselves, around the store
            EventStreamRow.objects.using(self.alias).create(**vars_of(stream_row(first)))
        other = agg()
        global_first = make_stream(agg(), 1, request_id="global-req")
        with store_writes():
            EventStreamRow.objects.using(self.alias).create(**vars_of(stream_row(global_first, request_scope="")))
        cases = {
            "wow_stream_agg_version_uniq": stream_row(make_stream(first.aggregate_id, 1)),
            "wow_stream_agg_request_uniq": stream_row(make_stream(first.aggregate_id, 2, request_id=first.request_id),
                                                      request_scope="elsewhere"),
            "wow_stream_scope_request_uniq": stream_row(make_stream(other, 1, request_id="global-req"),
                                                        request_scope=""),
            "wow_stream_id_uniq": stream_row(replace(make_stream(agg(), 1), id=first.id)),
        }
        for expected, row in cases.items():
            with self.subTest(expected), self.assertRaises(IntegrityError) as caught:
                with transaction.atomic(using=self.alias), store_writes():
                    EventStreamRow.objects.using(self.alias).create(**vars_of(row))
            self.assertEqual(violated_constraint(caught.exception, EventStreamRow), expected)

    def test_append_maps_by_constraint_name_without_reading(self):
        store = self.store()
        a = agg()
        first = make_stream(a, 1, request_id="req-1")
        store.append(first)
        store.append(make_stream(a, 2))
        with mock.patch.object(DjangoEventStore, "_refused", side_effect=AssertionError("read to confirm")):
            with self.assertRaises(DuplicateAggregateId):
                store.append(make_stream(a, 1))
            with self.assertRaises(EventVersionConflict) as caught:
                store.append(make_stream(a, 2))
            self.assertNotIsInstance(caught.exception, DuplicateAggregateId)
            with self.assertRaises(DuplicateRequestId):
                store.append(make_stream(a, 3, request_id="req-1"))
            with self.assertRaises(DuplicateEventStreamId):
                store.append(replace(make_stream(agg(), 1), id=first.id))
        self.assertEqual([s.version for s in store.load(a)], [1, 2])

    def test_an_unnamed_violation_is_confirmed_by_a_read(self):
        store = self.store()
        a = agg()
        first = make_stream(a, 1, request_id="req-1")
        store.append(first)
        with mock.patch("wow_django.backends.django.event_store.violated_constraint", return_value=None):
            with self.assertRaises(DuplicateAggregateId):
                store.append(make_stream(a, 1))
            with self.assertRaises(DuplicateRequestId):
                store.append(make_stream(a, 2, request_id="req-1"))
            with self.assertRaises(DuplicateEventStreamId):
                store.append(replace(make_stream(agg(), 1), id=first.id))

    def test_a_batch_reports_each_kind_of_refusal(self):
        for one_statement in (True, False):
            with self.subTest(one_statement=one_statement):
                store = self.store()
                store.one_statement = one_statement
                a, b = agg(), agg()
                first = make_stream(a, 1, request_id="taken")
                store.append(first)
                same_id = replace(make_stream(b, 2), id=first.id)
                batch = [make_stream(a, 2), make_stream(a, 2), make_stream(a, 3, request_id="taken"), same_id,
                         make_stream(b, 1)]
                results = store.append_many(batch)
                self.assertIsNone(results[0])
                self.assertIsInstance(results[1], EventVersionConflict)
                self.assertIsInstance(results[2], DuplicateRequestId)
                self.assertIsInstance(results[3], DuplicateEventStreamId)
                self.assertIsNone(results[4])
                self.assertEqual(store.load(a), [first, batch[0]])
                self.assertEqual(store.load(b), [batch[4]])

    def test_a_batch_stores_the_rest_when_one_body_is_not_json(self):
        store = self.store()
        good, bad = make_stream(agg(), 1), make_stream(agg(), 1)
        bad.body[0].body["price"] = {1, 2}  # a set: not JSON
        results = store.append_many([good, bad])
        self.assertIsNone(results[0])
        self.assertIsInstance(results[1], TypeError)
        self.assertEqual(store.load(good.aggregate_id), [good])
        self.assertEqual(store.load(bad.aggregate_id), [])

    # --- request ids in global mode ------------------------------------------------------------

    def test_global_request_ids_are_unique_per_aggregate_type(self):
        store = self.store(request_id_index="global")
        store.append(make_stream(agg(), 1, request_id="req-g"))
        with self.assertRaises(DuplicateRequestId):
            store.append(make_stream(agg(), 1, request_id="req-g"))
        results = store.append_many([make_stream(agg(), 1, request_id="req-g"), make_stream(agg(), 1)])
        self.assertIsInstance(results[0], DuplicateRequestId)
        self.assertIsNone(results[1])
        store.append(make_stream(agg(name="customer"), 1, request_id="req-g"))  # another type
        self.assertTrue(store.exists_request_id("order", "req-g"))
        self.assertFalse(store.exists_request_id("order", "req-h"))

    def test_global_mode_refuses_a_type_stored_in_aggregate_mode_until_it_is_moved(self):
        self.store().append(make_stream(agg(), 1, request_id="req-a"))
        with self.assertRaisesRegex(SchemaConflictError, "stored in 'aggregate' mode"):
            self.store(request_id_index="global").append(make_stream(agg(), 1))
        self.store(request_id_index="global").append(make_stream(agg(name="customer"), 1))  # other types are fine
        with store_writes():  # what the error message's UPDATE statement does
            EventStreamRow.objects.using(self.alias).filter(aggregate_name="order").update(request_scope="")
        store = self.store(request_id_index="global")
        with self.assertRaises(DuplicateRequestId):
            store.append(make_stream(agg(), 1, request_id="req-a"))

    # --- reads --------------------------------------------------------------------------------------

    def test_scan_order_is_code_point_order(self):
        store = self.store()
        ids = ["Zeta", "alpha", "_under", "Élan", "zz", "a-b", "aB", "a_b", "10", "9", "émile", "ß"]
        for aggregate_id in ids:
            store.append(make_stream(agg(aggregate_id), 1))
        self.assertEqual([a.id for a in store.scan_aggregate_ids("order", "", 100)], sorted(ids))
        self.assertEqual([a.id for a in store.scan_aggregate_ids("order", "a", 100)],
                         [i for i in sorted(ids) if i > "a"])

    def test_positions_increase_in_append_order(self):
        store = self.store()
        a = agg("a1")
        for version in (1, 2, 3):
            store.append(make_stream(a, version))
        store.append_many([make_stream(agg("b"), 1), make_stream(a, 4)])  # stored as ("a1", 4), ("b", 1)
        rows = EventStreamRow.objects.using(self.alias).order_by("position")
        self.assertEqual([(r.aggregate_id, r.version) for r in rows],
                         [(a.id, 1), (a.id, 2), (a.id, 3), (a.id, 4), ("b", 1)])  # a batch in (id, version) order

    def test_json_round_trips_exactly(self):
        store = self.store()
        header = {"z": 1, "a": [1.5, None, True], "nested": {"ü": "ñ", "emoji": "🙂"}}
        stream = make_stream(agg(), 1, header=header)
        store.append(stream)
        self.assertEqual(store.load(stream.aggregate_id), [stream])
        self.assertEqual(store.last(stream.aggregate_id).header, header)

    # --- inside the caller's transaction ------------------------------------------------------

    def test_a_conflict_inside_the_callers_transaction_leaves_it_usable(self):
        store = self.store()
        a = agg()
        store.append(make_stream(a, 1))
        with transaction.atomic(using=self.alias):
            with self.assertRaises(DuplicateAggregateId):
                store.append(make_stream(a, 1))
            store.append(make_stream(a, 2))
            results = store.append_many([make_stream(a, 2), make_stream(a, 3)])
            self.assertIsInstance(results[0], EventVersionConflict)
            self.assertIsNone(results[1])
        self.assertEqual([s.version for s in store.load(a)], [1, 2, 3])

    def test_appends_roll_back_with_the_callers_transaction(self):
        store = self.store()
        a = agg()
        with self.assertRaises(RuntimeError), transaction.atomic(using=self.alias):
            store.append(make_stream(a, 1))
            store.append_many([make_stream(a, 2)])
            raise RuntimeError("the caller gives up")
        self.assertEqual(store.load(a), [])

    # --- snapshots ---------------------------------------------------------------------------------

    def test_a_snapshot_save_is_one_statement(self):
        store = DjangoSnapshotStore(using=self.alias)
        a = agg()
        for version in (3, 2, 3, 4):
            with CaptureQueriesContext(connections[self.alias]) as queries:
                store.save(make_snapshot(a, version))
            self.assertEqual(len(queries), 1, [q["sql"] for q in queries])
            self.assertIn("ON CONFLICT", queries[0]["sql"])
            self.assertIn("DO UPDATE", queries[0]["sql"])
        self.assertEqual(store.load(a).version, 4)
        self.assertEqual(SnapshotRow.objects.using(self.alias).filter(aggregate_id=a.id).count(), 1)

    def test_threads_saving_random_versions_leave_the_highest(self):
        store = DjangoSnapshotStore(using=self.alias)
        aggregates = [agg() for _ in range(4)]
        barrier = threading.Barrier(8, timeout=60)
        errors: list[BaseException] = []

        def saver(seed: int) -> None:
            rng = random.Random(seed)
            barrier.wait()
            try:
                for _ in range(40):
                    store.save(make_snapshot(rng.choice(aggregates), rng.randint(1, 50)))
                for a in aggregates:
                    store.save(make_snapshot(a, 50 + seed))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=saver, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for a in aggregates:
            self.assertEqual(store.load(a), make_snapshot(a, 57))

    # --- prepare keys ------------------------------------------------------------------------------

    def test_prepared_values_compare_as_json(self):
        keys = DjangoPrepareKey("username", using=self.alias, clock=FakeClock())
        self.assertTrue(keys.prepare("k1", {"b": 2, "a": [1, {"y": 1, "x": 2}]}))
        self.assertFalse(keys.rollback("k1", {"a": [1, {"x": 2, "y": 1}], "b": 3}))
        self.assertTrue(keys.rollback("k1", {"a": [1, {"x": 2, "y": 1}], "b": 2}))  # other key order: equal
        self.assertTrue(keys.prepare("k2", None))
        self.assertEqual(keys.get("k2").value, None)
        self.assertFalse(keys.reprepare("k2", "x", old_value="None"))
        self.assertTrue(keys.reprepare("k2", "x", old_value=None))
        self.assertEqual(PrepareKeyRow.objects.using(self.alias).get(name="username", key="k2").value, "x")

    def test_an_expired_reservation_is_taken_over_in_place(self):
        clock = FakeClock()
        keys = DjangoPrepareKey("username", using=self.alias, clock=clock)
        self.assertTrue(keys.prepare("k", "first", timedelta(seconds=5)))
        clock.advance(seconds=5)
        self.assertTrue(keys.prepare("k", "second"))
        self.assertEqual(PrepareKeyRow.objects.using(self.alias).filter(name="username", key="k").count(), 1)
        self.assertEqual(keys.get("k").value, "second")

    def test_a_missing_table_says_to_migrate(self):
        def rename(old: str, new: str) -> None:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")

        snapshots, keys = DjangoSnapshotStore(using=self.alias), DjangoPrepareKey("username", using=self.alias)
        calls = {"wow_event_stream": lambda: self.store().load(agg()),
                 "wow_snapshot": lambda: snapshots.load(agg()),
                 "wow_prepare_key": lambda: keys.prepare("k", "v")}
        for table, call in calls.items():
            with self.subTest(table):
                rename(table, f"{table}_away")
                try:
                    with self.assertRaisesMessage(ImproperlyConfigured,
                                                  f"manage.py migrate wow_django --database {self.alias}"):
                        call()
                finally:
                    rename(f"{table}_away", table)
                call()

    # --- hot reads straight to the driver ------------------------------------------------------------

    def test_hot_reads_skip_djangos_cursor_unless_someone_watches(self):
        store, snapshots = self.store(), DjangoSnapshotStore(using=self.alias)
        a = agg()
        for version in (1, 2, 3):
            store.append(make_stream(a, version))
        snapshots.save(make_snapshot(a, 2))
        connection = connections[self.alias]
        reads = {
            "load": lambda: [s.version for s in store.load(a)],
            "load from 2 to 3": lambda: [s.version for s in store.load(a, 2, 3)],
            "last": lambda: store.last(a).version,
            "snapshot": lambda: snapshots.load(a).version,
            "snapshot and tail": lambda: (lambda found: (found[0].version, [s.version for s in found[1]]))(
                snapshots.load_with_tail(a, store)),
        }
        expected = {"load": [1, 2, 3], "load from 2 to 3": [2, 3], "last": 3, "snapshot": 2,
                    "snapshot and tail": (2, [3])}
        with self.straight(connection):
            self.assertEqual({name: read() for name, read in reads.items()}, expected)
        # Watched (DEBUG, CaptureQueriesContext): every read is logged, through Django's cursor.
        with CaptureQueriesContext(connection) as queries:
            self.assertEqual({name: read() for name, read in reads.items()}, expected)
        self.assertEqual(len(queries), len(reads), [q["sql"] for q in queries])
        seen: list[str] = []

        def watch(execute, sql, params, many, context):
            seen.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(watch):
            self.assertEqual({name: read() for name, read in reads.items()}, expected)
        self.assertEqual(len(seen), len(reads))
        # A closed connection is opened by Django's cursor, as before.
        connection.close()
        self.assertEqual(reads["load"](), [1, 2, 3])
        self.assertIsNotNone(connection.connection)

    def one_stream_stored(self):
        """A store, an aggregate with one stream, and this thread's open connection."""
        store = self.store()
        a = agg()
        store.append(make_stream(a, 1))
        connection = connections[self.alias]
        connection.ensure_connection()
        return store, a, connection

    @staticmethod
    def straight(connection):
        """Fails a statement that goes through Django's cursor (``create_cursor``: not a hook anyone checks)."""
        return mock.patch.object(connection, "create_cursor", side_effect=AssertionError("went through Django's cursor"))

    def test_hot_reads_go_through_djangos_cursor_whenever_something_hooks_it(self):
        store, a, connection = self.one_stream_stored()
        seen: list[str] = []

        def counted(original):
            def execute(cursor, sql, params=None):
                seen.append(sql)
                return original(cursor, sql, params)
            return execute

        from django.db.backends.utils import CursorWrapper

        # As Sentry does: CursorWrapper.execute replaced for the whole process.
        with mock.patch.object(CursorWrapper, "execute", counted(CursorWrapper.execute)):
            self.assertEqual([s.version for s in store.load(a)], [1])
        self.assertEqual(len(seen), 1)
        # As django-debug-toolbar does: the connection's cursor replaced.
        calls: list[int] = []
        original_cursor = connection.cursor
        with mock.patch.object(connection, "cursor", lambda: calls.append(1) or original_cursor()):
            self.assertEqual([s.version for s in store.load(a)], [1])
        self.assertEqual(calls, [1])
        # DEBUG: the read is in connection.queries.
        with override_settings(DEBUG=True):
            connection.queries_log.clear()
            self.assertEqual([s.version for s in store.load(a)], [1])
            self.assertEqual(len(connection.queries), 1)
        # A health check due (CONN_HEALTH_CHECKS, the first statement of a request): Django's cursor runs it.
        with mock.patch.object(connection, "health_check_enabled", True), \
                mock.patch.object(connection, "health_check_done", False), \
                mock.patch.object(connection, "is_usable", return_value=True) as checked:
            self.assertEqual([s.version for s in store.load(a)], [1])
        checked.assert_called_once()
        # Inside a running event loop Django's cursor refuses, and so does the read.
        import asyncio

        from django.core.exceptions import SynchronousOnlyOperation

        async def in_a_loop():
            return store.load(a)

        with self.assertRaises(SynchronousOnlyOperation):
            asyncio.run(in_a_loop())
        # Nothing hooked: straight to the driver.
        with self.straight(connection):
            self.assertEqual([s.version for s in store.load(a)], [1])

    def test_a_straight_read_on_a_closed_or_another_threads_connection_fails_as_djangos_would(self):
        store, a, connection = self.one_stream_stored()
        # Another thread's connection: Django's thread-sharing check refuses it.
        errors: list[BaseException] = []

        def elsewhere() -> None:
            try:
                fetch(connection, "SELECT %s", (1,))
            except BaseException as exc:  # checked below
                errors.append(exc)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], DatabaseError)
        self.assertIn("can only be used in that same thread", str(errors[0]))
        # The driver's connection closed behind Django's back: Django's error, never the driver's.
        connection.connection.close()
        with self.assertRaises((DatabaseError, RecoverableStoreError)) as raised:
            store.load(a)
        self.assertIn(type(raised.exception).__module__, ("django.db.utils", "wow_django.exceptions"))
        connection.close()
        self.assertEqual([s.version for s in store.load(a)], [1])

    def test_a_straight_read_keeps_djangos_checks_and_errors(self):
        connection = connections[self.alias]
        connection.ensure_connection()
        self.assertEqual(fetch(connection, "SELECT '100%%' || %s", ("!",), one=True), ("100%!",))
        self.assertEqual(fetch(connection, "SELECT %s UNION ALL SELECT %s", ("a", "b")), [("a",), ("b",)])
        # A driver error comes as Django's, and marks the connection as Django's own cursor does.
        connection.errors_occurred = False
        with self.assertRaises(DatabaseError) as raised:
            fetch(connection, "SELECT * FROM wow_no_such_table WHERE x = %s", (1,))
        self.assertEqual(type(raised.exception).__module__, "django.db.utils")
        self.assertIsInstance(raised.exception.__cause__, (sqlite3.Error, psycopg.Error))
        self.assertTrue(connection.errors_occurred)
        # A transaction marked for rollback refuses a read, on this path too.
        store = self.store()
        with transaction.atomic(using=self.alias):
            transaction.set_rollback(True, using=self.alias)
            with self.assertRaises(TransactionManagementError):
                store.load(agg())

    # --- threads ----------------------------------------------------------------------------------

    def test_each_thread_works_on_its_own_connection(self):
        store = self.store()
        a = agg()
        store.append(make_stream(a, 1))
        barrier = threading.Barrier(4, timeout=60)
        seen: list[int] = []

        def reader() -> None:
            store.load(a)
            seen.append(id(database(self.alias).connection))
            barrier.wait()  # all four hold their connection at once

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(set(seen)), 4)
        self.assertNotIn(id(connections[self.alias].connection), seen)


def vars_of(row: EventStreamRow) -> dict:
    return {f.attname: getattr(row, f.attname) for f in EventStreamRow._meta.concrete_fields if not f.primary_key}


class TestSQLiteDjangoBackend(OnSQLite, DjangoBackendBehaviour, TransactionTestCase):
    def test_a_load_reads_its_rows_as_one_json_array_with_every_value_as_stored(self):
        """SQLite gives a load's rows as one JSON array (one step of one statement): the streams are those the
        row-by-row read gives, in version order whatever order the rows were written in, every value exact."""
        from decimal import Decimal

        from wow_django.persistence.records import DomainEventRecord, EventStream

        store = self.store()
        a, other = agg(), agg()
        body = {"big": 2**70, "price": Decimal("0.10"), "tiny": Decimal("1E-400"), "text": "é😀\\u0000 \"q\"",
                "nested": [{"k": None}, True, -0, 1.5e300], "": "empty key"}
        streams = [EventStream(id=f"s-{uuid.uuid4().hex}", aggregate_id=a, version=version,
                               body=(DomainEventRecord(id=f"e-{version}", name="changed", revision="1.0",
                                                       body_type="order.Changed", body=body),),
                               request_id=f"r-{version}", command_id=f"c-{version}",
                               owner_id="" if version == 2 else "owner-ü", header={"h": version, "x": [1, "2"]},
                               create_time=1_700_000_000_000 + version)
                   for version in (1, 2, 3)]
        with connections[self.alias].cursor() as cursor:  # the store's own insert, rows out of version order
            for stream in (streams[2], streams[0], streams[1]):
                cursor.execute(store._insert_sql + store._row_sql, store._values(stream))
        store.append(make_stream(other, 1))
        with CaptureQueriesContext(connections[self.alias]) as queries:
            loaded = store.load(a)
        self.assertEqual(len(queries), 1)
        self.assertIn("json_group_array", queries[0]["sql"])
        self.assertEqual([s.version for s in loaded], [1, 2, 3])
        row_by_row = DjangoEventStore(using=self.alias)
        row_by_row._json_read_sql = None
        self.assertEqual(loaded, row_by_row.load(a))
        self.assertEqual(loaded[0].body[0].body, {**body, "nested": [{"k": None}, True, 0, Decimal("1.5e300")]})
        self.assertEqual(loaded[1].owner_id, "")
        self.assertEqual(loaded[2].header, {"h": 3, "x": [1, "2"]})
        self.assertEqual(store.load(a, 2, 2), [loaded[1]])
        self.assertEqual(store.load(agg()), [])


class TestPostgreSQLDjangoBackend(OnPostgreSQL, DjangoBackendBehaviour, TransactionTestCase):
    pass

    def test_an_unreachable_database_is_a_recoverable_error_on_a_threads_first_append(self):
        store = self.store()
        connection = connections[self.alias]
        connection.close()
        refused = OperationalError("connection refused")
        refused.__cause__ = psycopg.OperationalError("connection refused")  # as Django wraps the driver's
        with mock.patch.object(connection, "ensure_connection", side_effect=refused):
            with self.assertRaises(RecoverableStoreError):
                store.append(make_stream(agg(), 1))


# --- batches without RETURNING (SQLite < 3.35): the savepoint path under the whole contract ----------------
#
# PostgreSQL always returns rows from an insert, so the savepoint path runs there only in
# test_a_batch_reports_each_kind_of_refusal above.


class SavepointBatches:
    def make_store(self):
        store = DjangoEventStore(using=self.alias)
        store.one_statement = False
        return BatchingEventStore(store, max_size=16, max_delay_ms=0.5, lane_count=2)


class TestSQLiteSavepointBatches(OnSQLite, SavepointBatches, EventStoreContract, TransactionTestCase):
    pass




# --- PostgreSQL ---------------------------------------------------------------------------------------------


def pg_admin():
    """A connection of its own to the test database, past Django."""
    settings = connections["wow_pg"].settings_dict
    return psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                           password=settings["PASSWORD"] or None, dbname=settings["NAME"], autocommit=True)


class TestPostgreSQLConnections(OnPostgreSQL, TransactionTestCase):
    def terminate_this_threads_connection(self) -> None:
        pid = connections[self.alias].connection.info.backend_pid
        with pg_admin() as admin:
            self.assertTrue(admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone()[0])

    def test_a_terminated_connection_is_recoverable_and_the_next_call_reconnects(self):
        store = DjangoEventStore(using=self.alias)
        snapshots = DjangoSnapshotStore(using=self.alias)
        keys = DjangoPrepareKey("username", using=self.alias)
        a = agg()
        store.append(make_stream(a, 1))
        second, third = make_stream(a, 2), make_stream(a, 3)
        batch = [make_stream(agg(), 1)]
        key = uuid.uuid4().hex
        calls = [  # (what, a call on a live connection, the call that meets the killed one and is retried)
            ("load", lambda: store.load(a), lambda: store.load(a)),
            ("append", lambda: store.append(second), lambda: store.append(third)),
            ("append_many", lambda: store.append_many([make_stream(agg(), 1)]), lambda: store.append_many(batch)),
            ("snapshot save", lambda: snapshots.save(make_snapshot(a, 1)), lambda: snapshots.save(make_snapshot(a, 2))),
            ("prepare", lambda: keys.prepare(uuid.uuid4().hex, "v"), lambda: keys.prepare(key, "v")),
        ]
        for name, live, after in calls:
            with self.subTest(name):
                live()
                self.terminate_this_threads_connection()
                if name == "append_many":
                    [result] = after()
                    self.assertIsInstance(result, RecoverableStoreError)
                else:
                    with self.assertRaisesRegex(RecoverableStoreError, "retry"):
                        after()
                after()  # retried on a new connection
        self.assertEqual(store.load(a), [store.load(a)[0], second, third])
        self.assertEqual(store.load(batch[0].aggregate_id), batch)
        self.assertEqual(snapshots.load(a).version, 2)
        self.assertEqual(keys.get(key).value, "v")

    def test_execute_wrappers_see_the_stores_statements_and_can_refuse_them(self):
        store = DjangoEventStore(using=self.alias)
        seen: list[str] = []

        def watch(execute, sql, params, many, context):
            seen.append(sql.split()[0])
            self.assertIs(context["connection"], connections[self.alias])
            return execute(sql, params, many, context)

        def refuse(execute, sql, params, many, context):
            raise RuntimeError("no statements now")

        a = agg()
        with connections[self.alias].execute_wrapper(watch):
            store.append(make_stream(a, 1))
            store.load(a)
        self.assertEqual(seen, ["WITH", "SELECT"])
        with connections[self.alias].execute_wrapper(refuse), self.assertRaisesRegex(RuntimeError, "no statements"):
            store.load(a)

    def test_worker_threads_close_their_connections_when_they_end(self):
        def alive(pids: set[int]) -> set[int]:
            with pg_admin() as admin:
                rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)]).fetchall()
            return {pid for (pid,) in rows}

        store = DjangoEventStore(using=self.alias)
        store.append(make_stream(a := agg(), 1))
        barrier = threading.Barrier(6, timeout=60)
        pids: set[int] = set()
        # A connection the cyclic garbage collector frees would close late or never: only closing counts here.
        gc.disable()
        self.addCleanup(gc.enable)

        def worker() -> None:
            store.load(a)
            pids.add(connections[self.alias].connection.info.backend_pid)  # this thread's own session
            barrier.wait()

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(pids), 6)
        deadline = time.monotonic() + 5
        while alive(pids) and time.monotonic() < deadline:  # a backend leaves shortly after its client
            time.sleep(0.02)
        self.assertEqual(alive(pids), set())

    def test_text_columns_use_the_c_collation(self):
        tables = [model._meta.db_table for model in (EventStreamRow, SnapshotRow, PrepareKeyRow)]
        with connections[self.alias].cursor() as cursor:
            cursor.execute("SELECT table_name, column_name, collation_name FROM information_schema.columns "
                           "WHERE table_name = ANY(%s) AND data_type = 'text'", [tables])
            columns = cursor.fetchall()
        text = {(model._meta.db_table, field.column) for model in (EventStreamRow, SnapshotRow, PrepareKeyRow)
                for field in model._meta.concrete_fields if isinstance(field, CodePointTextField)}
        self.assertEqual({(table, column) for table, column, _ in columns}, text)
        self.assertEqual({collation for _, _, collation in columns}, {"C"})


# --- SQLite ---------------------------------------------------------------------------------------------------


class TestSQLiteConnections(OnSQLite, TransactionTestCase):
    def pragmas(self) -> tuple[str, int]:
        raw = database(self.alias).connection
        return raw.execute("PRAGMA journal_mode").fetchone()[0], raw.execute("PRAGMA busy_timeout").fetchone()[0]

    def test_every_connection_of_the_alias_is_in_wal_mode_with_a_busy_timeout(self):
        store = DjangoEventStore(using=self.alias)
        store.load(agg())
        self.assertEqual(self.pragmas(), ("wal", SQLITE_BUSY_TIMEOUT_MS))
        in_thread: list[tuple] = []

        def other_thread() -> None:  # a new connection: set up by the connection_created receiver
            store.load(agg())
            in_thread.append(self.pragmas())

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        self.assertEqual(in_thread, [("wal", SQLITE_BUSY_TIMEOUT_MS)])
        connections[self.alias].close()  # and a reconnection in this thread
        store.load(agg())
        self.assertEqual(self.pragmas(), ("wal", SQLITE_BUSY_TIMEOUT_MS))

    def test_a_locked_database_is_recoverable(self):
        store = DjangoEventStore(using=self.alias)
        a = agg()
        store.append(make_stream(a, 1))
        database(self.alias).connection.execute("PRAGMA busy_timeout = 50")
        holder = sqlite3.connect(connections[self.alias].settings_dict["NAME"], isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            with self.assertRaisesRegex(RecoverableStoreError, "locked"):
                store.append(make_stream(a, 2))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.append(make_stream(a, 2))
        self.assertEqual([s.version for s in store.load(a)], [1, 2])

    def test_processes_share_the_file(self):
        """Four processes append to one aggregate of one file; every version is stored once."""
        directory = tempfile.mkdtemp(prefix="wow-sqlite-")
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        path = os.path.join(directory, "shared.sqlite3")
        run = [sys.executable, "-c", PROCESS_SCRIPT, path]
        setup = subprocess.run([*run, "migrate"], capture_output=True, text=True, timeout=120)
        self.assertEqual(setup.returncode, 0, setup.stderr)
        workers = [subprocess.Popen([*run, "append", str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for n in range(4)]
        outputs = [w.communicate(timeout=120) for w in workers]
        for worker, (_, err) in zip(workers, outputs, strict=True):
            self.assertEqual(worker.returncode, 0, err)
        conflicts = sum(int(out.split()[-1]) for out, _ in outputs)
        with sqlite3.connect(path) as check:
            versions = [v for (v,) in check.execute(
                "SELECT version FROM wow_event_stream WHERE aggregate_id = 'shared' ORDER BY version")]
            mode = check.execute("PRAGMA journal_mode").fetchone()[0]
        self.assertEqual(versions, list(range(1, 4 * 30 + 1)))
        self.assertEqual(mode, "wal")
        self.assertGreaterEqual(conflicts, 0)


PROCESS_SCRIPT = textwrap.dedent('''
    import sys
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
        INSTALLED_APPS=["wow_django"], USE_TZ=True,
    )
    django.setup()
    if sys.argv[2] == "migrate":
        from django.core.management import call_command
        call_command("migrate", "wow_django", verbosity=0)
        sys.exit(0)
    from wow_django.backends.django.event_store import DjangoEventStore
    from wow_django.exceptions import EventVersionConflict
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_stream

    store = DjangoEventStore()
    agg = AggregateId("order", "shared", "test-context", "tenant-a")
    conflicts = 0
    for i in range(30):
        while True:
            last = store.last(agg)
            try:
                store.append(make_stream(agg, last.version + 1 if last else 1, request_id=f"p{sys.argv[3]}-{i}"))
                break
            except EventVersionConflict:
                conflicts += 1
    print("conflicts", conflicts)
''')


# --- classification, configuration, runtime -----------------------------------------------------------------


def django_error(django_class, cause):
    error = django_class(str(cause))
    error.__cause__ = cause
    return error


def test_which_errors_are_recoverable():
    try:
        sqlite3.connect(":memory:").execute("SELECT * FROM missing")
    except sqlite3.OperationalError as exc:
        no_table = exc
    assert not is_recoverable(django_error(OperationalError, no_table))
    assert is_recoverable(django_error(OperationalError, psycopg.errors.SerializationFailure("retry")))
    assert is_recoverable(django_error(OperationalError, psycopg.errors.DeadlockDetected("deadlock")))
    assert is_recoverable(django_error(OperationalError, psycopg.errors.AdminShutdown("terminating")))
    assert is_recoverable(django_error(OperationalError, psycopg.errors.QueryCanceled("statement timeout")))
    assert is_recoverable(django_error(OperationalError, psycopg.OperationalError("server closed the connection")))
    assert not is_recoverable(django_error(ProgrammingError, psycopg.errors.UndefinedTable("missing")))
    assert not is_recoverable(django_error(IntegrityError, psycopg.errors.UniqueViolation("dup")))
    assert is_recoverable(django_error(OperationalError, psycopg.errors.LockNotAvailable("lock timeout")))
    assert is_recoverable(django_error(InternalError, psycopg.errors.ReadOnlySqlTransaction("read-only")))
    assert not is_recoverable(django_error(OperationalError, psycopg.errors.DiskFull("could not extend file")))
    assert not is_recoverable(OperationalError("no driver error"))


def test_only_configured_postgresql_or_sqlite_databases_are_accepted(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match=r"'nowhere', which is not in settings.DATABASES"):
        DjangoEventStore(using="nowhere")
    monkeypatch.setattr(connections["wow_sqlite"], "vendor", "mysql")
    with pytest.raises(ImproperlyConfigured, match="needs PostgreSQL or SQLite; database 'wow_sqlite' is mysql"):
        validate_database("wow_sqlite")
    with override_settings(WOW={"STORAGE": "django", "DATABASE_ALIAS": "wow_sqlite"}):
        assert [m.id for m in check_settings() if m.level >= 40] == ["wow_django.E004"]


def test_the_database_alias_setting_is_checked():
    with override_settings(WOW={"STORAGE": "django", "DATABASE_ALIAS": "events"}):
        [message] = [m for m in check_settings() if m.id == "wow_django.E001"]
        assert "WOW['DATABASE_ALIAS'] must name a database in settings.DATABASES" in message.msg
        with pytest.raises(ImproperlyConfigured, match="DATABASE_ALIAS"):
            _ = get_runtime().event_store
    with override_settings(WOW={"STORAGE": "django", "DATABASE_ALIAS": "wow_pg"}):
        assert [m.id for m in check_settings() if m.level >= 40] == []
        backend = get_runtime().backend("EVENT_STORE")
        assert isinstance(backend, DjangoBackend) and backend.using == "wow_pg"


class TestRuntimeOnTheDjangoBackend(OnPostgreSQL, TransactionTestCase):
    def test_the_gateway_appends_and_loads_through_postgresql(self):
        with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django", "DATABASE_ALIAS": "wow_pg"}):
            runtime = get_runtime()
            self.assertIsInstance(runtime.event_store, DjangoEventStore)
            placed = runtime.gateway.send(PlaceOrder(
                customer_id="c-1", items=[OrderLine(sku="A", quantity=2, unit_price=Decimal("2.50"))]),
                wait=WaitStage.SNAPSHOT)
            self.assertEqual(placed.aggregate_version, 1)
            order = AggregateId("order", placed.aggregate_id)
            [stream] = runtime.event_store.load(order)
            self.assertEqual(stream.body[0].name, "order_placed")
            self.assertEqual(runtime.snapshot_store.load(order).version, 1)
            self.assertTrue(EventStreamRow.objects.using("wow_pg").filter(aggregate_id=placed.aggregate_id).exists())
            customer = runtime.gateway.send(RegisterCustomer(username="alice", display_name="Alice"))
            self.assertEqual(runtime.prepare_key("username").get(username_key(DEFAULT_TENANT_ID, "alice")).value, customer.aggregate_id)
            self.assertEqual(PrepareKeyRow.objects.using("wow_pg").get(key=username_key(DEFAULT_TENANT_ID, "alice")).name, "username")

    def test_the_query_services_read_the_django_stores(self):
        from wow_django.application.queries import parse_count_query, parse_paged_query

        with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django", "DATABASE_ALIAS": "wow_pg"}):
            runtime = get_runtime()
            ids = [runtime.gateway.send(PlaceOrder(customer_id=f"c-{n}", items=[
                OrderLine(sku="A", quantity=n, unit_price=Decimal("1"))]), tenant_id="t1", wait=WaitStage.SNAPSHOT
            ).aggregate_id for n in (1, 2, 3)]
            runtime.gateway.send(PlaceOrder(customer_id="other", items=[
                OrderLine(sku="A", quantity=1, unit_price=Decimal("1"))]), tenant_id="t2", wait=WaitStage.SNAPSHOT)
            snapshots = runtime.snapshot_queries("order")
            self.assertEqual(snapshots.count(parse_count_query({}), tenant_id="t1"), 3)
            page = snapshots.paged(parse_paged_query({
                "condition": {"field": "state.customer_id", "operator": "IN", "value": ["c-2", "c-3"]},
                "sort": [{"field": "state.customer_id", "direction": "DESC"}],
                "pagination": {"index": 1, "size": 10}}), tenant_id="t1")
            self.assertEqual((page.total, [d["aggregateId"] for d in page.list]), (2, [ids[2], ids[1]]))
            streams = runtime.event_queries("order")
            self.assertEqual(streams.count(parse_count_query({}), tenant_id="t2"), 1)


class TestForkedChildren(OnPostgreSQL, TransactionTestCase):
    """gunicorn --preload, Celery prefork: a child must neither use nor end the parent's database session."""

    def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_session_alone(self):
        from wow_django.backends.django import connection as django_connection

        parent = connections["wow_pg"]
        with parent.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            parent_pid = cursor.fetchone()[0]

        def probe():
            forgotten = parent.connection is None
            parent.close()  # what Celery's Django fixup and close_old_connections do in a new child
            with parent.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                child_pid = cursor.fetchone()[0]
            parent.close()
            for raw in django_connection._inherited:  # even closing the inherited driver connection...
                raw.close()  # ...sends its goodbye to /dev/null, not to the parent's session
            return forgotten, child_pid != parent_pid

        self.assertEqual(in_forked_child(probe), (True, True))
        with parent.cursor() as cursor:  # the parent's session survived the child, on the same connection
            cursor.execute("SELECT pg_backend_pid()")
            self.assertEqual(cursor.fetchone()[0], parent_pid)


def test_a_forked_child_does_not_inherit_a_held_sqlite_writer_lock():
    from wow_django.backends.django import connection as django_connection

    held, release = threading.Event(), threading.Event()

    def hold():
        with django_connection.sqlite_writer(connections["wow_sqlite"]):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    try:
        def probe():
            writer = threading.Thread(target=lambda: django_connection.sqlite_writer(connections["wow_sqlite"])
                                      .__enter__(), daemon=True)
            writer.start()
            writer.join(2)
            return (not writer.is_alive(),)

        assert in_forked_child(probe) == (True,)
    finally:
        release.set()
        holder.join()

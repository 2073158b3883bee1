"""What the django bus store does beyond the contract: its tables, error mapping, values and locking.

The contract itself runs in test_bus_store_conformance.py; these cases need a
real server (a terminated PostgreSQL backend, a held row lock, a locked SQLite
file) or the store's own configuration.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import InternalError, OperationalError, ProgrammingError, connections, transaction
from django.test import SimpleTestCase, TransactionTestCase, override_settings

from wow_django.backends.django.bus_store import EVENTS, DjangoBusStore
from wow_django.backends.django.connection import SQLITE_BUSY_TIMEOUT_MS, database
from wow_django.backends.django.errors import is_recoverable
from wow_django.backends.memory.bus_store import InMemoryBusStore
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.bus import EventQuery
from wow_django.testing.bus_store import T0, make_event


class DjangoBusStoreConfigurationTests(SimpleTestCase):
    def test_without_the_bus_app_the_store_says_which_app_to_install(self):
        apps = [app for app in settings.INSTALLED_APPS if app != "wow_django.bus"]
        with override_settings(INSTALLED_APPS=apps):
            with self.assertRaisesMessage(ImproperlyConfigured, "add 'wow_django.bus' to INSTALLED_APPS"):
                DjangoBusStore()

    def test_an_unknown_database_alias_is_named(self):
        with self.assertRaisesMessage(ImproperlyConfigured, "database 'nowhere', which is not in settings.DATABASES"):
            DjangoBusStore(using="nowhere")


def driver_error(cause: BaseException, wrapper=OperationalError) -> BaseException:
    """A Django database error raised from ``cause``, as Django's error wrapper raises it."""
    error = wrapper(str(cause))
    error.__cause__ = cause
    return error


class RecoverableErrorTests(SimpleTestCase):
    def test_transient_driver_errors_are_recoverable(self):
        for cause in (psycopg.errors.SerializationFailure("could not serialize access"),
                      psycopg.errors.DeadlockDetected("deadlock detected"),
                      psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
                      psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
                      psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
                      psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
                      sqlite3.OperationalError("database is locked")):
            with self.subTest(cause=type(cause).__name__):
                self.assertTrue(is_recoverable(driver_error(cause)))
        # A primary turned standby after a failover, an idle transaction's timeout (InternalError in psycopg).
        for cause in (psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
                      psycopg.errors.IdleInTransactionSessionTimeout("terminating connection due to idle-in-"
                                                                     "transaction timeout")):
            with self.subTest(cause=type(cause).__name__):
                self.assertTrue(is_recoverable(driver_error(cause, InternalError)))

    def test_other_errors_are_not(self):
        for error in (driver_error(sqlite3.OperationalError("no such table: wow_bus_event")),
                      driver_error(psycopg.errors.UndefinedTable('relation "x" does not exist'), ProgrammingError),
                      driver_error(psycopg.errors.DiskFull("could not extend file")),
                      OperationalError("no driver error")):
            with self.subTest(error=str(error)):
                self.assertFalse(is_recoverable(error))


class StoreCase(TransactionTestCase):
    alias = "wow_sqlite"

    def setUp(self) -> None:
        super().setUp()
        self.store = DjangoBusStore(using=self.alias)

    def cursor(self):
        return connections[self.alias].cursor()


class ValuesAndTables:
    """Cases run on both databases (a mixin of :class:`StoreCase`)."""

    def test_json_parts_keep_datetimes_tuples_and_dicts_that_look_like_tags(self):
        moment = datetime(2024, 2, 28, 10, 0, 0, 123456)
        payload = {"at": moment, "pair": (1, 2), "tag": {"$date": "not a date"}, "literal": {"$literal": 1},
                   "nested": [{"at": moment}], "big": 2**62, "ratio": 0.5, "none": None}
        event = make_event("evt-json", payload=payload, custom={"since": moment}, note="kept as given")
        self.assertTrue(self.store.insert_event(event))
        stored = self.store.get_event("evt-json")
        ms = moment.replace(microsecond=123000)
        self.assertEqual(stored["payload"], {**payload, "at": ms, "pair": [1, 2], "nested": [{"at": ms}]})
        self.assertEqual((stored["custom"], stored["note"]), ({"since": ms}, "kept as given"))
        self.assertEqual(self.store.get_event("evt-json", fields=("note", "status")),
                         {"note": "kept as given", "status": "PENDING"})

    def test_aware_datetimes_are_stored_as_naive_utc(self):
        plus_two = timezone(timedelta(hours=2))
        self.store.insert_event(make_event("evt-tz", occurred_at=datetime(2024, 2, 28, 12, 0, tzinfo=plus_two)))
        self.assertEqual(self.store.get_event("evt-tz", fields=["occurredAt"]), {"occurredAt": T0})
        self.assertEqual([e["eventId"] for e in self.store.trace_events("trace-1", 10)], ["evt-tz"])
        self.assertEqual(self.store.stale_pending(datetime(2024, 2, 28, 10, 0, tzinfo=UTC), 10), ["evt-tz"])

    def test_time_order_puts_a_missing_time_first_and_ties_in_code_point_order_as_the_memory_store_does(self):
        memory = InMemoryBusStore()
        events = [make_event(event_id, trace_id="trace-n", occurred_at=moment) for event_id, moment in (
            ("evt-a", T0), ("evt-none", None), ("evt-B", T0), ("evt-_", T0), ("evt-later", T0 + timedelta(seconds=1)),
            ("evt-é", T0))]
        for event in events:
            self.store.insert_event(event)
            memory.insert_event(event)

        def ids(found):
            return [e["eventId"] for e in found]

        self.assertEqual(ids(self.store.trace_events("trace-n", 10)),
                         ["evt-none", "evt-B", "evt-_", "evt-a", "evt-é", "evt-later"])
        self.assertEqual(ids(self.store.trace_events("trace-n", 10)), ids(memory.trace_events("trace-n", 10)))
        for skip in (0, 2):
            self.assertEqual(ids(self.store.find_events(EventQuery(trace_id="trace-n"), skip=skip, limit=3)[1]),
                             ids(memory.find_events(EventQuery(trace_id="trace-n"), skip=skip, limit=3)[1]))

    def test_a_value_that_does_not_fit_its_column_is_refused_by_name_and_nothing_is_stored(self):
        with self.assertRaisesMessage(TypeError, "'retryCount' must be an integer or None, got str"):
            self.store.insert_event(make_event("evt-bad", retryCount="3"))
        with self.assertRaisesMessage(TypeError, "'occurredAt' must be a datetime or None, got str"):
            self.store.insert_event(make_event("evt-bad", occurred_at="2024-02-28T10:00:00Z"))
        with self.assertRaisesMessage(ValueError, "needs 'eventId'"):
            self.store.insert_event({"topic": "order.purchased"})
        self.assertIsNone(self.store.get_event("evt-bad"))

    def test_a_duplicate_inside_the_callers_transaction_leaves_that_transaction_usable(self):
        with transaction.atomic(using=self.alias):
            self.assertTrue(self.store.insert_event(make_event("evt-tx")))
            self.assertFalse(self.store.insert_event(make_event("evt-tx")))
            self.store.init_consumptions("evt-tx", ["member-service"], T0)
            self.assertTrue(self.store.inbox_insert("member-service", "evt-tx", owner="w1", now=T0, lease_until=T0))
            self.assertFalse(self.store.inbox_insert("member-service", "evt-tx", owner="w2", now=T0, lease_until=T0))
            self.assertEqual(self.store.get_event("evt-tx", fields=["status"]), {"status": "PENDING"})
        self.assertEqual(self.store.latest_consumption("evt-tx", "member-service")["attemptNo"], 0)

    def test_a_missing_bus_table_says_to_migrate(self):
        with self.cursor() as cursor:
            cursor.execute("ALTER TABLE wow_bus_event RENAME TO wow_bus_event_away")
        try:
            with self.assertRaisesMessage(ImproperlyConfigured, f"manage.py migrate wow_bus --database {self.alias}"):
                self.store.get_event("evt-1")
        finally:
            with self.cursor() as cursor:
                cursor.execute("ALTER TABLE wow_bus_event_away RENAME TO wow_bus_event")
        self.assertIsNone(self.store.get_event("evt-1"))

    def test_tables_and_constraint_names_are_pinned(self):
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            tables = {t for t in connection.introspection.table_names(cursor) if t.startswith("wow_bus_")}
            names = {table: set(connection.introspection.get_constraints(cursor, table)) for table in tables}
        self.assertEqual(tables, {"wow_bus_event", "wow_bus_topic_consumer", "wow_bus_consumption", "wow_bus_inbox",
                                  "wow_bus_sequence", "wow_bus_repush", "wow_bus_event_key"})
        self.assertLessEqual({"wow_bus_event_id_uniq", "wow_bus_event_status_at", "wow_bus_event_status_occ",
                              "wow_bus_event_topic_occ", "wow_bus_event_trace_occ", "wow_bus_event_service_occ",
                              "wow_bus_event_parent_occ", "wow_bus_event_occ", "wow_bus_event_user_occ",
                              "wow_bus_event_request_occ"}, names["wow_bus_event"])
        self.assertIn("wow_bus_topic_consumer_uniq", names["wow_bus_topic_consumer"])
        self.assertLessEqual({"wow_bus_attempt_uniq", "wow_bus_consumer_consumed"}, names["wow_bus_consumption"])
        self.assertIn("wow_bus_inbox_uniq", names["wow_bus_inbox"])
        self.assertIn("wow_bus_sequence_uniq", names["wow_bus_sequence"])
        self.assertIn("wow_bus_repush_event_at", names["wow_bus_repush"])
        self.assertLessEqual({"wow_bus_event_key_uniq", "wow_bus_event_key_listing", "wow_bus_event_key_event"},
                             names["wow_bus_event_key"])


def bulk_create_failing_for(model):
    """``QuerySet.bulk_create`` raising for ``model``'s rows (as a full disk would), the others stored."""
    from unittest import mock

    from django.db.models.query import QuerySet

    real = QuerySet.bulk_create

    def bulk_create(queryset, objs, *args, **kwargs):
        if queryset.model is model:
            raise RuntimeError("disk full")
        return real(queryset, objs, *args, **kwargs)

    return mock.patch.object(QuerySet, "bulk_create", autospec=True, side_effect=bulk_create)


class EventKeysTogether:
    """An event and its search keys are stored together or not at all."""

    def test_an_event_whose_keys_cannot_be_stored_is_not_stored(self):
        from wow_django.backends.django.bus_models import EventKeyRecord

        with bulk_create_failing_for(EventKeyRecord), self.assertRaises(RuntimeError):
            self.store.insert_event(make_event("evt-k", searchKeys=["orderId=o-1"]))
        self.assertIsNone(self.store.get_event("evt-k"))
        self.assertTrue(self.store.insert_event(make_event("evt-k", searchKeys=["orderId=o-1"])))
        self.assertFalse(self.store.insert_event(make_event("evt-k", searchKeys=["orderId=o-2"])))  # a duplicate
        self.assertEqual(self.store.find_events(EventQuery(keys=("orderId=o-2",)), skip=0, limit=5), (0, []))

    def test_an_event_whose_pending_rows_cannot_be_stored_is_not_stored(self):
        from wow_django.backends.django.bus_models import ConsumptionRecord

        event = make_event("evt-r", consumers=["member-service"], searchKeys=["orderId=o-1"])
        with bulk_create_failing_for(ConsumptionRecord), self.assertRaises(RuntimeError):
            self.store.insert_event_with_consumptions(event, T0)
        self.assertIsNone(self.store.get_event("evt-r"))  # one transaction: the event went with its rows
        self.assertEqual(self.store.find_events(EventQuery(keys=("orderId=o-1",)), skip=0, limit=5), (0, []))
        self.assertTrue(self.store.insert_event_with_consumptions(event, T0))
        self.assertEqual([r["consumerId"] for r in self.store.consumption_rows(["evt-r"])], ["member-service"])

class DjangoBusStoreOnSQLiteTests(EventKeysTogether, ValuesAndTables, StoreCase):
    alias = "wow_sqlite"
    databases = {"wow_sqlite"}

    def test_a_locked_database_is_a_recoverable_error_and_the_store_works_after_it(self):
        self.store.insert_event(make_event("evt-1"))
        with self.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 50")  # this connection's wait for the lock
        other = sqlite3.connect(connections[self.alias].settings_dict["NAME"], isolation_level=None)
        try:
            other.execute("BEGIN EXCLUSIVE")
            with self.assertRaisesMessage(RecoverableStoreError, "retrying may succeed"):
                self.store.set_status_if("evt-1", "PENDING", 0, "SENT", T0)
            other.execute("ROLLBACK")
        finally:
            other.close()
            connections[self.alias].close()  # the next connection has the default busy timeout again
        self.assertTrue(self.store.set_status_if("evt-1", "PENDING", 0, "SENT", T0))

    def test_every_connection_of_the_store_is_in_wal_mode_with_a_busy_timeout(self):
        def pragmas() -> tuple[str, int]:
            raw = database(self.alias).connection
            return raw.execute("PRAGMA journal_mode").fetchone()[0], raw.execute("PRAGMA busy_timeout").fetchone()[0]

        in_thread: list[tuple] = []

        def other_thread() -> None:  # a new connection, opened by the store
            self.store.get_event("evt-1")
            in_thread.append(pragmas())

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        self.assertEqual(in_thread, [("wal", SQLITE_BUSY_TIMEOUT_MS)])
        connections[self.alias].close()
        self.store.get_event("evt-1")
        self.assertEqual(pragmas(), ("wal", SQLITE_BUSY_TIMEOUT_MS))

    def test_naive_datetimes_round_trip_without_time_zone_support(self):
        with override_settings(USE_TZ=False):
            self.store.insert_event(make_event("evt-naive", occurred_at=datetime(2024, 2, 28, 10, 0, 0, 5999)))
            self.assertEqual(self.store.get_event("evt-naive", fields=["occurredAt"]),
                             {"occurredAt": datetime(2024, 2, 28, 10, 0, 0, 5000)})
            self.assertEqual(self.store.stale_pending(T0 + timedelta(seconds=1), 10), ["evt-naive"])


class DjangoBusStoreOnPostgreSQLTests(EventKeysTogether, ValuesAndTables, StoreCase):
    alias = "wow_pg"
    databases = {"wow_pg"}

    def test_an_unfiltered_list_of_a_large_table_is_counted_by_the_planners_estimate(self):
        for n in range(3):
            self.store.insert_event(make_event(f"evt-est-{n}", status="SENT" if n else "PENDING"))
        with self.cursor() as cursor:
            cursor.execute("ANALYZE wow_bus_event")
        self.assertEqual(self.store._estimated_events(), 3)
        self.assertEqual(self.store.find_events(EventQuery(), skip=0, limit=2)[0], 3)  # small: exact
        self.store._estimated_events = lambda: 2_000_000  # as the planner says of a large table
        total, page = self.store.find_events(EventQuery(), skip=0, limit=2)
        self.assertEqual((total, len(page)), (2_000_000, 2))  # no count of every row
        self.assertEqual(self.store.find_events(EventQuery(status="SENT"), skip=0, limit=2)[0], 2)  # filtered: exact

    def other_connection(self):
        """A connection of its own to the test database, outside Django's handler."""
        connection = connections[self.alias]
        raw = connection.get_new_connection(connection.get_connection_params())
        raw.autocommit = True
        self.addCleanup(raw.close)
        return raw

    def backend_pid(self) -> int:
        with self.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    def wait_for_a_lock_wait(self) -> None:
        """Until a backend of the test database waits for a lock (read outside a transaction: fresh statistics)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock'")
                if cursor.fetchone()[0]:
                    return
            time.sleep(0.01)
        self.fail("no backend waited for the row lock")

    def test_a_terminated_backend_is_a_recoverable_error_and_the_store_works_after_it(self):
        self.store.insert_event(make_event("evt-1"))
        pid = self.backend_pid()
        self.other_connection().execute("SELECT pg_terminate_backend(%s)", (pid,))
        with self.assertRaisesMessage(RecoverableStoreError, "reading event evt-1 failed on database 'wow_pg'"):
            self.store.get_event("evt-1")
        self.assertEqual(self.store.get_event("evt-1", fields=["eventId"]), {"eventId": "evt-1"})
        self.assertNotEqual(self.backend_pid(), pid)  # a new connection

    def test_worker_threads_close_their_connections_when_they_end(self):
        """Consumer and relay threads come and go: each closes the connection it used when it ends."""
        def sessions() -> int:
            with self.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid()")
                return cursor.fetchone()[0]

        self.store.insert_event(make_event("evt-1"))
        before = sessions()
        barrier = threading.Barrier(6, timeout=60)
        # A connection the cyclic garbage collector frees would close late or never: only closing counts here.
        gc.disable()
        self.addCleanup(gc.enable)
        opened: list[bool] = []

        def worker() -> None:
            self.store.get_event("evt-1")
            opened.append(connections[self.alias].connection is not None)
            barrier.wait(10)  # all six hold a connection at once

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        self.assertEqual(opened, [True] * 6)
        deadline = time.monotonic() + 5
        while sessions() != before and time.monotonic() < deadline:  # a backend leaves after its client
            time.sleep(0.02)
        self.assertEqual(sessions(), before)

    def test_a_lock_timeout_is_a_recoverable_error(self):
        self.store.insert_event(make_event("evt-1", status="SENT"))
        raw = self.other_connection()
        with self.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        try:
            with raw.transaction():
                raw.execute("SELECT 1 FROM wow_bus_event WHERE event_id = 'evt-1' FOR UPDATE")
                with self.assertRaisesMessage(RecoverableStoreError, "lock timeout"):
                    self.store.set_status_if("evt-1", "SENT", 0, "FAILED", T0)
        finally:
            with self.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        self.assertTrue(self.store.set_status_if("evt-1", "SENT", 0, "FAILED", T0))

    def test_a_conditional_write_waiting_for_a_row_rechecks_its_condition_on_the_committed_row(self):
        self.store.insert_event(make_event("evt-1", status="SENT"))
        raw = self.other_connection()
        outcome: list[bool] = []
        with raw.transaction():
            # Another writer's status write (what set_status_if does), not yet committed.
            raw.execute("UPDATE wow_bus_event SET status = 'FAILED', status_revision = 1, absent = absent & %s "
                        "WHERE event_id = 'evt-1'", (EVENTS.full & ~EVENTS.bits["statusRevision"],))
            writer = threading.Thread(target=lambda: outcome.append(
                self.store.set_status_if("evt-1", "SENT", 0, "PARTIAL", T0)))
            writer.start()
            self.wait_for_a_lock_wait()  # the writer's UPDATE waits for the row: truly concurrent
        writer.join(10)
        self.assertEqual(outcome, [False])
        self.assertEqual(self.store.get_event("evt-1", fields=("status", "statusRevision")),
                         {"status": "FAILED", "statusRevision": 1})

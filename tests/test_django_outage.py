"""The django storage backend on PostgreSQL while the database goes away, for real (no mocked database).

Sessions are ended with ``pg_terminate_backend`` from an administrator
connection of the test's own database, and a total outage is the database
refusing connections (``ALTER DATABASE … ALLOW_CONNECTIONS false``) with its
sessions terminated. The contract checked:

* a store: the call that meets a dead session raises ``RecoverableStoreError``
  (the store never retries on its own: a write whose outcome is unknown is the
  caller's to retry), and the next call works on a new connection — inside a
  caller's ``transaction.atomic`` as well once that block is left; nothing is
  half-written;
* the gateway: a command either succeeds or raises ``RecoverableStoreError``
  after its retries; every success is stored exactly once, and a failed
  command sent again with its request id completes without a duplicate;
* the API: only 2xx or 503 (``STORE_UNAVAILABLE``, ``Retry-After``), never a 500,
  for commands and for reads.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import psycopg
from django.db import connections, transaction
from django.test import TransactionTestCase

from wow_django.application.queries import parse_count_query, parse_paged_query
from wow_django.backends.django.bus_store import DjangoBusStore
from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.models import EventStreamRow
from wow_django.backends.django.prepare_key import DjangoPrepareKey
from wow_django.backends.django.queries import DjangoEventStreamQueryService, DjangoSnapshotQueryService
from wow_django.backends.django.snapshot_store import DjangoSnapshotStore
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.bus import EventQuery
from wow_django.persistence.records import AggregateId
from wow_django.testing import make_snapshot, make_stream
from wow_django.testing.bus_store import T0, make_event

ALIAS = "wow_pg"


def pg_admin() -> psycopg.Connection:
    """An administrator's connection to the test database, past Django (its sessions are never terminated)."""
    settings = connections[ALIAS].settings_dict
    return psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                           password=settings["PASSWORD"] or None, dbname=settings["NAME"], autocommit=True)


def terminate_sessions(admin: psycopg.Connection, pids: list[int] | None = None) -> int:
    """End the sessions of the test database (all but ``admin``'s, or only ``pids``); how many ended."""
    sql = ("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    params: list = []
    if pids is not None:
        sql += " AND pid = ANY(%s)"
        params.append(pids)
    return admin.execute(sql, params).fetchone()[0]


def own_pid() -> int:
    """The server process of this thread's Django connection to the test database (connected if need be)."""
    connection = connections[ALIAS]
    connection.ensure_connection()
    return connection.connection.info.backend_pid


def kill_own_session(admin: psycopg.Connection) -> None:
    pid = own_pid()
    assert terminate_sessions(admin, [pid]) == 1
    # The server process leaves after the signal: wait, so the next statement surely meets a dead session.
    deadline = time.monotonic() + 5
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
        assert time.monotonic() < deadline, f"backend {pid} did not end"
        time.sleep(0.005)


def agg(name: str = "order") -> AggregateId:
    return AggregateId(name, uuid.uuid4().hex, "test-context", "tenant-a")


class OnPostgreSQL:
    databases = {"default", ALIAS}
    available_apps = ["wow_django", "wow_django.bus"]

    def setUp(self) -> None:
        super().setUp()
        self.admin = pg_admin()
        self.addCleanup(self.admin.close)
        self.addCleanup(connections[ALIAS].close)  # a failed test may leave a dead session: not for the flush


# --- store level ---------------------------------------------------------------------------------------------


class TestStoresOnADeadSession(OnPostgreSQL, TransactionTestCase):
    """Each operation meets a terminated session once: RecoverableStoreError, then the same call works."""

    def check(self, call, *, partial=None):
        """``call`` on a dead session raises RecoverableStoreError (``partial`` reports it in a result); then works."""
        kill_own_session(self.admin)
        if partial is None:
            with self.assertRaisesRegex(RecoverableStoreError, "retry"):
                call()
        else:
            partial(call())
        before = own_pid()  # a new session: ensure_connection opened it
        result = call()
        self.assertEqual(own_pid(), before)
        return result

    def test_event_store(self):
        store = DjangoEventStore(using=ALIAS)
        a = agg()
        first = make_stream(a, 1, request_id="req-1")
        store.append(first)
        second = make_stream(a, 2, request_id="req-2")
        self.check(lambda: store.append(second))
        self.assertEqual(store.load(a), [first, second])  # stored once, by the retry
        self.assertEqual(self.check(lambda: store.load(a)), [first, second])
        self.assertEqual(self.check(lambda: store.last(a)), second)
        self.assertEqual(self.check(lambda: store.get_by_request_id(a, "req-2")), second)
        self.assertTrue(self.check(lambda: store.exists_request_id("order", "req-1")))
        self.assertEqual(self.check(lambda: store.load_by_time(a, 0, 2**62)), [first, second])
        self.assertEqual(self.check(lambda: [x.id for x in store.scan_aggregate_ids("order")]), [a.id])
        batch = [make_stream(agg(), 1), make_stream(a, 3)]

        def all_recoverable(results):
            self.assertEqual(len(results), 2)
            for result in results:
                self.assertIsInstance(result, RecoverableStoreError)

        self.assertEqual(self.check(lambda: store.append_many(batch), partial=all_recoverable), [None, None])
        self.assertEqual(store.load(a), [first, second, batch[1]])
        self.assertEqual(store.load(batch[0].aggregate_id), [batch[0]])

    def test_event_store_batches_stream_by_stream(self):
        store = DjangoEventStore(using=ALIAS)
        store.one_statement = False  # one transaction with a savepoint per stream
        batch = [make_stream(agg(), 1), make_stream(agg(), 1)]

        def nothing_stored(results):
            self.assertTrue(all(isinstance(r, RecoverableStoreError) for r in results), results)
            self.assertEqual(EventStreamRow.objects.using(ALIAS).count(), 0)

        self.assertEqual(self.check(lambda: store.append_many(batch), partial=nothing_stored), [None, None])
        self.assertEqual(EventStreamRow.objects.using(ALIAS).count(), 2)

    def test_snapshot_store(self):
        store = DjangoSnapshotStore(using=ALIAS)
        a = agg()
        self.check(lambda: store.save(make_snapshot(a, 3)))
        self.assertEqual(self.check(lambda: store.load(a)).version, 3)

    def test_prepare_key(self):
        keys = DjangoPrepareKey("username", using=ALIAS)
        self.assertTrue(self.check(lambda: keys.prepare("alice", "v1")))
        self.assertEqual(self.check(lambda: keys.get("alice")).value, "v1")
        self.assertTrue(self.check(lambda: keys.reprepare("alice", "v2", old_value="v1")))
        self.assertTrue(self.check(lambda: keys.rollback("alice", "v2")))
        self.assertIsNone(keys.get("alice"))

    def test_bus_store(self):
        store = DjangoBusStore(using=ALIAS)
        event = make_event()
        self.assertTrue(self.check(lambda: store.insert_event(event)))
        self.assertEqual(self.check(lambda: store.get_event(event["eventId"]))["eventId"], event["eventId"])
        leased = self.check(lambda: store.lease_for_relay(event["eventId"], T0, T0))
        self.assertIsNotNone(leased)
        total, found = self.check(lambda: store.find_events(EventQuery(), skip=0, limit=10))
        self.assertEqual((total, [e["eventId"] for e in found]), (1, [event["eventId"]]))
        self.check(lambda: store.set_topic_consumer("order.purchased", "member-service", enabled=True,
                                                    description=None, updated_by="ops"))
        self.assertEqual(store.enabled_consumers("order.purchased"), ["member-service"])

    def test_query_services(self):
        events = DjangoEventStore(using=ALIAS)
        snapshots = DjangoSnapshotStore(using=ALIAS)
        a = agg()
        events.append(make_stream(a, 1))
        snapshots.save(make_snapshot(a, 1))
        snapshot_queries = DjangoSnapshotQueryService(snapshots, "order")
        stream_queries = DjangoEventStreamQueryService(events, "order")
        self.assertEqual(self.check(lambda: snapshot_queries.count(parse_count_query({}))), 1)
        page = self.check(lambda: stream_queries.paged(parse_paged_query({})))
        self.assertEqual(page.total, 1)

    def test_inside_a_callers_transaction(self):
        """The caller's transaction is lost with its session: each call in it is recoverable; after it, all works."""
        store = DjangoEventStore(using=ALIAS)
        a = agg()
        first = make_stream(a, 1)
        with self.assertRaisesRegex(RecoverableStoreError, "retry"):
            with transaction.atomic(using=ALIAS):
                store.append(first)
                kill_own_session(self.admin)
                with self.assertRaisesRegex(RecoverableStoreError, "retry"):
                    store.append(make_stream(a, 2))
                store.load(a)  # still the dead session: recoverable too, and it leaves the block
        self.assertFalse(connections[ALIAS].in_atomic_block)
        dead = own_pid()
        self.assertEqual(store.load(a), [])  # nothing of the lost transaction is stored
        store.append(first)
        self.assertEqual(store.load(a), [first])
        self.assertEqual(own_pid(), dead)

    def test_killed_inside_the_stores_savepoint(self):
        """Killed while its statement waits inside the store's savepoint: Django marks the caller's block for
        rollback; every later call in the block is recoverable (not a TransactionManagementError)."""
        store = DjangoEventStore(using=ALIAS)
        keys = DjangoPrepareKey("username", using=ALIAS)
        a = agg()
        with self.assertRaisesRegex(RecoverableStoreError, "retry"):
            with transaction.atomic(using=ALIAS):
                self.assertTrue(keys.prepare("bob", "v"))  # the block's first write is not on the locked table
                with killed_while_waiting(self.admin, EventStreamRow._meta.db_table, own_pid()):
                    with self.assertRaisesRegex(RecoverableStoreError, "retry"):
                        store.append(make_stream(a, 2))  # SAVEPOINT, then the INSERT waits on the lock
                self.assertTrue(connections[ALIAS].needs_rollback)
                with self.assertRaisesRegex(RecoverableStoreError, "retry"):
                    keys.prepare("alice", "v")
                store.load(a)
        self.assertEqual(store.load(a), [])
        self.assertIsNone(keys.get("bob"))
        self.assertTrue(keys.prepare("alice", "v"))


@contextlib.contextmanager
def killed_while_waiting(admin: psycopg.Connection, table: str, pid: int):
    """Lock ``table`` on a second administrator session; the first statement of session ``pid`` that waits on the
    lock gets its session terminated (by a thread, as the statement blocks its own)."""
    settings = connections[ALIAS].settings_dict
    locker = psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                             password=settings["PASSWORD"] or None, dbname=settings["NAME"])
    locker.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
    done = threading.Event()
    killed: list[int] = []

    def kill_when_waiting() -> None:
        while not done.is_set():
            waiting = admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                                    [pid]).fetchone()
            if waiting:
                killed.append(terminate_sessions(admin, [pid]))
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_when_waiting, name="killer")
    killer.start()
    try:
        yield
    finally:
        done.set()
        killer.join()
        locker.close()
    assert killed == [1], killed

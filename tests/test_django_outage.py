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
* the API: only 2xx or 503 (``StoreUnavailable``, ``Retry-After``), never a 500,
  for commands and for reads.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

import psycopg
from django.db import connections, transaction
from django.test import TransactionTestCase, override_settings
from psycopg import sql

from sample_project.orders.aggregates import CancelOrder, OrderLine, PlaceOrder
from wow_django.application.gateway import CommandResult, derived_aggregate_id
from wow_django.application.queries import parse_count_query, parse_paged_query
from wow_django.application.runtime import get_runtime
from wow_django.backends.django.bus_store import DjangoBusStore
from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.models import EventStreamRow
from wow_django.backends.django.prepare_key import DjangoPrepareKey
from wow_django.backends.django.queries import DjangoEventStreamQueryService, DjangoSnapshotQueryService
from wow_django.backends.django.snapshot_store import DjangoSnapshotStore
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.batching import BatchingEventStore
from wow_django.persistence.bus import EventQuery
from wow_django.persistence.records import DEFAULT_TENANT_ID, AggregateId
from wow_django.testing import make_snapshot, make_stream
from wow_django.testing.bus_store import T0, make_event

ALIAS = "wow_pg"


#: The application name of the tests' administrator sessions, which are never terminated.
ADMIN = "wow-outage-admin"


def pg_admin(**kwargs) -> psycopg.Connection:
    """An administrator's connection to the test database (or ``dbname``), past Django."""
    settings = connections[ALIAS].settings_dict
    options = {"host": settings["HOST"], "port": settings["PORT"], "user": settings["USER"],
               "password": settings["PASSWORD"] or None, "dbname": settings["NAME"], "application_name": ADMIN,
               "autocommit": True}
    return psycopg.connect(**{**options, **kwargs})


def terminate_sessions(admin: psycopg.Connection, pids: list[int] | None = None) -> int:
    """End the sessions of the test database (all but the administrators', or only ``pids``); how many ended."""
    query = ("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
             "WHERE datname = current_database() AND application_name <> %s")
    params: list = [ADMIN]
    if pids is not None:
        query += " AND pid = ANY(%s)"
        params.append(pids)
    return admin.execute(query, params).fetchone()[0]


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
    locker = pg_admin(autocommit=False)
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


# --- outages --------------------------------------------------------------------------------------------------


class SessionKiller:
    """A thread terminating every session of the test database but its own, again and again, until stopped.

    ``terminated`` counts the sessions it ended. Bounded: it stops by itself after ``limit_s``.
    """

    def __init__(self, *, pause_s: tuple[float, float] = (0.01, 0.05), limit_s: float = 20.0):
        self.pause_s = pause_s
        self.limit_s = limit_s
        self.terminated = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="session-killer", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        try:
            with pg_admin() as admin:
                while not self._stop.is_set() and time.monotonic() < deadline:
                    self.terminated += terminate_sessions(admin)
                    self._stop.wait(random.uniform(*self.pause_s))
        except BaseException as exc:  # reported by __exit__
            self.errors.append(exc)

    def __enter__(self) -> SessionKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the session killer did not stop"
        assert not self.errors, self.errors


@contextlib.contextmanager
def database_down():
    """The test database refuses connections and its sessions are ended: a total outage, until the block ends."""
    test_database = connections[ALIAS].settings_dict["NAME"]
    name = sql.Identifier(test_database)
    with pg_admin(dbname="postgres") as admin:  # a database may not refuse the session that changes it
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                          "AND application_name <> %s", [test_database, ADMIN])
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))


def session_pid() -> int | None:
    """The server process of this thread's current Django connection (dead or alive), without connecting."""
    raw = connections[ALIAS].connection
    return None if raw is None else raw.info.backend_pid


def in_threads(count: int, target) -> None:
    """``target(index)`` in the main thread (index 0) and ``count - 1`` more, each thread on its own Django
    connection; all joined before returning."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"outage-worker-{i}") for i in range(1, count)]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a worker did not finish"
    assert not errors, errors


ITEMS = [OrderLine(sku="A-1", quantity=2, unit_price=Decimal("3.50"))]


@dataclass
class Sent:
    """What one request id was sent for, and how it ended the first time."""

    request_id: str
    command: object
    aggregate_id: str | None
    result: CommandResult | None = None
    error: BaseException | None = None
    met_a_termination: bool = False


@dataclass
class Ledger:
    sent: dict[str, Sent] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, entry: Sent) -> None:
        with self.lock:
            assert entry.request_id not in self.sent
            self.sent[entry.request_id] = entry

    def succeeded(self) -> list[Sent]:
        return [e for e in self.sent.values() if e.result is not None]

    def failed(self) -> list[Sent]:
        return [e for e in self.sent.values() if e.error is not None]


def send_through_gateway(ledger: Ledger, request_id: str, command, aggregate_id: str | None = None) -> Sent:
    """Send once; a RecoverableStoreError is an allowed outcome, anything else fails the test."""
    entry = Sent(request_id, command, aggregate_id)
    before = session_pid()
    try:
        entry.result = get_runtime().gateway.send(command, aggregate_id=aggregate_id, request_id=request_id)
    except RecoverableStoreError as exc:
        entry.error = exc
    else:
        assert entry.result.succeeded and not entry.result.duplicate, entry.result
        entry.met_a_termination = before is not None and session_pid() != before
    ledger.add(entry)
    return entry


def check_stored_once(test: TransactionTestCase, ledger: Ledger) -> set[str]:
    """Every success stored once as reported; every aggregate's versions contiguous; no request id twice.

    The request ids stored (each success's, and perhaps a failure's whose write landed).
    """
    connections[ALIAS].close()  # this thread's session may have been terminated: read on a new one
    rows = list(EventStreamRow.objects.using(ALIAS).values_list("aggregate_id", "version", "request_id",
                                                                 "command_id"))
    request_ids = Counter(request_id for _, _, request_id, _ in rows)
    test.assertEqual([r for r, n in request_ids.items() if n > 1], [])
    by_aggregate: dict[str, list[int]] = {}
    for aggregate_id, version, _, _ in rows:
        by_aggregate.setdefault(aggregate_id, []).append(version)
    for aggregate_id, versions in by_aggregate.items():
        test.assertEqual(sorted(versions), list(range(1, len(versions) + 1)), aggregate_id)
    stored = {request_id: (aggregate_id, version, command_id) for aggregate_id, version, request_id, command_id in rows}
    test.assertLessEqual(set(stored), set(ledger.sent))
    for entry in ledger.succeeded():
        result = entry.result
        test.assertEqual(stored.get(entry.request_id), (result.aggregate_id, result.aggregate_version,
                                                        result.command_id), entry.request_id)
    return set(stored)


def place_order(request_id: str) -> PlaceOrder:
    return PlaceOrder(customer_id=f"c-{request_id}", items=ITEMS)


def cancel_order(request_id: str) -> CancelOrder:
    return CancelOrder(reason=f"r-{request_id}")


WOW = {"CONTEXT_NAME": "order-service", "STORAGE": "django", "DATABASE_ALIAS": ALIAS,
       "COMMAND_RETRY_LIMIT": 8, "COMMAND_RETRY_BACKOFF_MS": 1.0}


@override_settings(WOW=WOW)
class TestGatewayDuringAnOutage(OnPostgreSQL, TransactionTestCase):
    def test_commands_while_sessions_are_terminated(self):
        self.commands_while_sessions_are_terminated()

    @override_settings(WOW={**WOW, "EVENT_STORE_BATCH": {"ENABLED": True, "LANE_COUNT": 2}})
    def test_batched_appends_while_sessions_are_terminated(self):
        """The same through the batching event store: its lanes append on connections of their own threads."""
        self.assertIsInstance(get_runtime().event_store, BatchingEventStore)
        self.commands_while_sessions_are_terminated()

    def commands_while_sessions_are_terminated(self):
        ledger = Ledger()
        outage_s = 2.5

        def work(tag: str) -> None:
            deadline = time.monotonic() + outage_s
            n = 0
            while time.monotonic() < deadline:
                n += 1
                placed = send_through_gateway(ledger, f"{tag}-{n}-place", place_order(f"{tag}-{n}"))
                if placed.result is not None:
                    send_through_gateway(ledger, f"{tag}-{n}-cancel", cancel_order(f"{tag}-{n}"),
                                         placed.result.aggregate_id)

        with SessionKiller() as killer:
            in_threads(4, lambda i: work(f"w{i}"))  # the main thread and three workers
        self.assertGreater(killer.terminated, 0)
        succeeded = ledger.succeeded()
        self.assertTrue(succeeded)
        self.assertTrue(any(e.met_a_termination for e in succeeded), "no command was retried on a new session")
        stored = check_stored_once(self, ledger)

        # A total outage: every command fails after its retries, and nothing of it is stored.
        connections[ALIAS].close()
        orders = [send_through_gateway(ledger, f"ready-{i}-place", place_order(f"ready-{i}")) for i in range(2)]
        self.assertTrue(all(e.result is not None for e in orders))
        stored |= {e.request_id for e in orders}
        with database_down():
            down = [send_through_gateway(ledger, "down-place", place_order("down")),
                    *(send_through_gateway(ledger, f"down-cancel-{i}", cancel_order(f"down-{i}"), e.result.aggregate_id)
                      for i, e in enumerate(orders))]
        for entry in down:
            self.assertIsInstance(entry.error, RecoverableStoreError)
        self.assertEqual(check_stored_once(self, ledger), stored)

        # Sent again with their request ids, the failed commands complete, each once.
        for entry in ledger.failed():
            result = get_runtime().gateway.send(entry.command, aggregate_id=entry.aggregate_id,
                                                request_id=entry.request_id)
            self.assertTrue(result.succeeded, result)
            # Stored by this send, or (a failure whose write had landed) by the first: then a duplicate.
            self.assertEqual(result.duplicate, entry.request_id in stored, entry.request_id)
            entry.result, entry.error = result, None
        self.assertEqual(check_stored_once(self, ledger), set(ledger.sent))
        self.assertEqual(derived_aggregate_id("order", DEFAULT_TENANT_ID, "down-place"),
                         ledger.sent["down-place"].result.aggregate_id)


# --- a lost reply --------------------------------------------------------------------------------------------


class CuttingProxy:
    """A TCP proxy to PostgreSQL that, once armed, closes the client's side right after passing on a message
    containing ``marker``: the server runs the statement (and commits it), the client never hears back."""

    def __init__(self, host: str, port: int, marker: bytes):
        self.target = (host, int(port))
        self.marker = marker
        self.armed = False
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            cut = threading.Event()  # this connection's statement was cut: its answer must not reach the client
            for source, sink, watch in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pipe, args=(source, sink, watch, cut), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pipe(self, source: socket.socket, sink: socket.socket, watch: bool, cut: threading.Event) -> None:
        try:
            while data := source.recv(65536):
                if not watch and cut.is_set():
                    # The answer to the cut statement: the server ran (and committed) it. Only now is the
                    # client's side closed, so it can neither hear the answer nor ask again before it landed.
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_RDWR)
                    return
                if watch and self.armed and self.marker in data:
                    self.armed = False
                    self.cuts += 1
                    cut.set()  # before the statement is passed on: the answer cannot slip through first
                    sink.sendall(data)
                    return
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:  # shutdown wakes a thread blocked on the socket; close alone would not
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


@override_settings(WOW=WOW)
class TestALostReply(OnPostgreSQL, TransactionTestCase):
    def test_an_append_that_landed_without_an_answer_is_the_commands_result(self):
        """The INSERT commits but its answer is lost: the gateway finds its own stream and reports success, once,
        not a DuplicateRequestId or DuplicateAggregateId from its retry."""
        settings = connections[ALIAS].settings_dict
        proxy = CuttingProxy(settings["HOST"], settings["PORT"], b"INSERT INTO \"wow_event_stream\"")
        self.addCleanup(proxy.close)
        original = (settings["HOST"], settings["PORT"])
        connections[ALIAS].close()
        settings["HOST"], settings["PORT"] = "127.0.0.1", str(proxy.port)
        try:
            gateway = get_runtime().gateway
            ready = gateway.send(place_order("lost-0"), request_id="lost-0-place")
            for request_id, command, aggregate_id in (
                    ("lost-1-place", place_order("lost-1"), None),  # a create: its retry would meet v1 taken
                    ("lost-0-cancel", cancel_order("lost-0"), ready.aggregate_id),
                    (None, place_order("lost-2"), None)):  # no request id: its command id is looked up
                with self.subTest(request_id):
                    proxy.armed = True
                    result = gateway.send(command, aggregate_id=aggregate_id, request_id=request_id)
                    self.assertFalse(proxy.armed)  # the cut happened
                    self.assertTrue(result.succeeded and not result.duplicate, result)
                    stored = EventStreamRow.objects.using(ALIAS).filter(request_id=result.request_id)
                    self.assertEqual([(r.aggregate_id, r.version, r.command_id) for r in stored],
                                     [(result.aggregate_id, result.aggregate_version, result.command_id)])
        finally:
            connections[ALIAS].close()
            settings["HOST"], settings["PORT"] = original
        self.assertEqual(proxy.cuts, 3)
        self.assertEqual(EventStreamRow.objects.using(ALIAS).count(), 4)


# --- HTTP level ----------------------------------------------------------------------------------------------------


def assert_unavailable(test: TransactionTestCase, response) -> dict:
    """A 503 in the API's error shape naming the store error, with Retry-After."""
    test.assertEqual(response.status_code, 503, response.content)
    test.assertEqual(response["Retry-After"], "1")
    body = response.json()
    test.assertEqual(set(body), {"errorCode", "errorMsg", "bindingErrors"})
    test.assertEqual(body["errorCode"], "StoreUnavailable")
    test.assertIn("retry", body["errorMsg"])
    return body


@override_settings(WOW=WOW)
class TestAPIDuringAnOutage(OnPostgreSQL, TransactionTestCase):
    available_apps = ["django.contrib.contenttypes", "django.contrib.auth", *OnPostgreSQL.available_apps]
    ORDER = {"customer_id": "c-1", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "3.50"}]}

    def post_command(self, client, request_id: str, path: str, body: dict):
        return client.post(f"/api/{path}", body, format="json", HTTP_COMMAND_REQUEST_ID=request_id)

    def test_commands_and_reads_get_2xx_or_503(self):
        from rest_framework.test import APIClient

        sent: dict[str, tuple[str, dict]] = {}  # request id -> (path, body)
        answered: dict[str, int] = {}  # request id -> the first answer's status
        statuses: Counter = Counter()
        lock = threading.Lock()

        def record(request_id: str | None, path: str, body: dict | None, response) -> None:
            self.assertIn(response.status_code, (200, 503), response.content)
            if response.status_code == 503:
                assert_unavailable(self, response)
            with lock:
                statuses[response.status_code] += 1
                if request_id is not None:
                    sent[request_id] = (path, body)
                    answered[request_id] = response.status_code

        def work(index: int) -> None:
            client = APIClient()
            deadline = time.monotonic() + 2.0
            n = 0
            while time.monotonic() < deadline:
                n += 1
                request_id = f"h{index}-{n}"
                response = self.post_command(client, f"{request_id}-place", "order/place_order", self.ORDER)
                record(f"{request_id}-place", "order/place_order", self.ORDER, response)
                if response.status_code != 200:
                    continue
                order_id = response.json()["aggregateId"]
                record(None, "state", None, client.get(f"/api/order/{order_id}/state"))
                record(None, "count", None, client.post("/api/order/snapshot/count", {}, format="json"))
                cancel = {"reason": "changed my mind"}
                record(f"{request_id}-cancel", f"order/{order_id}/cancel_order", cancel,
                       self.post_command(client, f"{request_id}-cancel", f"order/{order_id}/cancel_order", cancel))

        with SessionKiller() as killer:
            in_threads(3, work)
        self.assertGreater(killer.terminated, 0)
        self.assertGreater(statuses[200], 0)

        client = APIClient()
        connections[ALIAS].close()
        placed = self.post_command(client, "ready-place", "order/place_order", self.ORDER)
        self.assertEqual(placed.status_code, 200)
        order_id = placed.json()["aggregateId"]
        with database_down():
            for request_id, path, body in (("down-place", "order/place_order", self.ORDER),
                                           ("down-cancel", f"order/{order_id}/cancel_order", {"reason": "r"})):
                record(request_id, path, body, self.post_command(client, request_id, path, body))
                self.assertEqual(answered[request_id], 503)
            for read in (lambda: client.get(f"/api/order/{order_id}/state"),
                         lambda: client.get(f"/api/order/{order_id}/snapshot"),
                         lambda: client.get(f"/api/order/{order_id}/event/1/10"),
                         lambda: client.post("/api/order/snapshot/paged", {}, format="json"),
                         lambda: client.post("/api/order/event/count", {}, format="json")):
                assert_unavailable(self, read())

        connections[ALIAS].close()
        rows = list(EventStreamRow.objects.using(ALIAS).values_list("aggregate_id", "version", "request_id"))
        self.assertEqual([r for r, n in Counter(r for _, _, r in rows).items() if n > 1], [])
        stored = {r for _, _, r in rows}
        self.assertLessEqual({r for r, status in answered.items() if status == 200}, stored)
        self.assertNotIn("down-place", stored)
        # The 503s, sent again with their request ids: 200, each stored once.
        for request_id, status in answered.items():
            if status == 503:
                path, body = sent[request_id]
                response = self.post_command(client, request_id, path, body)
                self.assertEqual(response.status_code, 200, response.content)
                self.assertEqual(response.json()["duplicate"], request_id in stored)
        rows = list(EventStreamRow.objects.using(ALIAS).values_list("aggregate_id", "version", "request_id"))
        self.assertEqual(Counter(r for _, _, r in rows), Counter(set(answered) | {"ready-place"}))
        by_aggregate: dict[str, list[int]] = {}
        for aggregate_id, version, _ in rows:
            by_aggregate.setdefault(aggregate_id, []).append(version)
        for aggregate_id, versions in by_aggregate.items():
            self.assertEqual(sorted(versions), list(range(1, len(versions) + 1)), aggregate_id)

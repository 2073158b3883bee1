"""Mongo URIs, one connection per URI per process, fork safety, databases."""

from __future__ import annotations

import socket
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from pymongo import errors as pymongo_errors

from wow_django.backends.mongo import database_name
from wow_django.backends.mongo.client import connect, disconnect, parse_uri, redact

from .support import in_forked_child


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("mongodb://localhost:27017/orders", (False, "orders")),
        ("mongodb://u:p%40ss@h1:1,h2:2/orders?replicaSet=rs0&w=majority", (False, "orders")),
        ("mongodb+srv://user:pw@cluster.example.net/orders?retryWrites=true", (False, "orders")),
        ("mongodb://localhost:27017", (False, None)),
        ("mongodb://localhost:27017/?w=1", (False, None)),
        ("mongomock://localhost/wow", (True, "wow")),
        ("mongomock://localhost", (True, None)),
    ],
)
def test_parse_uri(uri, expected):
    assert parse_uri(uri) == expected


@pytest.mark.parametrize(
    "uri, message",
    [
        ("postgres://localhost/db", "unsupported scheme 'postgres'"),
        ("localhost:27017", "must look like mongodb://"),
        ("mongodb://localhost/bad.name", "not a valid MongoDB database name"),
        ("mongodb://localhost/has space", "not a valid MongoDB database name"),
    ],
)
def test_bad_uris_are_configuration_errors(uri, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_uri(uri)


def test_redact_hides_the_password():
    assert redact("mongodb://user:secret@h:1/db") == "mongodb://user:***@h:1/db"
    assert redact("mongodb://h:1/db") == "mongodb://h:1/db"


def test_one_connection_per_uri():
    a = connect("mongomock://localhost/conn_a")
    assert connect("mongomock://localhost/conn_a") is a
    b = connect("mongomock://localhost/conn_b")
    assert b is not a
    disconnect("mongomock://localhost/conn_a")
    assert connect("mongomock://localhost/conn_a") is not a
    disconnect("mongomock://localhost/conn_a")
    disconnect("mongomock://localhost/conn_b")


def test_server_client_is_lazy():
    """Opening a server connection talks to nobody; its first operation is what reaches the server.

    The "server" is a socket that listens and never answers: a connection
    attempt shows as a pending connection in its backlog.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    uri = f"mongodb://127.0.0.1:{listener.getsockname()[1]}/lazy_test?serverSelectionTimeoutMS=300&connectTimeoutMS=300"
    before = set(threading.enumerate())
    try:
        connection = connect(uri)
        database = connection.database("lazy_test")
        started = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("pymongo")]
        assert started == []  # no server monitor, no background I/O
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody has connected
        with pytest.raises(pymongo_errors.ServerSelectionTimeoutError):
            database.command("ping")  # the silent server never answers the handshake
        listener.settimeout(10)
        peer, _ = listener.accept()  # the first operation connected
        peer.close()
    finally:
        disconnect(uri)
        listener.close()


def test_server_client_is_recreated_after_fork():
    # connect=False: creating the client talks to nobody, so port 1 is fine.
    uri = "mongodb://127.0.0.1:1/fork_test?serverSelectionTimeoutMS=100"
    parent = connect(uri)
    assert parent.embedded is False
    embedded = connect("mongomock://localhost/fork_embedded")
    fresh_server, same_embedded = in_forked_child(
        lambda: (connect(uri) is not parent, connect("mongomock://localhost/fork_embedded") is embedded))
    assert fresh_server and same_embedded
    assert connect(uri) is parent
    disconnect(uri)
    disconnect("mongomock://localhost/fork_embedded")


def test_database_per_purpose_defaults_to_the_uri_database():
    with override_settings(WOW={"MONGO_URI": "mongomock://localhost/shop", "SNAPSHOT_DATABASE": "shop_read"}):
        assert database_name("EVENT_STREAM") == "shop"
        assert database_name("SNAPSHOT") == "shop_read"
        assert database_name("PREPARE") == "shop"


def test_default_uri_is_the_embedded_engine():
    with override_settings(WOW={}):
        assert database_name("EVENT_STREAM") == "wow"


def test_no_database_anywhere_is_a_clear_error():
    with override_settings(WOW={"MONGO_URI": "mongodb://user:secret@localhost:27017"}):
        with pytest.raises(ImproperlyConfigured) as caught:
            database_name("EVENT_STREAM")
    message = str(caught.value)
    assert "WOW['EVENT_STREAM_DATABASE']" in message and "secret" not in message


def test_bad_database_setting_is_a_clear_error():
    with override_settings(WOW={"PREPARE_DATABASE": "a/b"}):
        with pytest.raises(ImproperlyConfigured, match=r"WOW\['PREPARE_DATABASE'\].*not a valid"):
            database_name("PREPARE")


def test_stores_and_gateway_are_rebuilt_in_a_forked_child():
    from django.test import override_settings

    from wow_django.application.runtime import get_runtime
    uri = "mongodb://127.0.0.1:1/fork_stores?serverSelectionTimeoutMS=100"
    with override_settings(WOW={"MONGO_URI": uri}):
        parent_store, parent_gateway = get_runtime().event_store, get_runtime().gateway

        def probe():
            child_store = get_runtime().event_store
            return (child_store is not parent_store, get_runtime().gateway is not parent_gateway,
                    child_store.connection.client is not parent_store.connection.client)

        assert in_forked_child(probe) == (True, True, True)
        assert get_runtime().event_store is parent_store
    disconnect(uri)


def test_a_server_is_waited_for_a_few_seconds_not_pymongos_thirty():
    from wow_django.backends.mongo.client import MongoConnection

    default = MongoConnection("mongodb://127.0.0.1:1/sel_default")
    own = MongoConnection("mongodb://127.0.0.1:1/sel_own?serverSelectionTimeoutMS=300")
    try:
        assert default.client.options.server_selection_timeout == 5.0
        assert own.client.options.server_selection_timeout == 0.3  # the URI's value wins
        with override_settings(WOW={"MONGO_SERVER_SELECTION_TIMEOUT_MS": 1500}):
            configured = MongoConnection("mongodb://127.0.0.1:1/sel_setting")
            assert configured.client.options.server_selection_timeout == 1.5
            configured.close()
    finally:
        default.close()
        own.close()


def test_an_unreachable_server_is_one_503_not_a_retried_wait():
    """No server can be selected: the store says so at once (nothing was sent) and the gateway does not
    retry it inside the request; other transient errors are retried."""
    from decimal import Decimal

    from sample_project.orders.aggregates import OrderLine, PlaceOrder
    from wow_django.application.runtime import get_runtime
    from wow_django.backends.mongo.errors import recoverable_errors
    from wow_django.exceptions import RecoverableStoreError, StoreUnreachable

    from .support import fresh_wow

    with pytest.raises(StoreUnreachable, match="nothing was sent"), recoverable_errors("loading"):
        raise pymongo_errors.ServerSelectionTimeoutError("no primary")
    command = PlaceOrder(customer_id="c", items=[OrderLine(sku="A", quantity=1, unit_price=Decimal(1))])
    for error, calls in ((StoreUnreachable("unreachable"), 1), (RecoverableStoreError("blip"), 4)):
        with override_settings(WOW=fresh_wow("in_memory", COMMAND_RETRY_LIMIT=3, COMMAND_RETRY_BACKOFF_MS=0.1)):
            store = get_runtime().gateway.event_store
            attempts = []

            def failing(*args, error=error, attempts=attempts, **kwargs):
                attempts.append(1)
                raise error

            store.append = failing
            with pytest.raises(type(error)):
                get_runtime().gateway.send(command)
            assert len(attempts) == calls, type(error).__name__


def test_a_commands_storage_work_is_bounded_by_one_deadline():
    """COMMAND_STORAGE_TIMEOUT_S: each attempt's load and append run inside the store's deadline (what is
    left of it), and a transient error past it is not retried: the request and its aggregate's lock are
    not held across a failover's worth of retries."""
    import contextlib
    import time
    from decimal import Decimal

    from sample_project.orders.aggregates import OrderLine, PlaceOrder
    from wow_django.application.runtime import get_runtime
    from wow_django.exceptions import RecoverableStoreError

    from .support import fresh_wow

    command = PlaceOrder(customer_id="c", items=[OrderLine(sku="A", quantity=1, unit_price=Decimal(1))])
    with override_settings(WOW=fresh_wow("in_memory", COMMAND_RETRY_LIMIT=5, COMMAND_RETRY_BACKOFF_MS=0.1,
                                         COMMAND_STORAGE_TIMEOUT_S=0.2)):
        store = get_runtime().gateway.event_store
        inside, deadlines, seen = [], [], []

        @contextlib.contextmanager
        def deadline(seconds):
            deadlines.append(seconds)
            inside.append(True)
            try:
                yield
            finally:
                inside.pop()

        load, append = store.load, store.append
        store.deadline = deadline
        store.load = lambda *a, **k: (seen.append(("load", bool(inside))), load(*a, **k))[1]
        store.append = lambda *a, **k: (seen.append(("append", bool(inside))), append(*a, **k))[1]
        get_runtime().gateway.send(command)
        assert seen == [("load", True), ("append", True)] and 0 < deadlines[0] <= 0.2

        attempts = []

        def slow_failure(*args, **kwargs):  # a failover: each attempt fails transiently after a while
            attempts.append(1)
            time.sleep(0.15)
            raise RecoverableStoreError("no primary")

        store.append = slow_failure
        with pytest.raises(RecoverableStoreError):
            get_runtime().gateway.send(command)
        assert len(attempts) == 2  # the second attempt ends past the deadline: no third (the limit is 5)
        assert deadlines[-1] < deadlines[-2]  # each attempt gets what is left


def test_the_mongo_store_deadline_is_pymongos_operation_timeout():
    from pymongo import _csot  # pymongo's own record of the block's deadline (what its operations obey)

    from wow_django.backends.mongo.client import MongoConnection
    from wow_django.backends.mongo.event_store import MongoEventStore

    server = MongoConnection("mongodb://127.0.0.1:1/deadline")  # lazy: nothing is contacted
    embedded = MongoConnection("mongomock://localhost/deadline")
    try:
        for connection, expected in ((server, 2.5), (embedded, None)):
            store = MongoEventStore.__new__(MongoEventStore)  # only its connection matters here
            store.connection = connection
            with store.deadline(2.5):
                assert _csot.get_timeout() == expected
            with store.deadline(None):
                assert _csot.get_timeout() is None
    finally:
        server.close()
        embedded.close()


def test_stores_read_the_primary_and_only_queries_follow_the_uris_read_preference():
    from pymongo import ReadPreference

    from wow_django.backends.mongo.client import MongoConnection
    from wow_django.backends.mongo.event_store import MongoEventStore
    from wow_django.backends.mongo.queries import MongoEventStreamQueryService
    from wow_django.backends.mongo.schema import SchemaGuard

    connection = MongoConnection("mongodb://127.0.0.1:1/prefs?readPreference=secondaryPreferred")
    try:
        assert connection.read_preference == ReadPreference.SECONDARY_PREFERRED
        database = connection.database("prefs")
        assert database.read_preference == ReadPreference.PRIMARY
        store = MongoEventStore(connection, "prefs", schema=SchemaGuard("ctx", auto_init=False))
        store._collections["order"] = store.database["order_event_stream"]  # no server here: skip the schema check
        assert store.collection("order").read_preference == ReadPreference.PRIMARY
        queries = MongoEventStreamQueryService(store, "order")
        assert queries.collection.read_preference == ReadPreference.SECONDARY_PREFERRED
    finally:
        connection.close()


def test_an_unacknowledged_write_concern_is_refused_when_a_store_is_built():
    from wow_django.backends.mongo.bus_store import MongoBusStore
    from wow_django.backends.mongo.client import MongoConnection
    from wow_django.backends.mongo.event_store import MongoEventStore
    from wow_django.backends.mongo.prepare_key import MongoPrepareKey
    from wow_django.backends.mongo.schema import SchemaGuard
    from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore

    connection = MongoConnection("mongodb://u:secret@127.0.0.1:1/wc?w=0")
    guard = SchemaGuard("ctx", auto_init=False)
    try:
        for build in (lambda: MongoEventStore(connection, "wc", schema=guard),
                      lambda: MongoSnapshotStore(connection, "wc", schema=guard),
                      lambda: MongoPrepareKey("username", connection, "wc", schema=guard),
                      lambda: MongoBusStore(connection, "wc", schema_guard=guard)):
            with pytest.raises(ImproperlyConfigured, match=r"unacknowledged writes \(w=0\)") as refused:
                build()
            assert "secret" not in str(refused.value)
        MongoEventStore(MongoConnection("mongodb://127.0.0.1:1/wc?w=majority"), "wc", schema=guard)
    finally:
        connection.close()


# --- every write path carries the storage time limit (issue 22, item 12) --------------------------------


WRITES = ("insert_one", "insert_many", "update_one", "update_many", "replace_one", "delete_one", "delete_many",
          "find_one_and_update", "find_one_and_replace", "find_one_and_delete")


def test_every_write_path_runs_within_the_storage_time_limit(monkeypatch):
    """Batches (on the batcher's own thread), followers' leases and checkpoints, bus records, snapshots and
    prepared keys: each write runs within pymongo's operation timeout (COMMAND_STORAGE_TIMEOUT_S), as the
    gateway's do. The embedded engine has no timeout: the connection is made to act as a server's, and
    each write of the embedded collections records the timeout in force (pymongo's own context)."""
    import mongomock
    from pymongo import _csot

    from wow_django.backends.mongo.bus_store import MongoBusStore
    from wow_django.backends.mongo.event_store import MongoEventStore
    from wow_django.backends.mongo.followers import MongoFollowerStore
    from wow_django.backends.mongo.prepare_key import MongoPrepareKey
    from wow_django.backends.mongo.schema import SchemaGuard
    from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore
    from wow_django.persistence.batching import BatchingEventStore
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_snapshot, make_stream
    from wow_django.testing.mongo import embedded_connection

    seen: list[tuple[str, float | None]] = []
    for name in WRITES:
        original = getattr(mongomock.collection.Collection, name)

        def recording(self, *args, _name=name, _original=original, **kwargs):
            seen.append((_name, _csot.get_timeout()))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(mongomock.collection.Collection, name, recording)
    connection = embedded_connection()
    guard = SchemaGuard("ctx")
    events = MongoEventStore(connection, "limits", schema=guard)
    followers = MongoFollowerStore(connection, "limits", schema=guard)
    bus = MongoBusStore(connection, "limits_bus", schema_guard=SchemaGuard("ctx"))
    snapshots = MongoSnapshotStore(connection, "limits", schema=guard)
    keys = MongoPrepareKey("username", connection, "limits", schema=guard)
    agg = AggregateId("order", "o-1", "ctx")
    events.append(make_stream(agg, 1))  # collections and indexes exist before the limits are looked at
    followers.get("f")
    assert bus.events is not None  # its collection and indexes built
    seen.clear()
    monkeypatch.setattr(connection, "embedded", False)
    monkeypatch.setattr(connection, "_transactional", False)  # a standalone server's paths (see below for a set's)
    from datetime import UTC, datetime

    with override_settings(WOW={"COMMAND_STORAGE_TIMEOUT_S": 7}):
        events.append(make_stream(agg, 2))
        batching = BatchingEventStore(events)
        try:
            batching.append(make_stream(agg, 3))
        finally:
            batching.close()
        now = datetime.now(UTC)
        assert followers.acquire("f", "me", 30, now=now)
        followers.advance("f", "me", 1, now=now)
        followers.release("f", "me")
        bus.insert_event({"eventId": "e-1", "topic": "t", "status": "PENDING"})
        bus.mark_sent("e-1", now)
        snapshots.save(make_snapshot(agg, 3))
        keys.prepare("alice", "c-1")
        keys.reprepare("alice", "c-2")
        keys.rollback("alice")
    assert {name for name, _ in seen} >= {"insert_one", "insert_many", "update_one", "find_one_and_update"}
    unbounded = [name for name, timeout in seen if timeout is None or timeout > 7]
    assert not unbounded, seen


def test_followers_and_the_gateways_read_back_read_with_read_concern_majority(monkeypatch):
    """Issue 22, item 7: a follower must never relay an event a failover rolls back, nor may the gateway take
    such a write as stored. Only a replica set applies read concerns: each read of the embedded collections
    records the read concern it was given."""
    import mongomock

    from wow_django.backends.mongo.event_store import MongoEventStore
    from wow_django.backends.mongo.followers import MongoStreamFeed
    from wow_django.backends.mongo.schema import SchemaGuard
    from wow_django.persistence.records import AggregateId
    from wow_django.testing import make_stream
    from wow_django.testing.mongo import embedded_connection

    seen: list[tuple[str, str | None]] = []
    for name in ("find", "count_documents"):
        original = getattr(mongomock.collection.Collection, name)

        def recording(self, *args, _original=original, **kwargs):
            seen.append((self.name, self.read_concern.level))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(mongomock.collection.Collection, name, recording)
    store = MongoEventStore(embedded_connection(), "majority", schema=SchemaGuard("ctx"))
    agg = AggregateId("order", "o-1", "ctx")
    stream = make_stream(agg, 1)
    store.append(stream)
    feed = MongoStreamFeed(store, "ctx")
    seen.clear()
    assert [s.stream for s in feed.read(0, 10)] == [stream]
    assert feed.head() == 1 and feed.count_between(0, 1) == 1 and feed.void_positions(0, 1) == []
    assert feed.position_of("order", "o-1", 1) == 1
    assert store.get_by_request_id(agg, stream.request_id) == stream
    assert seen and all(level == "majority" for _, level in seen), seen

"""MongoDB connections: one client per URI per process, safe after fork.

``mongodb://`` and ``mongodb+srv://`` URIs go to pymongo; ``mongomock://``
goes to the embedded in-process engine (mongomock), which keeps nothing on
disk and shares nothing between processes.

The embedded engine stores a document, then checks unique indexes, then
removes it again on a violation: concurrent readers can see the doomed
document and concurrent writers can both pass a check. For it, and only for
it, ``guard`` serialises the operations on one collection; on a real server
MongoDB's own atomicity and isolation are used and the guard does nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from django.core.exceptions import ImproperlyConfigured

from wow_django.conf import redact_url

if TYPE_CHECKING:
    from pymongo import MongoClient

EMBEDDED_SCHEME = "mongomock"
SERVER_SCHEMES = ("mongodb", "mongodb+srv")
_FORBIDDEN_DB_CHARS = set('/\\. "$*<>:|?')


def check_database_name(name: str, source: str) -> str:
    """Return ``name`` if MongoDB accepts it as a database name, else raise."""
    bad = sorted(set(name) & _FORBIDDEN_DB_CHARS)
    if not name or bad or len(name.encode()) > 63:
        raise ImproperlyConfigured(
            f"{source}: {name!r} is not a valid MongoDB database name "
            "(1–63 bytes, none of / \\ . space \" $ * < > : | ?)."
        )
    return name


def parse_uri(uri: str) -> tuple[bool, str | None]:
    """``(embedded, database)`` for a Mongo URI; the database may be ``None``."""
    if not isinstance(uri, str) or "://" not in uri:
        raise ImproperlyConfigured(
            f"WOW['MONGO_URI'] must look like mongodb://host/db, mongodb+srv://host/db "
            f"or mongomock://localhost/db, got {redact(uri) if isinstance(uri, str) else uri!r}"
        )
    scheme, rest = uri.split("://", 1)
    if scheme not in SERVER_SCHEMES and scheme != EMBEDDED_SCHEME:
        raise ImproperlyConfigured(
            f"WOW['MONGO_URI'] has unsupported scheme {scheme!r}; use mongodb, mongodb+srv or mongomock."
        )
    if "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    database = None
    if "/" in rest:
        path = rest.split("/", 1)[1].split("?", 1)[0]
        if path:
            database = check_database_name(unquote(path), "WOW['MONGO_URI']")
    return scheme == EMBEDDED_SCHEME, database


def redact(uri: str) -> str:
    """The URI without its password, for messages and logs (with or without a scheme)."""
    return redact_url(uri)


def is_transactional(hello: dict) -> bool:
    """Whether a server's ``hello`` answer is a deployment with multi-document transactions: a replica set
    member (``setName``) or a ``mongos`` (``msg: isdbgrid``), with sessions, at wire version 8 (MongoDB 4.2)
    or later for both (a 4.0 replica set has transactions too, but is not supported here)."""
    if "logicalSessionTimeoutMinutes" not in hello or hello.get("maxWireVersion", 0) < 8:
        return False
    return bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"


class MongoConnection:
    """One client and the facts about its engine."""

    def __init__(self, uri: str):
        self.uri = uri
        self.embedded, self.default_database = parse_uri(uri)
        self._guards: dict[tuple[str, str], threading.RLock] = {}
        self._guards_lock = threading.Lock()
        self._position_locks: dict[tuple[str, str], threading.RLock] = {}
        self._transactional: bool | None = None
        # Embedded engine: the collections this process wrote a Decimal128 into (see note_decimals).
        self._decimal_collections: set[tuple[str, str]] = set()
        # The embedded engine's client (mongomock's) stands in for pymongo's, with its interface.
        self.client: MongoClient[dict[str, Any]]
        if self.embedded:
            try:
                import mongomock
            except ImportError:
                raise ImproperlyConfigured(
                    "WOW['MONGO_URI'] uses mongomock:// (the embedded engine, for tests and trying the Mongo "
                    "code paths without a server), but mongomock is not installed: "
                    "pip install 'wow-django[mongomock]', or use a mongodb:// URI."
                ) from None
            # mongomock parses mongodb:// URIs; the database part is ours to read.
            self.client = mongomock.MongoClient("mongodb://" + uri.split("://", 1)[1])
        else:
            import pymongo

            options: dict = {}
            if "serverselectiontimeoutms" not in uri.lower():
                # pymongo waits 30 s for a server by default: a request (and the aggregate's lock) would hang
                # that long in a failover. The URI's own value wins.
                from wow_django.conf import wow_settings

                options["serverSelectionTimeoutMS"] = wow_settings.MONGO_SERVER_SELECTION_TIMEOUT_MS
            # connect=False: nothing talks to the server until the first operation.
            self.client = pymongo.MongoClient(uri, connect=False, appname="wow_django", uuidRepresentation="standard",
                                              **options)

    def require_acknowledged(self, what: str) -> None:
        """``ImproperlyConfigured`` when the URI's write concern is unacknowledged (``w=0``): ``what``
        (a store) could never tell a stored write from a lost one. Checked when the store is built,
        not after its first write."""
        if not self.embedded and not self.client.write_concern.acknowledged:
            raise ImproperlyConfigured(
                f"WOW['MONGO_URI'] ({redact(self.uri)}) asks for unacknowledged writes (w=0): {what} needs to "
                "know each write landed. Use w=1 or w=majority (the default)."
            )

    @property
    def read_preference(self):
        """The URI's read preference (e.g. ``secondaryPreferred``): only the query services use it."""
        return self.client.read_preference

    def database(self, name: str):
        """The database for the stores: always read from the primary, whatever the URI says. The stores
        read before they write (request ids, versions, attempt numbers, prepared keys): a lagging
        secondary would answer with what is no longer true."""
        from pymongo import ReadPreference

        return self.client.get_database(name, read_preference=ReadPreference.PRIMARY)

    def write_limit(self):
        """The operation and socket time limit of one write (pymongo's client-side operation timeout,
        ``COMMAND_STORAGE_TIMEOUT_S``), as the gateway's: a batch, a follower's checkpoint or lease, a bus
        record never waits on a failing server for longer. Nested in the gateway's own (shorter) deadline,
        the shorter one wins. The embedded engine has no operation timeout."""
        from wow_django.conf import wow_settings

        seconds = wow_settings.COMMAND_STORAGE_TIMEOUT_S
        if self.embedded or seconds is None:
            return contextlib.nullcontext()
        import pymongo

        return pymongo.timeout(seconds)

    @property
    def transactional(self) -> bool:
        """Whether the server runs multi-document transactions: a replica set or a sharded cluster (asked once,
        with ``hello``). There the event store takes a position and inserts its stream in one transaction,
        so positions commit in order and followers' gaps are final (see
        :mod:`wow_django.backends.mongo.event_store`). A standalone server and the embedded engine do not."""
        if self.embedded:
            return False
        if self._transactional is None:
            from pymongo import errors as pymongo_errors

            from wow_django.backends.mongo.errors import recoverable_errors

            with recoverable_errors("asking the MongoDB server what it is (hello)"):
                try:
                    hello = self.client.admin.command("hello")
                except pymongo_errors.OperationFailure:  # a server older than 4.4.2 knows only isMaster
                    hello = self.client.admin.command("isMaster")
            self._transactional = is_transactional(hello)
        return self._transactional

    @contextlib.contextmanager
    def positions_lock(self, database_name: str, context_names: Iterable[str], *,
                       timeout: float | None = None) -> Iterator[None]:
        """On the embedded engine, hold the position locks of ``context_names`` (in name order: no deadlock).

        The embedded engine has no transactions; it lives in one process, so a lock per context held from a
        position's allocation until its insert ended (stored, or its position recorded void) orders the
        inserts by position, and a reader holding it sees no position missing below a visible one: the
        engine's gaps are final. Waits at most ``timeout`` seconds for each lock (None: without limit), then
        raises ``TimeoutError``. A server takes nothing here."""
        if not self.embedded:
            yield
            return
        with contextlib.ExitStack() as stack:
            for context_name in sorted(set(context_names)):
                with self._guards_lock:
                    lock = self._position_locks.setdefault((database_name, context_name), threading.RLock())
                if not lock.acquire(timeout=-1 if timeout is None else timeout):
                    raise TimeoutError(f"the position lock of context {context_name!r} is held by another "
                                       f"writer (waited {timeout} s)")
                stack.callback(lock.release)
            yield

    @contextlib.contextmanager
    def guard(self, collection, *, write: bool = False) -> Iterator[None]:
        """Serialise operations on ``collection`` on the embedded engine only; a ``write`` runs within
        :meth:`write_limit` on a server."""
        if not self.embedded:
            with self.write_limit() if write else contextlib.nullcontext():
                yield
            return
        key = (collection.database.name, collection.name)
        lock = self._guards.get(key)
        if lock is None:
            with self._guards_lock:
                lock = self._guards.setdefault(key, threading.RLock())
        with lock:
            yield

    def note_decimals(self, collection) -> None:
        """Record that ``collection`` now holds ``Decimal128`` values (embedded engine only).

        mongomock cannot compare or sort ``Decimal128`` (and its equality with
        other numbers is false, where MongoDB's is numeric), so the query
        services evaluate queries over such a collection in Python with the
        evaluator. The embedded engine lives in this process, so what this
        process wrote is all it holds.
        """
        if self.embedded:
            self._decimal_collections.add((collection.database.name, collection.name))

    def holds_decimals(self, collection) -> bool:
        """Whether the embedded engine's ``collection`` was given a ``Decimal128`` (always False on a server)."""
        return self.embedded and (collection.database.name, collection.name) in self._decimal_collections

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"<MongoConnection {redact(self.uri)}>"


class Connections:
    """One :class:`MongoConnection` per URI, shared by every store of the process (like ``django.db.connections``).

    Not rebuilt on settings changes: the embedded engine keeps its data in its
    client, which must outlive a runtime rebuilt by ``override_settings``.
    The runtime's fork policy calls :meth:`after_fork`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[str, MongoConnection] = {}

    def get(self, uri: str) -> MongoConnection:
        """The connection for ``uri`` (created on first use)."""
        connection = self._connections.get(uri)
        if connection is not None:
            return connection
        with self._lock:
            connection = self._connections.get(uri)
            if connection is None:
                connection = self._connections[uri] = MongoConnection(uri)
            return connection

    def close(self, uri: str | None = None) -> None:
        """Close one connection (or all); the next :meth:`get` opens a new one (embedded: its data is gone)."""
        with self._lock:
            for key in [uri] if uri is not None else list(self._connections):
                connection = self._connections.pop(key, None)
                if connection is not None:
                    connection.close()

    def after_fork(self) -> None:
        """In a forked child: forget server clients (pymongo must not be used across fork), unclosed.

        Embedded clients are plain Python objects; the child keeps its copy.
        """
        self._lock = threading.Lock()
        for uri in [u for u, c in self._connections.items() if not c.embedded]:
            del self._connections[uri]


connections = Connections()


def connect(uri: str) -> MongoConnection:
    """The process's connection for ``uri`` (created on first use)."""
    return connections.get(uri)


def disconnect(uri: str | None = None) -> None:
    """Close one connection (or all); the next ``connect`` opens a new one.

    For the embedded engine this discards its data.
    """
    connections.close(uri)

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
import os
import threading
from collections.abc import Iterator
from urllib.parse import unquote

from django.core.exceptions import ImproperlyConfigured

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
            f"or mongomock://localhost/db, got {uri!r}"
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
    """The URI without its password, for messages and logs."""
    scheme, sep, rest = uri.partition("://")
    hosts, slash, tail = rest.partition("/")
    if "@" in hosts:
        userinfo, host = hosts.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        hosts = f"{user}:***@{host}"
    return f"{scheme}{sep}{hosts}{slash}{tail}"


class MongoConnection:
    """One client and the facts about its engine."""

    def __init__(self, uri: str):
        self.uri = uri
        self.embedded, self.default_database = parse_uri(uri)
        self._guards: dict[tuple[str, str], threading.RLock] = {}
        self._guards_lock = threading.Lock()
        if self.embedded:
            import mongomock

            # mongomock parses mongodb:// URIs; the database part is ours to read.
            self.client = mongomock.MongoClient("mongodb://" + uri.split("://", 1)[1])
        else:
            import pymongo

            # connect=False: nothing talks to the server until the first operation.
            self.client = pymongo.MongoClient(uri, connect=False, appname="wow_django", uuidRepresentation="standard")

    def database(self, name: str):
        return self.client.get_database(name)

    @contextlib.contextmanager
    def guard(self, collection) -> Iterator[None]:
        """Serialise operations on ``collection`` on the embedded engine only."""
        if not self.embedded:
            yield
            return
        key = (collection.database.name, collection.name)
        lock = self._guards.get(key)
        if lock is None:
            with self._guards_lock:
                lock = self._guards.setdefault(key, threading.RLock())
        with lock:
            yield

    def close(self) -> None:
        self.client.close()

    def __repr__(self) -> str:
        return f"<MongoConnection {redact(self.uri)}>"


_lock = threading.Lock()
_connections: dict[str, MongoConnection] = {}
_pid = os.getpid()


def _after_fork_in_child() -> None:
    """A pymongo client must not be used across fork: forget server clients.

    Embedded clients are plain Python objects; the child keeps its copy.
    """
    global _pid, _lock
    _lock = threading.Lock()
    _pid = os.getpid()
    for uri in [u for u, c in _connections.items() if not c.embedded]:
        del _connections[uri]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def connect(uri: str) -> MongoConnection:
    """The process's connection for ``uri`` (created on first use)."""
    connection = _connections.get(uri)
    if connection is not None and _pid == os.getpid():
        return connection
    with _lock:
        if _pid != os.getpid():  # fork without register_at_fork
            _after_fork_in_child()
        connection = _connections.get(uri)
        if connection is None:
            connection = _connections[uri] = MongoConnection(uri)
        return connection


def disconnect(uri: str | None = None) -> None:
    """Close one connection (or all); the next ``connect`` opens a new one.

    For the embedded engine this discards its data.
    """
    with _lock:
        uris = [uri] if uri is not None else list(_connections)
        for key in uris:
            connection = _connections.pop(key, None)
            if connection is not None:
                connection.close()

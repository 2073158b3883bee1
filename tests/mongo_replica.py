"""The embedded engine playing a replica set's transactions, for the event store's transactional path.

No MongoDB server can be installed where this suite is developed, and the embedded engine (mongomock) has no
sessions. What the event store does in a transaction on a replica set (``MongoEventStore._transaction``) and
what the feed relies on is small, and this module plays exactly that, with MongoDB's documented semantics:

* an update of the position counter inside a transaction takes that document: a second transaction updating
  it before the first ends is aborted at once with ``WriteConflict`` (code 112, label
  ``TransientTransactionError``), as MongoDB does rather than making it wait;
* the counter's new value is visible to others only when its transaction commits; an abort gives the
  position back (the counter keeps its committed value);
* the transaction's inserts are undone when it aborts (mongomock shows them before the commit; the feed never
  reads past the committed counter, so it cannot tell);
* everything else ignores the session.

``WOW_TEST_MONGO_URI`` on a replica set runs the same tests against MongoDB's own transactions.
"""

from __future__ import annotations

import contextlib
import threading

from pymongo import ReturnDocument
from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.schema import POSITIONS_COLLECTION
from wow_django.testing.mongo import EmbeddedMongoDatabase


def _strip(kwargs: dict) -> tuple[dict, object]:
    session = kwargs.pop("session", None)
    return kwargs, session


class _Session:
    def __init__(self, replica: SimulatedReplicaSet):
        self.replica = replica
        self.in_transaction = False
        self._held: list[threading.Lock] = []
        self._counters: dict[tuple, tuple[object, int]] = {}
        self._undo: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if self.in_transaction:
            self._abort()

    def start_transaction(self, **_options):
        self.in_transaction, self._held, self._counters, self._undo = True, [], {}, []

    def abort_transaction(self):
        self._abort()

    def commit_transaction(self):
        if self.in_transaction:
            self._commit()

    def increment(self, collection, filter_: dict, amount: int) -> dict:
        key = (collection.database.name, collection.name, filter_["_id"])
        if key not in self._counters:
            lock = self.replica.document_lock(key)
            if not lock.acquire(blocking=False):
                raise pymongo_errors.OperationFailure(
                    "WriteConflict error: this operation conflicted with another operation", 112,
                    {"code": 112, "codeName": "WriteConflict", "errorLabels": ["TransientTransactionError"]})
            self._held.append(lock)
            committed = collection.find_one(filter_) or {}
            self._counters[key] = (collection, committed.get("position", 0))
        target, value = self._counters[key]
        self._counters[key] = (target, value + amount)
        return {"_id": filter_["_id"], "position": value + amount}

    def inserted(self, collection, ids: list) -> None:
        self._undo.append(lambda: collection.delete_many({"_id": {"$in": ids}}))

    def _commit(self) -> None:
        try:
            for (_database, _name, identity), (collection, value) in self._counters.items():
                collection.update_one({"_id": identity}, {"$set": {"position": value}}, upsert=True)
        finally:  # the documents' locks go whatever happened: one left held would refuse every later writer
            self._end()

    def _abort(self) -> None:
        try:
            for undo in reversed(self._undo):
                undo()
        finally:
            self._end()

    def _end(self) -> None:
        self.in_transaction = False
        for lock in self._held:
            lock.release()
        self._held, self._counters, self._undo = [], {}, []


class _Wrapper:
    """Delegates to the embedded engine's object, dropping ``session=`` (what :meth:`_wrap` makes of answers)."""

    def __init__(self, inner, replica: SimulatedReplicaSet):
        self._inner = inner
        self._replica = replica

    def _wrap(self, name: str, answer):
        return answer

    def __getattr__(self, name):
        attribute = getattr(self._inner, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            kwargs, _session = _strip(kwargs)
            return self._wrap(name, attribute(*args, **kwargs))

        return call


class _Collection(_Wrapper):
    def with_options(self, *args, **kwargs):
        return _Collection(self._inner.with_options(*args, **kwargs), self._replica)

    def find_one_and_update(self, filter_, update, *args, **kwargs):
        kwargs, session = _strip(kwargs)
        if session is None or not session.in_transaction:
            return self._inner.find_one_and_update(filter_, update, *args, **kwargs)
        if self._inner.name != POSITIONS_COLLECTION or set(update) != {"$inc"} or \
                kwargs.get("return_document") is not ReturnDocument.AFTER:
            raise NotImplementedError("the simulation plays the position counter's $inc only")
        return session.increment(self._inner, filter_, update["$inc"]["position"])

    def insert_many(self, documents, *args, **kwargs):
        kwargs, session = _strip(kwargs)
        if session is None or not session.in_transaction:
            return self._inner.insert_many(documents, *args, **kwargs)
        documents = list(documents)
        try:
            result = self._inner.insert_many(documents, ordered=True)
        except pymongo_errors.BulkWriteError as exc:
            session.inserted(self._inner, [d["_id"] for d in documents[:exc.details.get("nInserted", 0)]])
            raise
        session.inserted(self._inner, [d["_id"] for d in documents])
        return result

    def insert_one(self, document, *args, **kwargs):
        kwargs, session = _strip(kwargs)
        if session is None or not session.in_transaction:
            return self._inner.insert_one(document, *args, **kwargs)
        result = self._inner.insert_one(document)
        session.inserted(self._inner, [document["_id"]])
        return result


class _Database(_Wrapper):
    def _wrap(self, name: str, answer):
        return _Collection(answer, self._replica) if name in ("get_collection", "create_collection") else answer

    def __getitem__(self, name):
        return _Collection(self._inner[name], self._replica)


class _Client:
    def __init__(self, inner, replica: SimulatedReplicaSet):
        self._inner = inner
        self._replica = replica

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def start_session(self, **_options):
        return _Session(self._replica)

    def get_database(self, *args, **kwargs):
        return _Database(self._inner.get_database(*args, **kwargs), self._replica)

    def __getitem__(self, name):
        return _Database(self._inner[name], self._replica)


class SimulatedReplicaSet(MongoConnection):
    """An embedded connection whose stores take the transactional path (see the module docstring)."""

    transactional = True  # shadows MongoConnection.transactional (False on the embedded engine)

    def __init__(self):
        super().__init__("mongomock://localhost/wow_test")
        self.client = _Client(self.client, self)
        self._document_locks: dict[tuple, threading.Lock] = {}

    @contextlib.contextmanager
    def positions_lock(self, database_name, context_names, *, timeout=None):
        """Nothing, as on a server: only the transactions order the positions here."""
        yield

    def document_lock(self, key: tuple) -> threading.Lock:
        with self._guards_lock:
            return self._document_locks.setdefault(key, threading.Lock())


class SimulatedReplicaSetDatabase(EmbeddedMongoDatabase):
    """Each test its own database on a :class:`SimulatedReplicaSet`."""

    def connection(self) -> MongoConnection:
        return SimulatedReplicaSet()

"""Event store on MongoDB: one ``insert_one`` per append (DESIGN part A).

Every stream also gets a **global position** in its bounded context, for the
followers (DESIGN G): a counter document per context in ``wow_position`` is
incremented with the insert (one ``findOneAndUpdate`` per append, or per
context and batch in :meth:`MongoEventStore.append_many`). How followers can
trust a missing position depends on the deployment:

* **A replica set or a sharded cluster** (``MongoConnection.transactional``):
  the counter update and the insert run in one transaction. A second append of
  the context meets the first's uncommitted counter and MongoDB aborts it at
  once (a write conflict, ``TransientTransactionError``); it is run again after
  a short pause until it commits or ``APPEND_LOCK_TIMEOUT_S`` has passed
  (``ContextLockTimeout``, nothing stored). So positions commit in order and
  with their streams; a refused insert aborts its transaction and gives its
  position back. The feed reads the counter first (read concern majority, in
  a causally consistent session) and only positions at or below it, all of
  which are committed: its gaps are final and no late insert is ever passed.
* **The embedded engine** (one process, no transactions) allocates and inserts
  under a per-context lock (``MongoConnection.positions_lock``, bounded by
  ``APPEND_LOCK_TIMEOUT_S`` too) that the feed's reads take as well: its gaps
  are final.
* **A standalone server** has no transactions: positions are taken before
  their inserts, so a follower may see position 7 before position 6. When an
  insert surely wrote nothing (a duplicate key or another write error, no
  server selected) its position is recorded in ``wow_void_position`` at once;
  otherwise the follower holds a gap for ``FOLLOWER_GAP_TIMEOUT_S`` and an
  insert landing later than that is not handed. Run followers on a replica set
  (a one-member set will do; change streams need one too).
"""
from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import bson
from bson import errors as bson_errors
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from pymongo import ASCENDING, ReturnDocument
from pymongo import errors as pymongo_errors
from pymongo.read_concern import ReadConcern

from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.codec import from_bson, holds_decimal, to_bson
from wow_django.backends.mongo.errors import (
    RECOVERABLE_CODES,
    duplicate_key_kind,
    is_duplicate_key,
    recoverable_errors,
)
from wow_django.backends.mongo.schema import SchemaGuard, event_stream_spec, positions_spec, void_positions_spec
from wow_django.exceptions import (
    ContextLockTimeout,
    DuplicateAggregateId,
    DuplicateEventStreamId,
    DuplicateRequestId,
    EventStoreError,
    EventVersionConflict,
    RecoverableStoreError,
    StoreUnreachable,
    UnacknowledgedWriteError,
)
from wow_django.persistence.contracts import EventStore, check_scan_args, check_time_range, check_version_range
from wow_django.persistence.documents import document_to_stream, stream_to_document
from wow_django.persistence.followers import AppendNotifier
from wow_django.persistence.records import MAX_VERSION, AggregateId, EventStream


def _write_error(details: dict, batch: pymongo_errors.BulkWriteError) -> pymongo_errors.WriteError:
    """One document's write error of a batch as the driver's own exception (chained to the batch's), so
    the error mapped from it shows the server's code and message."""
    kind = pymongo_errors.DuplicateKeyError if is_duplicate_key(details) else pymongo_errors.WriteError
    error = kind(details.get("errmsg", "write error"), details.get("code"), details)
    error.__cause__ = batch
    return error


def _caused(error: Exception, cause: BaseException) -> Exception:
    """``error`` (returned, not raised) with the driver's exception as its cause, as ``raise … from`` does."""
    error.__cause__ = cause
    return error


#: MongoDB's largest document (BSON ``maxBsonObjectSize``): a stream beyond it is refused before it is sent.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
#: Encodes as a 64-bit integer, the widest a position takes: a document checked with it fits with any position.
_POSITION_PROBE = 2**62
#: The codec options of the stores' clients (``uuidRepresentation="standard"``), for the embedded engine.
_CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
#: What the driver raises for a document it cannot send: each fails its own stream only.
UNSTORABLE = (bson_errors.InvalidDocument, OverflowError, pymongo_errors.DocumentTooLarge)


def check_storable(collection, document: dict) -> None:
    """Raise what the driver would for ``document`` (``InvalidDocument``, ``OverflowError`` for an integer
    beyond 64 bits, ``DocumentTooLarge`` beyond 16 MiB) *before* it is given a position or sent: a batch
    then fails only the streams at fault (pymongo encodes a batch chunk by chunk, after earlier chunks were
    stored), and a refused append leaves no position for followers to wait on."""
    options = getattr(collection, "codec_options", None)
    if not isinstance(options, CodecOptions):  # the embedded engine's own class
        options = _CODEC_OPTIONS
    size = len(bson.encode({**document, "position": _POSITION_PROBE}, codec_options=options))
    if size > MAX_DOCUMENT_BYTES:
        raise pymongo_errors.DocumentTooLarge(
            f"event stream {document.get('_id')!r} is {size} bytes as BSON; MongoDB stores documents of at most "
            f"{MAX_DOCUMENT_BYTES} bytes")


#: What an aggregate's full id is read from (scans, locate).
_IDENTITY_FIELDS = {"aggregateId": 1, "aggregateName": 1, "contextName": 1, "tenantId": 1}


class MongoEventStore(EventStore):
    """``{aggregateName}_event_stream`` collections in one database.

    Optimistic concurrency and idempotency come from the unique indexes
    ``aggregateId_1_version_1`` and ``aggregateId_1_requestId_1`` (or
    ``requestId_1``); this class only maps their errors.
    """

    def __init__(
        self,
        connection: MongoConnection,
        database_name: str,
        *,
        schema: SchemaGuard,
        request_id_index: str = "aggregate",
        max_time_ms: int = 10_000,
        lock_timeout_s: float | None = 5.0,
    ):
        connection.require_acknowledged('the event store')
        self.connection = connection
        self.database = connection.database(database_name)
        self.schema = schema
        self.request_id_index = request_id_index
        self.max_time_ms = max_time_ms
        #: How long an append waits for its context's positions (``APPEND_LOCK_TIMEOUT_S``; None: 120 s on a
        #: server, without limit on the embedded engine), then ``ContextLockTimeout``.
        self.lock_timeout_s = lock_timeout_s
        self._collections: dict[str, object] = {}
        #: Notified after each append of this process (the followers of this process wait on it).
        self.append_notifier = AppendNotifier()

    def collection(self, aggregate_name: str):
        collection = self._collections.get(aggregate_name)
        if collection is None:
            spec = event_stream_spec(aggregate_name, self.request_id_index)
            self.schema.ensure(self.database, spec)
            collection = self._collections[aggregate_name] = self.database[spec.name]
        return collection

    # --- positions --------------------------------------------------------------

    def _support(self, spec):
        collection = self._collections.get(spec.name)
        if collection is None:
            self.schema.ensure(self.database, spec)
            collection = self._collections[spec.name] = self.database[spec.name]
        return collection

    def allocate_positions(self, context_name: str, count: int, *, session=None) -> int:
        """Reserve ``count`` consecutive positions of ``context_name``; the first. One round trip.

        With a ``session`` the reservation is part of its transaction (no error mapping, no time limit of
        its own: the transaction's caller has both)."""
        counters = self._support(positions_spec())
        if session is not None:
            counter = counters.find_one_and_update(
                {"_id": context_name}, {"$inc": {"position": count}}, upsert=True,
                return_document=ReturnDocument.AFTER, session=session)
            return counter["position"] - count + 1
        with recoverable_errors(f"allocating positions in {context_name!r}"), self.connection.guard(counters, write=True):
            counter = counters.find_one_and_update(
                {"_id": context_name}, {"$inc": {"position": count}}, upsert=True,
                return_document=ReturnDocument.AFTER)
        return counter["position"] - count + 1

    @contextlib.contextmanager
    def _positions_lock(self, context_names):
        """The embedded engine's position locks (see ``MongoConnection.positions_lock``), waited for at most
        ``lock_timeout_s``: then ``ContextLockTimeout``, nothing stored. A server takes nothing."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.connection.positions_lock(self.database.name, context_names,
                                                                   timeout=self.lock_timeout_s))
            except TimeoutError as exc:
                raise ContextLockTimeout(
                    f"an append waited {self.lock_timeout_s} s for its context's positions, held by another "
                    "writer: nothing stored; retry with the same request id") from exc
            yield

    def _transaction(self, work: Callable[[object], None]) -> None:
        """Run ``work(session)`` in one transaction, and again while it meets a transient error.

        Two appends of a context both update its counter document: MongoDB aborts the later transaction
        at once with a write conflict (``TransientTransactionError``) rather than making it wait. It is run
        again after a short, growing, jittered pause until it commits, or until ``lock_timeout_s`` (120 s
        when None) has passed: ``ContextLockTimeout``, nothing stored. A commit whose outcome is unknown
        (``UnknownTransactionCommitResult``: the reply was lost) is committed again — MongoDB makes that
        idempotent — until the same deadline; past it the error propagates as a transient one (the
        stream may be stored: a caller reads back, as the gateway does). Any other error aborts the
        transaction and propagates (nothing of it is stored)."""
        limit = 120.0 if self.lock_timeout_s is None else self.lock_timeout_s
        deadline = time.monotonic() + limit
        pause = 0.001
        with self.connection.client.start_session() as session:
            while True:
                try:
                    session.start_transaction()
                    try:
                        work(session)
                    except BaseException:
                        if session.in_transaction:
                            session.abort_transaction()
                        raise
                    self._commit(session, deadline)
                    return
                except pymongo_errors.PyMongoError as exc:
                    if not exc.has_error_label("TransientTransactionError"):
                        raise
                    if time.monotonic() + pause > deadline:
                        raise ContextLockTimeout(
                            f"an append kept meeting other appends' transactions on its context's positions (or "
                            f"a transient error) for {limit} s: nothing stored; retry with the same request id"
                        ) from exc
                time.sleep(pause * random.uniform(0.5, 1.5))
                pause = min(pause * 2, 0.05)

    @staticmethod
    def _commit(session, deadline: float) -> None:
        """Commit, again while the outcome is unknown and the deadline allows (a repeated commit is safe)."""
        while True:
            try:
                session.commit_transaction()
                return
            except pymongo_errors.PyMongoError as exc:
                if not exc.has_error_label("UnknownTransactionCommitResult") or time.monotonic() >= deadline:
                    raise
            time.sleep(0.005)

    def _position_and_insert(self, collection, documents: list[dict], session) -> None:
        """Within ``session``'s transaction: positions for ``documents``, then one ordered insert."""
        self._position(documents, session=session)
        with self.connection.guard(collection):  # the embedded engine's serialisation (a server: nothing)
            result = collection.insert_many(documents, ordered=True, session=session)
        if not result.acknowledged:
            raise UnacknowledgedWriteError("an append in a transaction was not acknowledged")

    def _insert_in_transaction(self, name: str, collection, streams: Sequence[EventStream],
                               documents: list[dict]) -> list[Exception | None]:
        """Position and insert ``documents`` (one aggregate type) in one transaction; each stream's result.

        A write error (a duplicate version or request id) aborts the transaction, giving its positions
        back: the stream at fault gets its error and the others are run again without it. Any other error
        fails every stream still pending alike (nothing of the transaction is stored)."""
        results: list[Exception | None] = [None] * len(documents)
        pending = list(range(len(documents)))
        refused: list[tuple[int, dict, pymongo_errors.BulkWriteError]] = []
        while pending:
            batch = [documents[index] for index in pending]
            try:
                with recoverable_errors(f"appending {len(batch)} {name} stream(s)"):
                    with self.connection.write_limit():
                        self._transaction(functools.partial(self._position_and_insert, collection, batch))
                break
            except pymongo_errors.BulkWriteError as exc:
                write_errors = exc.details.get("writeErrors") or []
                if not write_errors:
                    for index in pending:
                        results[index] = exc
                    break
                index = pending[write_errors[0]["index"]]
                refused.append((index, write_errors[0], exc))
                pending.remove(index)
            except Exception as exc:
                for index in pending:
                    results[index] = exc
                break
        # Mapped once the others are stored: a stream refused for another of the same batch (the aborted
        # transaction took that one back with it) is confirmed against the stored one.
        for index, write_error, refusal in refused:
            results[index] = self._refusal(name, collection, streams[index], write_error, refusal)
        return results

    def _void(self, context_name: str, positions: list[int]) -> None:
        """Record positions whose inserts were refused; best effort (a follower's gap timeout covers a miss)."""
        if not positions:
            return
        voids = self._support(void_positions_spec())
        try:
            with recoverable_errors("recording void positions"), self.connection.guard(voids, write=True):
                voids.insert_many([{"_id": f"{context_name}:{p}", "contextName": context_name, "position": p}
                                   for p in positions], ordered=False)
        except (RecoverableStoreError, pymongo_errors.PyMongoError):
            pass

    # --- writes ---------------------------------------------------------------

    def _document(self, collection, stream: EventStream) -> dict:
        """The stream's document, its Decimals as ``Decimal128`` (see :mod:`~wow_django.backends.mongo.codec`)."""
        document = stream_to_document(stream)
        if any(holds_decimal(event["body"]) for event in document["body"]):
            document["body"] = to_bson(document["body"])
            self.connection.note_decimals(collection)
        check_storable(collection, document)
        return document

    def append(self, stream: EventStream) -> None:
        collection = self.collection(stream.aggregate_name)
        document = self._document(collection, stream)
        if self.connection.transactional:
            [error] = self._insert_in_transaction(stream.aggregate_name, collection, [stream], [document])
        else:
            context_name = stream.aggregate_id.context_name
            with self._positions_lock([context_name]):
                document["position"] = self.allocate_positions(context_name, 1)
                error = self._append_one(collection, stream, document)
        if error is not None:
            raise error
        self.append_notifier.notify()

    def append_many(self, streams: Sequence[EventStream]) -> list[Exception | None]:
        """One unordered ``insert_many`` per aggregate type; per-stream results.

        A stream whose document cannot be sent (see :func:`check_storable`) fails alone before positions
        are taken; a write error fails its own stream only.
        """
        results: list[Exception | None] = [None] * len(streams)
        by_name: dict[str, list[int]] = {}
        for index, stream in enumerate(streams):
            by_name.setdefault(stream.aggregate_name, []).append(index)
        for name, group in by_name.items():
            indexes: list[int] = []
            documents: list[dict] = []
            try:
                collection = self.collection(name)
                for index in group:
                    try:
                        documents.append(self._document(collection, streams[index]))
                        indexes.append(index)
                    except (*UNSTORABLE, ValueError) as exc:
                        results[index] = exc
                if not documents:
                    continue
            except Exception as exc:
                for index in indexes or group:
                    results[index] = results[index] or exc
                continue
            if self.connection.transactional:
                outcomes = self._insert_in_transaction(name, collection, [streams[i] for i in indexes], documents)
                for index, outcome in zip(indexes, outcomes, strict=True):
                    results[index] = outcome
                continue
            try:
                with self._positions_lock([d["contextName"] for d in documents]):
                    self._insert_group(name, collection, streams, indexes, documents, results)
            except ContextLockTimeout as exc:
                for index in indexes:
                    results[index] = exc
        if any(result is None for result in results):
            self.append_notifier.notify()
        return results

    def _insert_group(self, name: str, collection, streams: Sequence[EventStream], indexes: list[int],
                      documents: list[dict], results: list[Exception | None]) -> None:
        """Position and insert one aggregate type's documents of a batch; each stream's result in ``results``."""
        try:
            self._position(documents)
        except Exception as exc:
            for index in indexes:
                results[index] = results[index] or exc
            return
        try:
            with recoverable_errors(f"appending {len(documents)} {name} streams"):
                with self.connection.guard(collection, write=True):
                    result = collection.insert_many(documents, ordered=False)
            if not result.acknowledged:
                error: Exception = UnacknowledgedWriteError(f"batched append of {name} streams was not acknowledged")
                for index in indexes:
                    results[index] = error
        except pymongo_errors.BulkWriteError as exc:
            refused: dict[str, list[int]] = {}
            for write_error in exc.details.get("writeErrors", []):
                stream_index = indexes[write_error["index"]]
                document = documents[write_error["index"]]
                # A write error is the server's answer that this document was not written: void at once.
                refused.setdefault(document["contextName"], []).append(document["position"])
                results[stream_index] = self._refusal(name, collection, streams[stream_index], write_error, exc)
            for context_name, positions in refused.items():
                self._void(context_name, positions)
            concern = exc.details.get("writeConcernErrors") or []
            if concern:
                error = RecoverableStoreError(f"write concern failed for batched append: {concern[0]}")
                for index in indexes:
                    results[index] = results[index] or error
        except RecoverableStoreError as exc:
            for index in indexes:
                results[index] = exc
            if self._not_written(exc):
                self._void_documents(documents)
        except UNSTORABLE:
            # Checked before: only a driver that encodes differently gets here, maybe after earlier chunks
            # of the batch were stored. Each document is inserted on its own; one found stored with its own
            # position is this batch's, not a duplicate.
            for index, document in zip(indexes, documents, strict=True):
                results[index] = self._append_one(collection, streams[index], document, after_batch=True)
        except Exception as exc:  # this group's failure only: the other groups' results stand
            for index in indexes:
                results[index] = exc
            if self._not_written(exc):
                self._void_documents(documents)

    def _refusal(self, name: str, collection, stream: EventStream, write_error: dict,
                 batch: pymongo_errors.BulkWriteError) -> Exception:
        """The error for one document's write error of a batch, caused by the driver's."""
        error: Exception
        if is_duplicate_key(write_error):
            error = self._conflict(collection, stream, write_error)
        elif write_error.get("code") in RECOVERABLE_CODES:
            error = RecoverableStoreError(f"appending {name} stream {stream.id!r} failed transiently "
                                          f"({write_error.get('errmsg', 'write error')}); retry")
        else:
            error = EventStoreError(write_error.get("errmsg", "write error"))
        return _caused(error, _write_error(write_error, batch))

    def _append_one(self, collection, stream: EventStream, document: dict, *,
                    after_batch: bool = False) -> Exception | None:
        """Insert one positioned document; its error, or None when stored (``after_batch``: also when a batch
        that failed part-way stored it already)."""
        try:
            with recoverable_errors(f"appending {stream.aggregate_name} {stream.aggregate_id.id!r}"):
                with self.connection.guard(collection, write=True):
                    result = collection.insert_one(document)
        except pymongo_errors.DuplicateKeyError as exc:
            if after_batch and self._stored_as(collection, document):
                return None
            self._void(document["contextName"], [document["position"]])
            return _caused(self._conflict(collection, stream, exc.details), exc)
        except UNSTORABLE as exc:
            # Refused by the driver before anything was sent: neither this insert nor the batch stored it.
            self._void(document["contextName"], [document["position"]])
            return exc
        except Exception as exc:
            if self._not_written(exc) and not (after_batch and self._stored_as(collection, document)):
                self._void(document["contextName"], [document["position"]])
            return exc
        if not result.acknowledged:
            return UnacknowledgedWriteError(
                f"append of {stream.aggregate_name} {stream.aggregate_id.id!r} v{stream.version} was not "
                "acknowledged; use a write concern of w ≥ 1 for the event store")
        return None

    def _not_written(self, exc: BaseException) -> bool:
        """Whether a failed insert surely wrote nothing, so that its position can be voided at once: any error
        of the embedded engine (in this process, under the position lock), a server's write error, or no
        server selected (nothing sent). A network error or a timeout after sending is not: the insert may
        still land, and voiding its position would make followers pass it for good."""
        if self.connection.embedded:
            return True
        if isinstance(exc, StoreUnreachable):
            return True
        cause = exc.__cause__ if isinstance(exc, RecoverableStoreError) else exc
        return isinstance(cause, pymongo_errors.WriteError) and not isinstance(cause, pymongo_errors.WriteConcernError)

    def _void_documents(self, documents: list[dict]) -> None:
        by_context: dict[str, list[int]] = {}
        for document in documents:
            if isinstance(document.get("position"), int):
                by_context.setdefault(document["contextName"], []).append(document["position"])
        for context_name, positions in by_context.items():
            self._void(context_name, positions)

    def _stored_as(self, collection, document: dict) -> bool:
        """Whether ``document`` itself is stored: its ``_id`` with its own position (positions are never
        given twice)."""
        with recoverable_errors("confirming a stored stream"), self.connection.guard(collection):
            stored = collection.find_one({"_id": document["_id"]}, {"position": 1})
        return stored is not None and stored.get("position") == document["position"]

    def _position(self, documents: list[dict], *, session=None) -> None:
        """Give the documents positions: one allocation per context of the batch (in ``session``'s
        transaction when given)."""
        by_context: dict[str, list[dict]] = {}
        for document in documents:
            by_context.setdefault(document["contextName"], []).append(document)
        for context_name, group in by_context.items():
            if session is None:
                first = self.allocate_positions(context_name, len(group))
            else:
                first = self.allocate_positions(context_name, len(group), session=session)
            for offset, document in enumerate(group):
                document["position"] = first + offset

    def _conflict(self, collection, stream: EventStream, error: Mapping[str, Any] | None) -> EventStoreError:
        """The error for a duplicate key, confirmed by a read when the engine did not name the index."""
        agg = stream.aggregate_id
        kind = duplicate_key_kind(error)
        if kind is None:
            kind = self._confirm_conflict(collection, stream)
        if kind == "version":
            if stream.version == 1:
                return DuplicateAggregateId(agg.aggregate_name, agg.id)
            return EventVersionConflict(agg.aggregate_name, agg.id, stream.version)
        if kind == "request":
            return DuplicateRequestId(agg.aggregate_name, agg.id, stream.request_id)
        if kind == "id":
            return DuplicateEventStreamId(f"event stream {stream.id!r} was already appended")
        return EventStoreError(f"duplicate key on {collection.name}: {error}")

    def _confirm_conflict(self, collection, stream: EventStream) -> str | None:
        agg = stream.aggregate_id
        with recoverable_errors("confirming a duplicate key"), self.connection.guard(collection):
            if collection.find_one({"aggregateId": agg.id, "version": stream.version}, {"_id": 1}):
                return "version"
            request_filter = {"requestId": stream.request_id}
            if self.request_id_index == "aggregate":
                request_filter["aggregateId"] = agg.id
            if collection.find_one(request_filter, {"_id": 1}):
                return "request"
            if collection.find_one({"_id": stream.id}, {"_id": 1}):
                return "id"
        return None

    # --- reads ------------------------------------------------------------------

    def deadline(self, seconds: float | None):
        if seconds is None or self.connection.embedded:  # the embedded engine has no operation timeout
            return contextlib.nullcontext()
        import pymongo

        return pymongo.timeout(seconds)

    @staticmethod
    def _owned(aggregate_id: AggregateId) -> dict:
        """The filter of one aggregate's streams: its id *and* its tenant (another tenant's id finds nothing).

        ``aggregateId_1_version_1`` still serves it: ids are unique per type, the tenant only confirms.
        """
        return {"aggregateId": aggregate_id.id, "tenantId": aggregate_id.tenant_id}

    def _find(self, aggregate_name: str, query: dict, sort=None, limit: int = 0, *,
              majority: bool = False) -> list[EventStream]:
        collection = self.collection(aggregate_name)
        if majority:
            collection = collection.with_options(read_concern=ReadConcern("majority"))
        with recoverable_errors(f"reading {collection.name}"), self.connection.guard(collection):
            cursor = collection.find(query, max_time_ms=self.max_time_ms)
            if sort:
                cursor = cursor.sort(sort)
            if limit:
                cursor = cursor.limit(limit)
            docs = list(cursor)
        return [document_to_stream(from_bson(doc)) for doc in docs]

    def load(
        self, aggregate_id: AggregateId, head_version: int = 1, tail_version: int = MAX_VERSION
    ) -> list[EventStream]:
        check_version_range(head_version, tail_version)
        query = self._owned(aggregate_id)
        if head_version > 1 or tail_version < MAX_VERSION:
            query["version"] = {"$gte": head_version, "$lte": tail_version}
        return self._find(aggregate_id.aggregate_name, query, [("version", ASCENDING)])

    def load_by_time(self, aggregate_id: AggregateId, start_time: int, end_time: int) -> list[EventStream]:
        check_time_range(start_time, end_time)
        query = {**self._owned(aggregate_id), "createTime": {"$gte": start_time, "$lte": end_time}}
        return self._find(aggregate_id.aggregate_name, query, [("version", ASCENDING)])

    def last(self, aggregate_id: AggregateId) -> EventStream | None:
        found = self._find(aggregate_id.aggregate_name, self._owned(aggregate_id), [("version", -1)], 1)
        return found[0] if found else None

    def scan_aggregate_ids(
        self,
        aggregate_name: str,
        after_id: str = "",
        limit: int = 100,
        *,
        context_name: str | None = None,
        tenant_id: str | None = None,
    ) -> list[AggregateId]:
        check_scan_args(after_id, limit)
        # Version 1 exists exactly once per aggregate (unique index), so the
        # first streams give each id once, served by aggregateId_1_version_1.
        query: dict = {"aggregateId": {"$gt": after_id}, "version": 1, "aggregateName": aggregate_name}
        if context_name is not None:
            query["contextName"] = context_name
        if tenant_id is not None:
            query["tenantId"] = tenant_id
        collection = self.collection(aggregate_name)
        with recoverable_errors(f"scanning {collection.name}"), self.connection.guard(collection):
            cursor = collection.find(query, _IDENTITY_FIELDS, max_time_ms=self.max_time_ms)
            docs = list(cursor.sort([("aggregateId", ASCENDING)]).limit(limit))
        return [
            AggregateId(aggregate_name=d["aggregateName"], id=d["aggregateId"],
                        context_name=d["contextName"], tenant_id=d["tenantId"])
            for d in docs
        ]

    def exists_request_id(self, aggregate_name: str, request_id: str, aggregate_id: str | None = None) -> bool:
        query = {"requestId": request_id}
        if aggregate_id is not None:
            query = {"aggregateId": aggregate_id, "requestId": request_id}
        collection = self.collection(aggregate_name)
        with recoverable_errors(f"reading {collection.name}"), self.connection.guard(collection):
            return collection.find_one(query, {"_id": 1}, max_time_ms=self.max_time_ms) is not None

    def get_by_request_id(self, aggregate_id: AggregateId, request_id: str) -> EventStream | None:
        # The gateway's read-back after an unknown outcome: from the primary (the database's read preference)
        # with read concern majority, so a write a failover will roll back is not taken as stored.
        found = self._find(aggregate_id.aggregate_name, {**self._owned(aggregate_id), "requestId": request_id},
                           limit=1, majority=True)
        return found[0] if found else None

    def locate(self, aggregate_name: str, aggregate_id: str) -> AggregateId | None:
        collection = self.collection(aggregate_name)
        with recoverable_errors(f"reading {collection.name}"), self.connection.guard(collection):
            doc = collection.find_one({"aggregateId": aggregate_id, "version": 1}, _IDENTITY_FIELDS,
                                      max_time_ms=self.max_time_ms)
        if doc is None:
            return None
        return AggregateId(aggregate_name=aggregate_name, id=doc["aggregateId"], context_name=doc["contextName"],
                           tenant_id=doc["tenantId"])

"""Followers on MongoDB: the event streams read by global position, and followers' state in ``wow_follower``.

Positions come from a per-context counter updated with each insert (see
:mod:`wow_django.backends.mongo.event_store`). On a replica set or a sharded
cluster both run in one transaction, so positions commit in order: the feed
reads the counter first (read concern majority, in a causally consistent
session) and then only positions at or below it, all committed, so its gaps
are final. On the embedded engine (one process, no transactions) allocation
and insert run under a per-context lock that reads take as well: final too.
On a standalone server a position is taken before its insert commits and can
become visible after a higher one: ``gaps_are_final`` is false and the
follower holds a missing position until it appears, is reported void, or the
gap timeout passes. Each ``{aggregate}_event_stream`` collection of the
context's database is read with the ``contextName_1_position_1`` index and
the collections' answers are merged by position.

Every write of the follower store is one conditional statement judged by the
server, so it is atomic across processes: ``acquire`` is an upsert whose
filter only matches a free, expired or own lease (a held lease makes the
upsert collide on ``_id``: refused); ``advance`` and ``set_poison`` only match
the caller's unexpired lease (no match: ``LeaseLost``). Times are epoch
microseconds from the caller's clock, never the server's.
"""

from __future__ import annotations

import heapq
from datetime import datetime
from typing import Any, cast

from pymongo import ASCENDING, DESCENDING
from pymongo import errors as pymongo_errors
from pymongo.read_concern import ReadConcern

from wow_django.backends.mongo.changes import ChangeWatcher
from wow_django.backends.mongo.codec import from_bson
from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.schema import (
    FOLLOWER_GAPS_COLLECTION,
    FOLLOWER_SKIPS_COLLECTION,
    FOLLOWERS_COLLECTION,
    POSITIONS_COLLECTION,
    VOID_POSITIONS_COLLECTION,
    SchemaGuard,
    event_stream_collection,
    follower_specs,
)
from wow_django.exceptions import CheckpointFenced, LeaseLost, RecoverableStoreError, UnknownFollower
from wow_django.persistence.documents import document_to_stream
from wow_django.persistence.followers import (
    FollowerState,
    FollowerStore,
    Gap,
    PoisonEvent,
    PositionedStream,
    StreamFeed,
    check_position,
    check_read_args,
    from_micros,
    gap_from_json,
    gap_to_json,
    poison_from_json,
    poison_time,
    poison_to_json,
    to_micros,
)

_SUFFIX = event_stream_collection("")


def _in(session) -> dict:
    """``session=`` for pymongo when there is one (the embedded engine's reads take none)."""
    return {} if session is None else {"session": session}


class MongoStreamFeed(StreamFeed):
    """The streams of one context in the event store's database, by position (see the module docstring)."""

    @property
    def gaps_are_final(self) -> bool:
        """True on a replica set or a sharded cluster (positions taken and inserted in one transaction, read
        up to the committed counter only) and on the embedded engine (inserts ordered under a lock that reads
        take too, see ``MongoConnection.positions_lock``). On a standalone server a position is taken before
        its insert commits, so a missing position is held for the gap timeout."""
        return self.connection.embedded or self.connection.transactional

    def __init__(self, store: MongoEventStore, context_name: str, *, watch_changes: bool = False):
        self.store = store
        self.database = store.database
        self.connection = store.connection
        self.context_name = context_name
        self.notifier = store.append_notifier
        self.max_time_ms = store.max_time_ms
        #: One change stream for the followers of this process (started on the first read), or None.
        self.watcher: ChangeWatcher | None = None
        if watch_changes and not store.connection.embedded:
            self.watcher = ChangeWatcher(self.database, self.notifier, context_name=context_name)

    def start_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.start()  # idempotent: one change stream for every follower of this process

    def change_status(self) -> str:
        """How this process learns of other processes' appends (for ``wow_followers``)."""
        if self.watcher is not None:
            return self.watcher.status.describe()
        if self.connection.embedded:
            return "the embedded engine has no change streams: followers poll with backoff"
        return "change streams off (WOW['MONGO_CHANGE_STREAMS']): followers poll with backoff"

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()

    @staticmethod
    def _majority(collection):
        """``collection`` read with read concern majority: a follower hands on only what a majority holds, so
        an event a failover rolls back is never projected nor relayed."""
        return collection.with_options(read_concern=ReadConcern("majority"))

    def _collections(self, session=None) -> list:
        """Every event stream collection of the database (one ``listCollections``).

        Listed at each read, not cached: positions are global across the collections, so a collection
        another process created that a cached list missed would look like a gap, and a gap is passed
        (at once where gaps are final). One round trip per batch buys that certainty. Listed after the
        counter was read: a stream at or below it lives in a collection created before."""
        with recoverable_errors(f"listing the event stream collections of {self.database.name}"):
            names = self.database.list_collection_names(**_in(session))
        return [self._majority(self.database[name]) for name in sorted(names)
                if name.endswith(_SUFFIX) and name != _SUFFIX]

    def committed_head(self, session=None) -> int:
        """The context's position counter, read with read concern majority: on a replica set every position
        at or below it is committed with its stream, or was given back by an aborted transaction."""
        counters = self._majority(self.database[POSITIONS_COLLECTION])
        with recoverable_errors(f"reading the position counter of {self.context_name!r}"), \
                self.connection.guard(counters):
            counter = counters.find_one({"_id": self.context_name}, {"position": 1}, max_time_ms=self.max_time_ms,
                                        **_in(session))
        return counter.get("position", 0) if counter else 0

    def read(self, after: int, limit: int) -> list[PositionedStream]:
        check_read_args(after, limit)
        if self.connection.transactional:
            # The counter first, then the streams at or below it, in one causally consistent session: each
            # read sees at least what the counter's read saw, even across a failover.
            with self.connection.client.start_session(causal_consistency=True) as session:
                upto = self.committed_head(session)
                if upto <= after:
                    return []
                return self._read({"$gt": after, "$lte": upto}, limit, session)
        # Embedded engine: every collection read with no insert in between (no position missing below a
        # visible one); a standalone server takes no lock here.
        try:
            lock = self.connection.positions_lock(self.database.name, [self.context_name],
                                                  timeout=self.store.lock_timeout_s)
            with lock:
                return self._read({"$gt": after}, limit, None)
        except TimeoutError as exc:
            raise RecoverableStoreError(f"reading the streams of {self.context_name!r} waited "
                                        f"{self.store.lock_timeout_s} s for a writer; retry") from exc

    def _read(self, positions: dict, limit: int, session) -> list[PositionedStream]:
        query = {"contextName": self.context_name, "position": positions}
        answers = []
        for collection in self._collections(session):
            with recoverable_errors(f"reading {collection.name} at positions {positions}"), \
                    self.connection.guard(collection):
                cursor = collection.find(query, max_time_ms=self.max_time_ms, **_in(session))
                documents = list(cursor.sort([("position", ASCENDING)]).limit(limit))
            answers.append([(document["position"], index, document)
                            for index, document in enumerate(documents)])
        merged = heapq.merge(*answers, key=lambda item: item[0])
        found = []
        for position, _, document in merged:
            found.append(PositionedStream(position, document_to_stream(from_bson(document))))
            if len(found) == limit:
                break
        return found

    def head(self) -> int:
        # The highest *visible* position, not the counter: a position allocated to an insert that failed
        # (or is still in flight) must not count as lag that no follower can ever catch up with.
        return self._highest({})

    def _highest(self, query: dict) -> int:
        best = 0
        for collection in self._collections():
            with recoverable_errors(f"reading {collection.name}"), self.connection.guard(collection):
                cursor = collection.find({"contextName": self.context_name, **query}, {"position": 1},
                                         max_time_ms=self.max_time_ms)
                documents = list(cursor.sort([("position", DESCENDING)]).limit(1))
            if documents and isinstance(documents[0].get("position"), int):
                best = max(best, documents[0]["position"])
        return best

    def position_at(self, time: datetime) -> int:
        return self._highest({"createTime": {"$lt": to_micros(time) / 1000}})

    def count_between(self, after: int, upto: int) -> int:
        query = {"contextName": self.context_name, "position": {"$gt": after, "$lte": upto}}
        total = 0
        for collection in self._collections():
            with recoverable_errors(f"counting {collection.name}"), self.connection.guard(collection):
                total += collection.count_documents(query, maxTimeMS=self.max_time_ms)
        return total

    def position_of(self, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        collection = self._majority(self.database[event_stream_collection(aggregate_name)])
        with recoverable_errors(f"reading the position of {aggregate_name} {aggregate_id!r} v{version}"):
            with self.connection.guard(collection):
                document = collection.find_one(
                    {"aggregateId": aggregate_id, "version": version, "contextName": self.context_name},
                    {"position": 1}, max_time_ms=self.max_time_ms)
        return document.get("position") if document else None

    def void_positions(self, after: int, upto: int) -> list[int]:
        voids = self._majority(self.database[VOID_POSITIONS_COLLECTION])
        with recoverable_errors("reading void positions"), self.connection.guard(voids):
            documents = list(voids.find({"contextName": self.context_name, "position": {"$gt": after, "$lte": upto}},
                                        {"position": 1}, max_time_ms=self.max_time_ms))
        return sorted(document["position"] for document in documents)


def _state(document: dict) -> FollowerState:
    until = document.get("leaseUntil")
    return FollowerState(
        name=document["_id"], position=document.get("position", 0),
        updated_at=from_micros(document.get("updatedAt", 0)), paused=bool(document.get("paused")),
        lease_owner=document.get("leaseOwner"), lease_until=from_micros(until) if until is not None else None,
        poison=poison_from_json(document.get("poison")), gaps_skipped=document.get("gapsSkipped", 0),
        last_gap=gap_from_json(document.get("lastGap")), extra=document.get("extra") or {},
        generation=document.get("generation", 0),
    )


class MongoFollowerStore(FollowerStore):
    """Followers' state in ``wow_follower`` (with ``wow_follower_gap`` and ``wow_follower_skip``) of a database."""

    def __init__(self, connection, database_name: str, *, schema: SchemaGuard, max_time_ms: int = 10_000):
        self.connection = connection
        self.database = connection.database(database_name)
        self.max_time_ms = max_time_ms
        for spec in follower_specs():
            schema.ensure(self.database, spec)
        self.followers = self.database[FOLLOWERS_COLLECTION]
        self.gap_records = self.database[FOLLOWER_GAPS_COLLECTION]
        self.skip_records = self.database[FOLLOWER_SKIPS_COLLECTION]

    def get(self, name: str) -> FollowerState | None:
        with recoverable_errors(f"reading follower {name!r}"), self.connection.guard(self.followers):
            document = self.followers.find_one({"_id": name}, max_time_ms=self.max_time_ms)
        return _state(document) if document else None

    def all(self) -> list[FollowerState]:
        with recoverable_errors("reading the followers"), self.connection.guard(self.followers):
            documents = list(self.followers.find({}, max_time_ms=self.max_time_ms).sort([("_id", ASCENDING)]))
        return [_state(document) for document in documents]

    def acquire(self, name: str, owner: str, lease_s: float, *, now: datetime) -> bool:
        micros = to_micros(now)
        until = micros + round(lease_s * 1_000_000)
        free = {"_id": name, "$or": [{"leaseOwner": None}, {"leaseOwner": owner}, {"leaseUntil": None},
                                     {"leaseUntil": {"$lte": micros}}]}
        update = {"$set": {"leaseOwner": owner, "leaseUntil": until},
                  "$setOnInsert": {"position": 0, "updatedAt": micros, "paused": False, "gapsSkipped": 0,
                                   "poison": None, "lastGap": None, "extra": {}}}
        try:
            with recoverable_errors(f"acquiring the lease of follower {name!r}"):
                with self.connection.guard(self.followers, write=True):
                    self.followers.update_one(free, update, upsert=True)
        except pymongo_errors.DuplicateKeyError:
            return False  # the document exists and the filter did not match: the lease is held
        return True

    def release(self, name: str, owner: str) -> None:
        with recoverable_errors(f"releasing the lease of follower {name!r}"), self.connection.guard(self.followers, write=True):
            self.followers.update_one({"_id": name, "leaseOwner": owner},
                                      {"$set": {"leaseOwner": None, "leaseUntil": None}})

    @staticmethod
    def _leased(name: str, owner: str, now: datetime, generation: int | None = None) -> dict:
        leased: dict[str, Any] = {"_id": name, "leaseOwner": owner, "leaseUntil": {"$gt": to_micros(now)}}
        if generation is not None:  # a document from before generations has none: it is generation 0
            leased["generation"] = {"$in": [generation, None]} if generation == 0 else generation
        return leased

    def _refused(self, name: str, owner: str, now: datetime, generation: int | None) -> Exception:
        document = self.followers.find_one({"_id": name}, {"leaseOwner": 1, "leaseUntil": 1, "generation": 1})
        if document is not None and generation is not None and document.get("generation", 0) != generation \
                and document.get("leaseOwner") == owner and (document.get("leaseUntil") or 0) > to_micros(now):
            return CheckpointFenced(name, generation, document.get("generation", 0))
        return LeaseLost(name, owner, document.get("leaseOwner") if document else None)

    def advance(self, name: str, owner: str, position: int, *, now: datetime, gaps: tuple[Gap, ...] = (),
                generation: int | None = None) -> None:
        check_position(position)
        leased = self._leased(name, owner, now, generation)
        extra: dict = {}
        if gaps:
            extra = {"$inc": {"gapsSkipped": sum(g.last - g.first + 1 for g in gaps)},
                     "$set": {"lastGap": gap_to_json(gaps[-1])}}
        forward = {"$inc": extra.get("$inc", {}), "$set": {**extra.get("$set", {}), "position": position,
                                                            "updatedAt": to_micros(now)}}
        if not forward["$inc"]:
            del forward["$inc"]
        with recoverable_errors(f"advancing follower {name!r} to {position}"), self.connection.guard(self.followers, write=True):
            moved = self.followers.update_one({**leased, "position": {"$lt": position}}, forward).matched_count
            if not moved:
                # Not forward (or the lease is gone): record the gaps alone, under the same lease condition.
                if extra:
                    held = self.followers.update_one(leased, extra).matched_count
                else:
                    held = self.followers.count_documents(leased, limit=1)
                if not held:
                    raise self._refused(name, owner, now, generation)
            if gaps:
                self.gap_records.insert_many([{"follower": name, **gap_to_json(g), "at": to_micros(now)}
                                              for g in gaps])

    def set_poison(self, name: str, owner: str, poison: PoisonEvent | None, *, now: datetime | None = None,
                   generation: int | None = None) -> None:
        now = poison_time(poison, now)
        with recoverable_errors(f"setting the poison event of follower {name!r}"):
            with self.connection.guard(self.followers, write=True):
                result = self.followers.update_one(self._leased(name, owner, now, generation),
                                                   {"$set": {"poison": poison_to_json(poison) if poison else None}})
                if not result.matched_count:
                    raise self._refused(name, owner, now, generation)

    def set_paused(self, name: str, paused: bool) -> None:
        with recoverable_errors(f"pausing follower {name!r}"), self.connection.guard(self.followers, write=True):
            if not self.followers.update_one({"_id": name}, {"$set": {"paused": bool(paused)},
                                                             "$inc": {"generation": 1}}).matched_count:
                raise UnknownFollower(name)

    def rewind(self, name: str, position: int, *, now: datetime) -> None:
        check_position(position)
        with recoverable_errors(f"rewinding follower {name!r} to {position}"), self.connection.guard(self.followers, write=True):
            result = self.followers.update_one(
                {"_id": name}, {"$set": {"position": position, "poison": None, "updatedAt": to_micros(now)},
                                "$inc": {"generation": 1}})
            if not result.matched_count:
                raise UnknownFollower(name)

    def skip_poison(self, name: str, *, by: str, reason: str, now: datetime) -> PoisonEvent:
        micros = to_micros(now)
        with recoverable_errors(f"skipping the poison event of follower {name!r}"):
            with self.connection.guard(self.followers, write=True):
                while True:
                    document = self.followers.find_one({"_id": name})
                    if document is None:
                        raise UnknownFollower(name)
                    poison = poison_from_json(document.get("poison"))
                    if poison is None:
                        raise ValueError(f"follower {name!r} is not stopped on a poison event")
                    # Conditional on the same poison event still being there: of two operators, one skips it.
                    result = self.followers.update_one(
                        {"_id": name, "poison": document["poison"]},
                        {"$max": {"position": poison.position}, "$set": {"poison": None, "updatedAt": micros},
                         "$inc": {"generation": 1}})
                    if result.modified_count:
                        break
                self.skip_records.insert_one({
                    "follower": name, "position": poison.position, "streamId": poison.stream_id,
                    "aggregate": poison.aggregate, "error": poison.error, "by": by, "reason": reason, "at": micros})
        return poison

    def skipped(self, name: str) -> list[dict]:
        with recoverable_errors(f"reading the skipped poison events of follower {name!r}"):
            with self.connection.guard(self.skip_records, write=True):
                documents = list(self.skip_records.find({"follower": name}, max_time_ms=self.max_time_ms)
                                 .sort([("at", ASCENDING), ("_id", ASCENDING)]))
        return [{"position": d["position"], "streamId": d["streamId"], "aggregate": d["aggregate"],
                 "error": d["error"], "by": d["by"], "reason": d["reason"], "at": from_micros(d["at"])}
                for d in documents]

    def gaps(self, name: str) -> list[Gap]:
        """Every gap follower ``name`` skipped, oldest first."""
        with recoverable_errors(f"reading the gaps of follower {name!r}"), self.connection.guard(self.gap_records):
            documents = list(self.gap_records.find({"follower": name}).sort([("at", ASCENDING), ("_id", ASCENDING)]))
        return cast(list[Gap], [gap_from_json(d) for d in documents])  # a gap record is never empty: each a Gap


__all__ = ["MongoFollowerStore", "MongoStreamFeed"]

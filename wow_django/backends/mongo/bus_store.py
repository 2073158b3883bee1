"""The bus records in MongoDB: events, topic consumers, consumptions, inbox, sequences, re-push audit.

Every write is one atomic MongoDB operation whose filter states the condition
it depends on; uniqueness comes from the indexes of :mod:`wow_django.backends.mongo.bus_schema`.
On the embedded engine each operation runs under ``connection.guard`` (its
unique checks and reads are not atomic); the guard is never held across two
operations, so races between them are real on both engines and handled by
the same code.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo import errors as pymongo_errors

from wow_django.backends.mongo import bus_schema as schema
from wow_django.backends.mongo.client import MongoConnection
from wow_django.backends.mongo.errors import DUPLICATE_KEY_CODES, recoverable_errors
from wow_django.backends.mongo.schema import CollectionSpec, SchemaGuard
from wow_django.exceptions import UnacknowledgedWriteError
from wow_django.persistence.bus import (
    SEARCH_KEYS,
    STATUS_REVISION,
    BusStore,
    EventQuery,
    EventStatus,
    check_revision,
    status_revision,
    to_bson_time,
    utcnow,
)

NO_ID = {"_id": 0}
TIME_ORDER = [("occurredAt", ASCENDING), ("eventId", ASCENDING)]
PURGE_ORDER = [("statusAt", ASCENDING), ("eventId", ASCENDING)]
PURGE_FIELDS = {"eventId": 1, "statusAt": 1, "_id": 0}


def purge_order(doc: dict) -> tuple:
    """:data:`PURGE_ORDER` in Python, for merging the rules' reads (a missing statusAt first, as MongoDB sorts
    null before dates)."""
    at = doc.get("statusAt")
    return (at is not None, at or 0, doc["eventId"])


def revision_filter(revision: int) -> Any:
    """The filter of a ``statusRevision``: revision 0 also matches an event without the field.

    ``{"$in": [0, None]}`` matches 0 and a missing field on MongoDB (and null, which no store writes).
    """
    return {"$in": [0, None]} if check_revision(revision) == 0 else revision


def event_filter(query: EventQuery) -> dict:
    """The MongoDB filter of an :class:`EventQuery`."""
    found: dict = {}
    statuses = query.statuses
    if statuses is not None:
        found["status"] = statuses[0] if len(statuses) == 1 else {"$in": list(statuses)}
    if query.topic is not None:
        found["topic"] = query.topic
    if query.service is not None:
        found["initiator.service"] = query.service
    if query.user_id is not None:
        found["initiator.userId"] = query.user_id
    if query.client_request_id is not None:
        found["initiator.clientRequestId"] = query.client_request_id
    if query.trace_id is not None:
        found["traceId"] = query.trace_id
    window: dict = {}
    if query.since is not None:
        window["$gte"] = query.since
    if query.until is not None:
        window["$lt"] = query.until
    if window:
        found["occurredAt"] = window
    if query.sent_before is not None:
        found["lastSentAt"] = {"$lte": to_bson_time(query.sent_before)}
    if query.keys is not None:  # searchKeys_1_occurredAt_-1_eventId_1 (multikey)
        found[SEARCH_KEYS] = query.keys[0] if len(query.keys) == 1 else {"$in": list(query.keys)}
    return found


IN_BATCH = 500  # event ids per $in (a query document stays far below MongoDB's 16 MB)


def _projection(wanted: list[str] | None) -> dict:
    """An event's projection: all of it, or ``wanted`` and its eventId (a projection of no field would be the
    whole document)."""
    return NO_ID if wanted is None else {**{field: 1 for field in wanted}, "eventId": 1, "_id": 0}


def _only(document: dict, wanted: list[str] | None) -> dict:
    """A document read with :func:`_projection`, without the eventId it was not asked for."""
    if wanted is not None and "eventId" not in wanted:
        del document["eventId"]
    return document


class MongoBusStore(BusStore):
    def __init__(self, connection: MongoConnection, database_name: str, *, schema_guard: SchemaGuard,
                 max_time_ms: int = 10_000):
        connection.require_acknowledged('the bus store')
        self.connection = connection
        self.database = connection.database(database_name)
        self.schema_guard = schema_guard
        self.max_time_ms = max_time_ms
        self._collections: dict[str, Any] = {}

    def collection(self, spec: CollectionSpec):
        collection = self._collections.get(spec.name)
        if collection is None:
            # The bus database is shared by the services that talk over the bus
            # (seed 004 §2.1): it is not claimed for one bounded context.
            self.schema_guard.ensure(self.database, spec, claim=False)
            collection = self._collections[spec.name] = self.database[spec.name]
        return collection

    @property
    def events(self):
        return self.collection(schema.EVENTS_SPEC)

    @property
    def topic_consumers(self):
        return self.collection(schema.TOPIC_CONSUMERS_SPEC)

    @property
    def consumptions(self):
        return self.collection(schema.EVENT_CONSUMPTIONS_SPEC)

    @property
    def inbox(self):
        return self.collection(schema.CONSUMER_INBOX_SPEC)

    @property
    def sequences(self):
        return self.collection(schema.CONSUMER_SEQUENCES_SPEC)

    @property
    def repushes(self):
        return self.collection(schema.EVENT_REPUSHES_SPEC)

    def run(self, collection, action: str, fn):
        """Run one operation on ``collection`` with error mapping, the embedded engine's guard and the write
        time limit (reads too: they carry ``maxTimeMS`` already)."""
        with recoverable_errors(action), self.connection.guard(collection, write=True):
            return fn(collection)

    @staticmethod
    def acknowledged(result, what: str):
        if not result.acknowledged:
            raise UnacknowledgedWriteError(f"{what} was not acknowledged; use a write concern of w ≥ 1 for the bus")
        return result

    # --- topic consumers ---------------------------------------------------------

    def enabled_consumers(self, topic: str) -> list[str]:
        docs = self.run(self.topic_consumers, f"reading consumers of {topic}", lambda c: list(
            c.find({"topic": topic, "enabled": True}, {"consumerId": 1, "_id": 0}, max_time_ms=self.max_time_ms)
        ))
        return sorted({d["consumerId"] for d in docs})

    def set_topic_consumer(self, topic: str, consumer_id: str, *, enabled: bool, description: str | None,
                           updated_by: str | None) -> dict:
        now = utcnow()
        update: dict = {"$set": {"enabled": enabled, "updatedAt": now, "updatedBy": updated_by},
                        "$setOnInsert": {"createdAt": now}}
        if description is not None:
            update["$set"]["description"] = description
        else:
            update["$setOnInsert"]["description"] = ""
        for attempt in range(2):
            try:
                return self.run(self.topic_consumers, f"saving topic consumer {topic}/{consumer_id}",
                                lambda c: c.find_one_and_update({"topic": topic, "consumerId": consumer_id}, update,
                                                                projection=NO_ID, upsert=True,
                                                                return_document=ReturnDocument.AFTER))
            except pymongo_errors.DuplicateKeyError:
                if attempt:  # two concurrent upserts: the second one updates
                    raise
        raise AssertionError("unreachable")

    def list_topic_consumers(self, *, topic: str | None = None, consumer_id: str | None = None) -> list[dict]:
        query: dict = {}
        if topic:
            query["topic"] = topic
        if consumer_id:
            query["consumerId"] = consumer_id
        return self.run(self.topic_consumers, "listing topic consumers", lambda c: list(
            c.find(query, NO_ID, max_time_ms=self.max_time_ms).sort([("topic", ASCENDING), ("consumerId", ASCENDING)])
        ))

    # --- events ------------------------------------------------------------------------

    def insert_event(self, document: dict) -> bool:
        document = dict(document)
        try:
            result = self.run(self.events, f"storing event {document['eventId']}", lambda c: c.insert_one(document))
        except pymongo_errors.DuplicateKeyError as exc:
            said = schema.duplicate_on(exc.details, schema.EVENT_ID_UNIQUE)
            if said is False or (said is None and self.get_event(document["eventId"]) is None):
                raise
            return False
        self.acknowledged(result, "storing an event")
        return True

    def get_events(self, event_ids: Iterable[str], fields: Iterable[str] | None = None) -> dict[str, dict]:
        ids = list(dict.fromkeys(event_ids))
        wanted = None if fields is None else list(fields)
        found: dict[str, dict] = {}
        for start in range(0, len(ids), IN_BATCH):
            chunk = ids[start:start + IN_BATCH]
            for document in self.run(self.events, "reading events", lambda c, chunk=chunk: list(
                    c.find({"eventId": {"$in": chunk}}, _projection(wanted), max_time_ms=self.max_time_ms))):
                event_id = document["eventId"]
                found[event_id] = _only(document, wanted)
        return found

    def get_event(self, event_id: str, fields: Iterable[str] | None = None) -> dict | None:
        wanted = None if fields is None else list(fields)
        document = self.run(self.events, f"reading event {event_id}", lambda c: c.find_one(
            {"eventId": event_id}, _projection(wanted), max_time_ms=self.max_time_ms))
        return None if document is None else _only(document, wanted)

    def mark_sent(self, event_id: str, sent_at: datetime) -> bool:
        result = self.run(self.events, f"marking {event_id} sent", lambda c: c.update_one(
            {"eventId": event_id, "status": EventStatus.PENDING.value},
            {"$set": {"status": EventStatus.SENT.value, "statusAt": sent_at, "sentAt": sent_at,
                      "lastSentAt": sent_at, "lastError": None},
             "$inc": {STATUS_REVISION: 1},
             "$unset": {"relayLeaseUntil": ""}}))
        self.acknowledged(result, "marking an event sent")
        if result.matched_count:
            return True
        # Feedback was faster than this update (the rollup already moved it on):
        # record the send time, leave the status alone.
        self.run(self.events, f"recording send time of {event_id}", lambda c: c.update_one(
            {"eventId": event_id, "sentAt": None}, {"$set": {"sentAt": sent_at, "lastSentAt": sent_at}}))
        return False

    def record_send_error(self, event_id: str, error: str) -> None:
        self.run(self.events, f"recording send error of {event_id}", lambda c: c.update_one(
            {"eventId": event_id}, {"$set": {"lastError": error[:2000]}, "$unset": {"relayLeaseUntil": ""}}))

    def stale_pending(self, older_than: datetime, limit: int) -> list[str]:
        docs = self.run(self.events, "finding pending events", lambda c: list(
            c.find({"status": EventStatus.PENDING.value, "statusAt": {"$lte": older_than}}, {"eventId": 1, "_id": 0},
                   max_time_ms=self.max_time_ms).sort([("occurredAt", ASCENDING)]).limit(limit)))
        return [d["eventId"] for d in docs]

    def purge_events(self, *, consumed_before: datetime | None, expired_before: datetime | None,
                     limit: int) -> list[str]:
        if limit <= 0 or (consumed_before is None and expired_before is None):
            return []
        rules: list[dict] = []
        if consumed_before is not None:  # read in order from status_1_statusAt_1_eventId_1
            rules.append({"status": EventStatus.CONSUMED.value, "statusAt": {"$lte": to_bson_time(consumed_before)}})
        if expired_before is not None:  # covered by expireAt_1_statusAt_1_eventId_1 (no null matches $lte)
            rules.append({"expireAt": {"$lte": to_bson_time(expired_before)}})
        match = rules[0] if len(rules) == 1 else {"$or": rules}
        # One query per rule, merged here: a sorted $or has no index giving its order, so the server would
        # fetch every match of both rules to sort them.
        found = [self.run(self.events, "finding events to purge", lambda c, rule=rule: list(
            c.find(rule, PURGE_FIELDS, max_time_ms=self.max_time_ms).sort(PURGE_ORDER).limit(limit)))
            for rule in rules]
        docs: list[dict] = []
        seen: set[str] = set()
        for doc in heapq.merge(*found, key=purge_order):
            if doc["eventId"] not in seen and len(docs) < limit:  # an event both rules match comes once
                seen.add(doc["eventId"])
                docs.append(doc)
        deleted = []
        for doc in docs:  # one by one, each still matching: a re-push in between keeps the event
            result = self.run(self.events, f"purging {doc['eventId']}",
                              lambda c, d=doc: c.delete_one({"eventId": d["eventId"], **match}))
            if result.deleted_count:
                deleted.append(doc["eventId"])
        if deleted:  # its rows after the event: a purge stopped in between leaves rows nobody shows, not an
            # event without its history
            for collection, what in ((self.consumptions, "consumption rows"), (self.inbox, "inbox entries"),
                                     (self.repushes, "re-push audit")):
                self.run(collection, f"purging {what}", lambda c: c.delete_many({"eventId": {"$in": deleted}}))
        return deleted

    # Conditional find-and-modify returns the document *before* the update and
    # the caller applies the (known) change: the embedded engine looks the
    # updated document up again with the original filter, which no longer
    # matches, and would return nothing for ReturnDocument.AFTER.

    def lease_for_relay(self, event_id: str, now: datetime, until: datetime) -> dict | None:
        before = self.run(self.events, f"leasing {event_id} for the relay", lambda c: c.find_one_and_update(
            {"eventId": event_id, "status": EventStatus.PENDING.value,
             "$or": [{"relayLeaseUntil": None}, {"relayLeaseUntil": {"$lte": now}}]},
            {"$set": {"relayLeaseUntil": until}}, projection=NO_ID, return_document=ReturnDocument.BEFORE))
        return None if before is None else {**before, "relayLeaseUntil": until}

    def claim_repush(self, event_id: str, *, now: datetime, max_count: int, statuses: Iterable[str],
                     sent_before: datetime) -> dict | None:
        query = {
            "eventId": event_id,
            "retryCount": {"$lt": max_count},
            "$and": [
                {"$or": [{"status": {"$in": list(statuses)}},
                         {"status": EventStatus.SENT.value, "lastSentAt": {"$lte": sent_before}}]},
                {"$or": [{"expireAt": None}, {"expireAt": {"$gt": now}}]},
            ],
        }
        changes = {"lastSentAt": now, "status": EventStatus.RETRYING.value, "statusAt": now}
        before = self.run(self.events, "claiming a re-push", lambda c: c.find_one_and_update(
            query, {"$inc": {"retryCount": 1, STATUS_REVISION: 1}, "$set": changes}, projection=NO_ID,
            return_document=ReturnDocument.BEFORE))
        if before is None:
            return None
        return {**before, **changes, "retryCount": before.get("retryCount", 0) + 1,
                STATUS_REVISION: status_revision(before) + 1}

    def set_status_if(self, event_id: str, expected_status: str, expected_revision: int, status: str,
                      now: datetime) -> bool:
        revision = revision_filter(expected_revision)
        result = self.run(self.events, f"rolling up {event_id}", lambda c: c.update_one(
            {"eventId": event_id, "status": expected_status, STATUS_REVISION: revision},
            {"$set": {"status": status, "statusAt": now}, "$inc": {STATUS_REVISION: 1}}))
        self.acknowledged(result, "rolling up an event")
        return bool(result.matched_count)

    def find_events(self, query: EventQuery, *, skip: int, limit: int) -> tuple[int, list[dict]]:
        found = event_filter(query)

        def read(c):
            # Unfiltered, the total comes from the collection's metadata instead of a count of every event.
            total = (c.count_documents(found, maxTimeMS=self.max_time_ms) if found
                     else c.estimated_document_count(maxTimeMS=self.max_time_ms))
            docs = list(c.find(found, NO_ID, max_time_ms=self.max_time_ms)
                        .sort([("occurredAt", DESCENDING), ("eventId", ASCENDING)]).skip(skip).limit(limit))
            return total, docs

        return self.run(self.events, "listing events", read)

    def events_after(self, query: EventQuery, *, after: tuple[datetime, str] | None, limit: int) -> list[dict]:
        if limit <= 0:
            return []
        found = event_filter(query)
        conditions = [found, {"occurredAt": {"$ne": None}}]
        if after is not None:
            moment, event_id = to_bson_time(after[0]), after[1]
            # A range the listing index seeks to (an $or of the two cases would scan it from the start).
            conditions.append({"occurredAt": {"$lte": moment}})
            conditions.append({"$nor": [{"occurredAt": moment, "eventId": {"$lte": event_id}}]})
        return self.run(self.events, "listing events", lambda c: list(
            c.find({"$and": conditions}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("occurredAt", DESCENDING), ("eventId", ASCENDING)]).limit(limit)))

    def count_events(self, query: EventQuery, *, up_to: int) -> int:
        if up_to <= 0:
            return 0
        found = event_filter(query)
        return self.run(self.events, "counting events", lambda c: c.count_documents(
            found, limit=up_to, maxTimeMS=self.max_time_ms))

    def events_before(self, query: EventQuery, *, before: tuple[datetime, str], limit: int) -> list[dict]:
        if limit <= 0:
            return []
        moment, event_id = to_bson_time(before[0]), before[1]
        conditions = [event_filter(query), {"occurredAt": {"$ne": None}}, {"occurredAt": {"$gte": moment}},
                      {"$nor": [{"occurredAt": moment, "eventId": {"$gte": event_id}}]}]
        # The listing index read the other way, from the key: the nearest first; then back in the listing order.
        docs = self.run(self.events, "listing events", lambda c: list(
            c.find({"$and": conditions}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("occurredAt", ASCENDING), ("eventId", DESCENDING)]).limit(limit)))
        return docs[::-1]

    def trace_events(self, trace_id: str, limit: int) -> list[dict]:
        return self.run(self.events, f"reading trace {trace_id}", lambda c: list(
            c.find({"traceId": trace_id}, NO_ID, max_time_ms=self.max_time_ms).sort(TIME_ORDER).limit(limit)))

    def children(self, event_id: str, limit: int) -> list[dict]:
        return self.run(self.events, f"reading children of {event_id}", lambda c: list(
            c.find({"parentEventId": event_id}, NO_ID, max_time_ms=self.max_time_ms).sort(TIME_ORDER).limit(limit)))

    # --- consumptions ------------------------------------------------------------------

    def init_consumptions(self, event_id: str, consumers: Iterable[str], now: datetime) -> None:
        rows = [{"eventId": event_id, "consumerId": consumer, "attemptNo": 0, "success": None, "consumedAt": None,
                 "error": None, "source": "send", "createdAt": now} for consumer in consumers]
        if not rows:
            return
        try:
            self.run(self.consumptions, f"initialising feedback of {event_id}",
                     lambda c: c.insert_many(rows, ordered=False))
        except pymongo_errors.BulkWriteError as exc:
            # Rows that exist already (a relay after a crash) are fine; anything else is not.
            other = [e for e in exc.details.get("writeErrors", []) if e.get("code") not in DUPLICATE_KEY_CODES]
            if other or exc.details.get("writeConcernErrors"):
                raise

    def latest_consumption(self, event_id: str, consumer_id: str) -> dict | None:
        return self.run(self.consumptions, f"reading feedback of {event_id}", lambda c: c.find_one(
            {"eventId": event_id, "consumerId": consumer_id}, NO_ID, sort=[("attemptNo", DESCENDING)],
            max_time_ms=self.max_time_ms))

    def latest_consumptions(self, event_id: str) -> dict[str, dict]:
        latest: dict[str, dict] = {}
        for row in self.consumption_rows([event_id]):  # ascending attemptNo: the last one per consumer wins
            latest[row["consumerId"]] = row
        return latest

    def consumption_rows(self, event_ids: Iterable[str]) -> list[dict]:
        ids = list(event_ids)
        return self.run(self.consumptions, "reading feedback", lambda c: list(
            c.find({"eventId": {"$in": ids}}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("eventId", ASCENDING), ("consumerId", ASCENDING), ("attemptNo", ASCENDING)])))

    def consumer_feedback(self, consumer_id: str, *, success: bool | None = None,
                          after: tuple[datetime, str, int] | None = None, limit: int) -> list[dict]:
        if limit <= 0:
            return []
        conditions: list[dict] = [{"consumerId": consumer_id}, {"consumedAt": {"$ne": None}}]
        if success is not None:
            conditions.append({"success": bool(success)})
        if after is not None:
            moment, event_id, attempt_no = to_bson_time(after[0]), after[1], after[2]
            # A range of consumerId_1_consumedAt_-1, less the rows at the key's own time up to the key.
            conditions.append({"consumedAt": {"$lte": moment}})
            conditions.append({"$nor": [{"consumedAt": moment, "$or": [
                {"eventId": {"$lt": event_id}}, {"eventId": event_id, "attemptNo": {"$gte": attempt_no}}]}]})
        return self.run(self.consumptions, f"reading the feedback of {consumer_id}", lambda c: list(
            c.find({"$and": conditions}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("consumedAt", DESCENDING), ("eventId", ASCENDING), ("attemptNo", DESCENDING)]).limit(limit)))

    def insert_attempt(self, row: dict) -> bool:
        try:
            result = self.run(self.consumptions, f"recording feedback of {row['eventId']}",
                              lambda c: c.insert_one(dict(row)))
        except pymongo_errors.DuplicateKeyError as exc:
            said = schema.duplicate_on(exc.details, schema.ATTEMPT_UNIQUE)
            if said is False:
                raise
            if said is None and not self._attempt_taken(row["eventId"], row["consumerId"], row["attemptNo"]):
                raise
            return False
        self.acknowledged(result, "recording feedback")
        return True

    def _attempt_taken(self, event_id: str, consumer_id: str, number: int) -> bool:
        return self.run(self.consumptions, "confirming a duplicate attempt", lambda c: c.find_one(
            {"eventId": event_id, "consumerId": consumer_id, "attemptNo": number}, {"_id": 1})) is not None

    # --- inbox -----------------------------------------------------------------------------

    def inbox_insert(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                     lease_until: datetime) -> bool:
        record = {"consumerId": consumer_id, "eventId": event_id, "state": "processing", "owner": owner,
                  "leaseUntil": lease_until, "claimedAt": now}
        try:
            result = self.run(self.inbox, f"claiming {event_id}", lambda c: c.insert_one(record))
        except pymongo_errors.DuplicateKeyError as exc:
            if schema.duplicate_on(exc.details, schema.INBOX_UNIQUE) is False:
                raise
            return False
        self.acknowledged(result, "claiming an inbox entry")
        return True

    def inbox_take_over(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                        lease_until: datetime) -> bool:
        taken = self.run(self.inbox, f"taking over {event_id}", lambda c: c.find_one_and_update(
            {"consumerId": consumer_id, "eventId": event_id, "state": "processing", "leaseUntil": {"$lte": now}},
            {"$set": {"owner": owner, "leaseUntil": lease_until, "claimedAt": now}},
            projection={"_id": 1}, return_document=ReturnDocument.BEFORE))  # BEFORE: see lease_for_relay
        return taken is not None

    def inbox_state(self, consumer_id: str, event_id: str) -> str | None:
        doc = self.run(self.inbox, f"reading inbox of {event_id}", lambda c: c.find_one(
            {"consumerId": consumer_id, "eventId": event_id}, {"state": 1}))
        return doc["state"] if doc else None

    def inbox_done(self, consumer_id: str, event_id: str, *, owner: str, now: datetime) -> bool:
        result = self.run(self.inbox, f"completing {event_id}", lambda c: c.update_one(
            {"consumerId": consumer_id, "eventId": event_id, "owner": owner},
            {"$set": {"state": "done", "doneAt": now}, "$unset": {"leaseUntil": ""}}))
        self.acknowledged(result, "completing an inbox entry")
        return bool(result.matched_count)

    def inbox_release(self, consumer_id: str, event_id: str, *, owner: str) -> None:
        self.run(self.inbox, f"releasing {event_id}", lambda c: c.delete_one(
            {"consumerId": consumer_id, "eventId": event_id, "owner": owner, "state": "processing"}))

    # --- sequences -------------------------------------------------------------------------

    def last_sequence(self, consumer_id: str, partition_key: str) -> int | None:
        doc = self.run(self.sequences, f"reading sequence of {partition_key}", lambda c: c.find_one(
            {"consumerId": consumer_id, "partitionKey": partition_key}, {"sequence": 1}))
        return doc["sequence"] if doc else None

    def advance_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> None:
        key = {"consumerId": consumer_id, "partitionKey": partition_key}
        update = {"$max": {"sequence": sequence}, "$set": {"updatedAt": now}}
        for attempt in range(2):
            try:
                self.run(self.sequences, f"advancing {partition_key}", lambda c: c.update_one(key, update, upsert=True))
                return
            except pymongo_errors.DuplicateKeyError:
                if attempt:  # two first upserts raced; the second try updates
                    raise

    def accept_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> bool:
        key = {"consumerId": consumer_id, "partitionKey": partition_key}
        newer = {**key, "sequence": {"$lt": sequence}}
        change = {"$set": {"sequence": sequence, "updatedAt": now}}
        action = f"accepting {partition_key}#{sequence}"
        try:
            self.run(self.sequences, action, lambda c: c.update_one(newer, change, upsert=True))
        except pymongo_errors.DuplicateKeyError:
            # The upsert's insert hit the unique key: a document exists now. Either its sequence is ≥ ours
            # (stale), or another first message of this partition inserted a lower one between our filter
            # and our insert (the server does not retry an upsert whose filter is not an equality): the same
            # conditional update, now without the insert, tells which.
            result = self.run(self.sequences, action, lambda c: c.update_one(newer, change))
            return result.matched_count == 1
        return True

    def restore_sequence(self, consumer_id: str, partition_key: str, *, accepted: int, previous: int | None,
                         now: datetime) -> bool:
        match = {"consumerId": consumer_id, "partitionKey": partition_key, "sequence": accepted}
        if previous is None:
            result = self.run(self.sequences, f"restoring {partition_key}", lambda c: c.delete_one(match))
            self.acknowledged(result, "restoring a sequence")
            return result.deleted_count == 1
        result = self.run(self.sequences, f"restoring {partition_key}", lambda c: c.update_one(
            match, {"$set": {"sequence": previous, "updatedAt": now}}))
        self.acknowledged(result, "restoring a sequence")
        return result.matched_count == 1

    # --- re-push audit -----------------------------------------------------------------

    def insert_repush(self, record: dict) -> None:
        result = self.run(self.repushes, "recording a re-push", lambda c: c.insert_one(dict(record)))
        self.acknowledged(result, "recording a re-push")

    def repush_history(self, event_id: str, limit: int = 100) -> list[dict]:
        return self.run(self.repushes, f"reading re-pushes of {event_id}", lambda c: list(
            c.find({"eventId": event_id}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("requestedAt", DESCENDING)]).limit(limit)))

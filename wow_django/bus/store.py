"""The bus records in MongoDB: events, topic consumers, consumptions, inbox, sequences, re-push audit.

Every write is one atomic MongoDB operation whose filter states the condition
it depends on; uniqueness comes from the indexes of :mod:`wow_django.bus.schema`.
On the embedded engine each operation runs under ``connection.guard`` (its
unique checks and reads are not atomic); the guard is never held across two
operations, so races between them are real on both engines and handled by
the same code.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo import errors as pymongo_errors

from wow_django.bus import schema
from wow_django.bus.envelope import EventStatus, utcnow
from wow_django.bus.errors import BusError, ConsumerNotExpected
from wow_django.exceptions import UnacknowledgedWriteError
from wow_django.mongo.client import MongoConnection
from wow_django.mongo.errors import recoverable_errors
from wow_django.mongo.schema import CollectionSpec, SchemaGuard

NO_ID = {"_id": 0}
ATTEMPT_RETRIES = 64


class BusStore:
    def __init__(self, connection: MongoConnection, database_name: str, *, schema_guard: SchemaGuard,
                 max_time_ms: int = 10_000):
        self.connection = connection
        self.database = connection.database(database_name)
        self.schema_guard = schema_guard
        self.max_time_ms = max_time_ms
        self._collections: dict[str, Any] = {}

    def collection(self, spec: CollectionSpec):
        collection = self._collections.get(spec.name)
        if collection is None:
            self.schema_guard.ensure(self.database, spec)
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
        """Run one operation on ``collection`` with error mapping and the embedded engine's guard."""
        with recoverable_errors(action), self.connection.guard(collection):
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
        """Insert an event; False when its eventId exists already (nothing changes then)."""
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

    def get_event(self, event_id: str) -> dict | None:
        return self.run(self.events, f"reading event {event_id}",
                        lambda c: c.find_one({"eventId": event_id}, NO_ID, max_time_ms=self.max_time_ms))

    def get_events(self, event_ids: Iterable[str]) -> list[dict]:
        ids = list(event_ids)
        return self.run(self.events, "reading events", lambda c: list(
            c.find({"eventId": {"$in": ids}}, NO_ID, max_time_ms=self.max_time_ms)))

    def mark_sent(self, event_id: str, sent_at: datetime) -> bool:
        """PENDING → SENT with sentAt/lastSentAt; only the send-side fields. False if it was not PENDING."""
        result = self.run(self.events, f"marking {event_id} sent", lambda c: c.update_one(
            {"eventId": event_id, "status": EventStatus.PENDING.value},
            {"$set": {"status": EventStatus.SENT.value, "statusAt": sent_at, "sentAt": sent_at,
                      "lastSentAt": sent_at, "lastError": None},
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

    # Conditional find-and-modify returns the document *before* the update and
    # the caller applies the (known) change: the embedded engine looks the
    # updated document up again with the original filter, which no longer
    # matches, and would return nothing for ReturnDocument.AFTER.

    def lease_for_relay(self, event_id: str, now: datetime, until: datetime) -> dict | None:
        """Take a PENDING event for one relay run (atomic: concurrent relays do not both publish it)."""
        before = self.run(self.events, f"leasing {event_id} for the relay", lambda c: c.find_one_and_update(
            {"eventId": event_id, "status": EventStatus.PENDING.value,
             "$or": [{"relayLeaseUntil": None}, {"relayLeaseUntil": {"$lte": now}}]},
            {"$set": {"relayLeaseUntil": until}}, projection=NO_ID, return_document=ReturnDocument.BEFORE))
        return None if before is None else {**before, "relayLeaseUntil": until}

    def claim_repush(self, query: dict, now: datetime) -> dict | None:
        """One atomic step: check the re-push conditions in ``query`` and count the re-push."""
        changes = {"lastSentAt": now, "status": EventStatus.RETRYING.value, "statusAt": now}
        before = self.run(self.events, "claiming a re-push", lambda c: c.find_one_and_update(
            query, {"$inc": {"retryCount": 1}, "$set": changes}, projection=NO_ID,
            return_document=ReturnDocument.BEFORE))
        return None if before is None else {**before, **changes, "retryCount": before.get("retryCount", 0) + 1}

    def set_status_if(self, event_id: str, expected_status: str, expected_at: datetime | None, status: str,
                      now: datetime) -> bool:
        """The rollup's only write: ``status`` and ``statusAt``, if nobody changed them since they were read."""
        result = self.run(self.events, f"rolling up {event_id}", lambda c: c.update_one(
            {"eventId": event_id, "status": expected_status, "statusAt": expected_at},
            {"$set": {"status": status, "statusAt": now}}))
        self.acknowledged(result, "rolling up an event")
        return bool(result.matched_count)

    def find_events(self, query: dict, *, skip: int, limit: int) -> tuple[int, list[dict]]:
        def read(c):
            total = c.count_documents(query, maxTimeMS=self.max_time_ms)
            docs = list(c.find(query, NO_ID, max_time_ms=self.max_time_ms)
                        .sort([("occurredAt", DESCENDING), ("eventId", ASCENDING)]).skip(skip).limit(limit))
            return total, docs

        return self.run(self.events, "listing events", read)

    def trace_events(self, trace_id: str, limit: int) -> list[dict]:
        return self.run(self.events, f"reading trace {trace_id}", lambda c: list(
            c.find({"traceId": trace_id}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("occurredAt", ASCENDING), ("eventId", ASCENDING)]).limit(limit)))

    def children(self, event_id: str, limit: int) -> list[dict]:
        return self.run(self.events, f"reading children of {event_id}", lambda c: list(
            c.find({"parentEventId": event_id}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("occurredAt", ASCENDING), ("eventId", ASCENDING)]).limit(limit)))

    # --- consumptions ------------------------------------------------------------------

    def init_consumptions(self, event_id: str, consumers: Iterable[str], now: datetime) -> None:
        """One pending row (attemptNo 0, success null) per expected consumer; existing rows are kept."""
        rows = [{"eventId": event_id, "consumerId": consumer, "attemptNo": 0, "success": None, "consumedAt": None,
                 "error": None, "source": "send", "createdAt": now} for consumer in consumers]
        if not rows:
            return
        try:
            self.run(self.consumptions, f"initialising feedback of {event_id}",
                     lambda c: c.insert_many(rows, ordered=False))
        except pymongo_errors.BulkWriteError as exc:
            # Rows that exist already (a relay after a crash) are fine; anything else is not.
            other = [e for e in exc.details.get("writeErrors", []) if e.get("code") not in (11000, 11001, 12582)]
            if other or exc.details.get("writeConcernErrors"):
                raise

    def latest_consumption(self, event_id: str, consumer_id: str) -> dict | None:
        return self.run(self.consumptions, f"reading feedback of {event_id}", lambda c: c.find_one(
            {"eventId": event_id, "consumerId": consumer_id}, NO_ID, sort=[("attemptNo", DESCENDING)],
            max_time_ms=self.max_time_ms))

    def consumption_rows(self, event_ids: Iterable[str]) -> list[dict]:
        ids = list(event_ids)
        return self.run(self.consumptions, "reading feedback", lambda c: list(
            c.find({"eventId": {"$in": ids}}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("eventId", ASCENDING), ("consumerId", ASCENDING), ("attemptNo", ASCENDING)])))

    def insert_feedback(self, event_id: str, consumer_id: str, fields: dict, *,
                        known_latest: int | None = None) -> dict:
        """Insert a feedback row with the next attemptNo for (eventId, consumerId).

        The number is the latest plus one; two writers that read the same
        latest collide on the unique ``eventId_1_consumerId_1_attemptNo_-1``
        and the loser reads again. ``known_latest`` (an attemptNo the caller
        has just read) saves the first read. Raises :class:`ConsumerNotExpected`
        when the consumer has no row for the event (it was not expected when it was sent).
        """
        for attempt in range(ATTEMPT_RETRIES):
            if attempt == 0 and known_latest is not None:
                number = known_latest + 1
            else:
                latest = self.latest_consumption(event_id, consumer_id)
                if latest is None:
                    raise ConsumerNotExpected(event_id, consumer_id)
                number = latest["attemptNo"] + 1
            row = {"eventId": event_id, "consumerId": consumer_id, "attemptNo": number, **fields}
            try:
                result = self.run(self.consumptions, f"recording feedback of {event_id}",
                                  lambda c, row=row: c.insert_one(dict(row)))
            except pymongo_errors.DuplicateKeyError as exc:
                said = schema.duplicate_on(exc.details, schema.ATTEMPT_UNIQUE)
                if said is False:
                    raise
                if said is None and not self._attempt_taken(event_id, consumer_id, number):
                    raise
                time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
                continue
            self.acknowledged(result, "recording feedback")
            return row
        raise BusError(f"feedback of {consumer_id!r} on {event_id!r}: no free attempt number after "
                       f"{ATTEMPT_RETRIES} tries (too many concurrent writers)")

    def _attempt_taken(self, event_id: str, consumer_id: str, number: int) -> bool:
        return self.run(self.consumptions, "confirming a duplicate attempt", lambda c: c.find_one(
            {"eventId": event_id, "consumerId": consumer_id, "attemptNo": number}, {"_id": 1})) is not None

    # --- re-push audit -----------------------------------------------------------------

    def insert_repush(self, record: dict) -> None:
        result = self.run(self.repushes, "recording a re-push", lambda c: c.insert_one(dict(record)))
        self.acknowledged(result, "recording a re-push")

    def repush_history(self, event_id: str, limit: int = 100) -> list[dict]:
        return self.run(self.repushes, f"reading re-pushes of {event_id}", lambda c: list(
            c.find({"eventId": event_id}, NO_ID, max_time_ms=self.max_time_ms)
            .sort([("requestedAt", DESCENDING)]).limit(limit)))

"""The consumers' idempotent inbox (seed 002): one record per (consumerId, eventId).

A worker **claims** an event before running the handler: an insert that the
unique ``consumerId_1_eventId_1`` index lets only one writer win. The claim has
a lease; a claim whose worker died is taken over once the lease ends. After
the handler succeeds the claim becomes **done**, and any later delivery of the
event to that consumer is recognised and not handled again. A failed handler
**releases** its claim so a retry or a re-push can claim it again.

The inbox records that the handler finished; it cannot make the handler's
own side effects atomic with that record (MongoDB transactions need a replica
set, and handlers may call other systems). A handler whose effect is not
naturally idempotent uses :attr:`ConsumerContext.idempotency_key` (for example
as a command's request id or a unique key), as seed 002 advises.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from pymongo import ReturnDocument
from pymongo import errors as pymongo_errors

from wow_django.bus import schema
from wow_django.bus.envelope import utcnow
from wow_django.bus.store import BusStore

CLAIMED = "claimed"
DONE = "done"
BUSY = "busy"


@dataclass(frozen=True)
class Claim:
    state: str  # claimed, done or busy
    token: str | None = None


class Inbox:
    def __init__(self, store: BusStore, consumer_id: str, *, lease_s: float = 60.0):
        self.store = store
        self.consumer_id = consumer_id
        self.lease = timedelta(seconds=lease_s)

    def _key(self, event_id: str) -> dict:
        return {"consumerId": self.consumer_id, "eventId": event_id}

    def claim(self, event_id: str) -> Claim:
        """Claim ``event_id`` for this consumer: ``claimed`` (run the handler), ``done`` or ``busy``."""
        for _ in range(3):
            claim = self._try_claim(event_id)
            if claim is not None:
                return claim
        return Claim(BUSY)

    def _try_claim(self, event_id: str) -> Claim | None:
        store, key = self.store, self._key(event_id)
        token = uuid.uuid4().hex
        now = utcnow()
        record = {**key, "state": "processing", "owner": token, "leaseUntil": now + self.lease, "claimedAt": now}
        try:
            store.acknowledged(store.run(store.inbox, f"claiming {event_id}", lambda c: c.insert_one(record)),
                               "claiming an inbox entry")
            return Claim(CLAIMED, token)
        except pymongo_errors.DuplicateKeyError as exc:
            if schema.duplicate_on(exc.details, schema.INBOX_UNIQUE) is False:
                raise
        taken = store.run(store.inbox, f"taking over {event_id}", lambda c: c.find_one_and_update(
            {**key, "state": "processing", "leaseUntil": {"$lte": now}},
            {"$set": {"owner": token, "leaseUntil": now + self.lease, "claimedAt": now}},
            projection={"_id": 1}, return_document=ReturnDocument.BEFORE))  # BEFORE: see BusStore.lease_for_relay
        if taken is not None:
            return Claim(CLAIMED, token)
        current = store.run(store.inbox, f"reading inbox of {event_id}", lambda c: c.find_one(key, {"state": 1}))
        if current is not None:
            return Claim(DONE if current["state"] == "done" else BUSY)
        return None  # released between our insert and read: try again

    def done(self, event_id: str, token: str) -> bool:
        """Mark the claim done; False if the claim was lost (its lease ended and another worker took it)."""
        store = self.store
        result = store.run(store.inbox, f"completing {event_id}", lambda c: c.update_one(
            {**self._key(event_id), "owner": token},
            {"$set": {"state": "done", "doneAt": utcnow()}, "$unset": {"leaseUntil": ""}}))
        store.acknowledged(result, "completing an inbox entry")
        return bool(result.matched_count)

    def release(self, event_id: str, token: str) -> None:
        store = self.store
        store.run(store.inbox, f"releasing {event_id}", lambda c: c.delete_one(
            {**self._key(event_id), "owner": token, "state": "processing"}))

    def state(self, event_id: str) -> str | None:
        """``processing``, ``done`` or None."""
        doc = self.store.run(self.store.inbox, f"reading inbox of {event_id}",
                             lambda c: c.find_one(self._key(event_id), {"state": 1}))
        return doc["state"] if doc else None

"""The consumers' idempotent inbox (seed 002): one record per (consumerId, eventId).

A worker **claims** an event before running the handler: an insert that only
one writer wins ((consumerId, eventId) is unique in every bus store; in MongoDB
the ``consumerId_1_eventId_1`` index). The claim has
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

import os
from dataclasses import dataclass
from datetime import timedelta

from wow_django.bus.envelope import utcnow
from wow_django.persistence.bus import InboxRecords

CLAIMED = "claimed"
DONE = "done"
BUSY = "busy"


@dataclass(frozen=True)
class Claim:
    state: str  # claimed, done or busy
    token: str | None = None


class Inbox:
    def __init__(self, store: InboxRecords, consumer_id: str, *, lease_s: float = 60.0):
        self.store = store
        self.consumer_id = consumer_id
        self.lease = timedelta(seconds=lease_s)

    def claim(self, event_id: str) -> Claim:
        """Claim ``event_id`` for this consumer: ``claimed`` (run the handler), ``done`` or ``busy``."""
        for _ in range(3):
            claim = self._try_claim(event_id)
            if claim is not None:
                return claim
        return Claim(BUSY)

    def _try_claim(self, event_id: str) -> Claim | None:
        store = self.store
        token = os.urandom(16).hex()  # as random as a uuid4, without building one
        now = utcnow()
        if store.inbox_insert(self.consumer_id, event_id, owner=token, now=now, lease_until=now + self.lease):
            return Claim(CLAIMED, token)
        if store.inbox_take_over(self.consumer_id, event_id, owner=token, now=now, lease_until=now + self.lease):
            return Claim(CLAIMED, token)
        state = store.inbox_state(self.consumer_id, event_id)
        if state is not None:
            return Claim(DONE if state == "done" else BUSY)
        return None  # released between our insert and read: try again

    def done(self, event_id: str, token: str) -> bool:
        """Mark the claim done; False if the claim was lost (its lease ended and another worker took it)."""
        return self.store.inbox_done(self.consumer_id, event_id, owner=token, now=utcnow())

    def release(self, event_id: str, token: str) -> None:
        self.store.inbox_release(self.consumer_id, event_id, owner=token)

    def state(self, event_id: str) -> str | None:
        """``processing``, ``done`` or None."""
        return self.store.inbox_state(self.consumer_id, event_id)

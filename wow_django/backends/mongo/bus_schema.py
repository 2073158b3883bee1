"""The bus collections and their index names (seed 004 §2.7). Names are a contract: tests pin them.

``event_consumptions`` keys ``{eventId, consumerId, attemptNo}`` are unique: the
seed forbids a unique (eventId, consumerId) — each feedback is a new row — and
a unique attempt number per consumer is what lets concurrent feedback take
distinct numbers without a read-modify-write race.

Besides the seed's three collections the bus keeps: ``consumer_inbox`` (the
consumers' idempotent inbox), ``consumer_sequences`` (last sequence seen per
consumer and partition) and ``event_repushes`` (who re-pushed what, when).
The seed's optional TTL index on ``expireAt`` is not created: the server
would delete the event and leave its consumption rows, inbox entries and
re-push audit behind (a TTL index cannot cascade). Retention is the bus purge
instead (``EventBus.purge``, ``WOW['BUS_RETENTION_DAYS']`` and
``WOW['BUS_EXPIRED_RETENTION_DAYS']``), which deletes an event and everything
about it, the same way on every backend; ``status_1_statusAt_1_eventId_1``,
``expireAt_1_statusAt_1_eventId_1`` and the inbox's ``eventId_1`` serve its reads and deletes
(they replace ``status_1_statusAt_1`` and ``expireAt_1`` of earlier versions, which a deployment
may drop: user indexes are never dropped for it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wow_django.backends.mongo.schema import CollectionSpec, IndexSpec

EVENTS = "events"
TOPIC_CONSUMERS = "topic_consumers"
EVENT_CONSUMPTIONS = "event_consumptions"
CONSUMER_INBOX = "consumer_inbox"
CONSUMER_SEQUENCES = "consumer_sequences"
EVENT_REPUSHES = "event_repushes"

EVENT_ID_UNIQUE = IndexSpec("eventId_1", (("eventId", 1),), unique=True)
ATTEMPT_UNIQUE = IndexSpec(
    "eventId_1_consumerId_1_attemptNo_-1", (("eventId", 1), ("consumerId", 1), ("attemptNo", -1)), unique=True
)
TOPIC_CONSUMER_UNIQUE = IndexSpec("topic_1_consumerId_1", (("topic", 1), ("consumerId", 1)), unique=True)
INBOX_UNIQUE = IndexSpec("consumerId_1_eventId_1", (("consumerId", 1), ("eventId", 1)), unique=True)
SEQUENCE_UNIQUE = IndexSpec("consumerId_1_partitionKey_1", (("consumerId", 1), ("partitionKey", 1)), unique=True)

EVENTS_SPEC = CollectionSpec(EVENTS, (
    EVENT_ID_UNIQUE,
    IndexSpec("status_1_occurredAt_-1", (("status", 1), ("occurredAt", -1))),
    IndexSpec("topic_1_occurredAt_-1", (("topic", 1), ("occurredAt", -1))),
    IndexSpec("traceId_1_occurredAt_1", (("traceId", 1), ("occurredAt", 1))),
    IndexSpec("initiator.service_1_occurredAt_-1", (("initiator.service", 1), ("occurredAt", -1))),
    IndexSpec("parentEventId_1", (("parentEventId", 1),)),
    # The purge, one query per rule in its order (statusAt, eventId): settled events by age (also the
    # relay's stale PENDING events), and expired events by expireAt, covered so that the top-limit sort
    # reads index keys only.
    IndexSpec("status_1_statusAt_1_eventId_1", (("status", 1), ("statusAt", 1), ("eventId", 1))),
    IndexSpec("expireAt_1_statusAt_1_eventId_1", (("expireAt", 1), ("statusAt", 1), ("eventId", 1))),
    # The event list's order (occurredAt newest first, eventId as the tie-break) with and without each
    # filter, so a page (by offset or by cursor) is read from an index instead of sorted in memory.
    IndexSpec("occurredAt_-1_eventId_1", (("occurredAt", -1), ("eventId", 1))),
    IndexSpec("status_1_occurredAt_-1_eventId_1", (("status", 1), ("occurredAt", -1), ("eventId", 1))),
    IndexSpec("topic_1_occurredAt_-1_eventId_1", (("topic", 1), ("occurredAt", -1), ("eventId", 1))),
    IndexSpec("initiator.service_1_occurredAt_-1_eventId_1",
              (("initiator.service", 1), ("occurredAt", -1), ("eventId", 1))),
    # What an operator knows of a request: who made it and its request id.
    IndexSpec("initiator.userId_1_occurredAt_-1_eventId_1",
              (("initiator.userId", 1), ("occurredAt", -1), ("eventId", 1))),
    IndexSpec("initiator.clientRequestId_1_occurredAt_-1_eventId_1",
              (("initiator.clientRequestId", 1), ("occurredAt", -1), ("eventId", 1))),
    # An event's search keys (name=value: payload fields, the aggregate it comes from), one entry per key.
    IndexSpec("searchKeys_1_occurredAt_-1_eventId_1", (("searchKeys", 1), ("occurredAt", -1), ("eventId", 1))),
))
TOPIC_CONSUMERS_SPEC = CollectionSpec(TOPIC_CONSUMERS, (
    TOPIC_CONSUMER_UNIQUE,
    IndexSpec("topic_1_enabled_1", (("topic", 1), ("enabled", 1))),
))
EVENT_CONSUMPTIONS_SPEC = CollectionSpec(EVENT_CONSUMPTIONS, (
    IndexSpec("eventId_1", (("eventId", 1),)),
    ATTEMPT_UNIQUE,
    IndexSpec("eventId_1_consumerId_1_consumedAt_-1", (("eventId", 1), ("consumerId", 1), ("consumedAt", -1))),
    IndexSpec("consumerId_1_consumedAt_-1", (("consumerId", 1), ("consumedAt", -1))),
))
CONSUMER_INBOX_SPEC = CollectionSpec(CONSUMER_INBOX, (INBOX_UNIQUE, IndexSpec("eventId_1", (("eventId", 1),))))
CONSUMER_SEQUENCES_SPEC = CollectionSpec(CONSUMER_SEQUENCES, (SEQUENCE_UNIQUE,))
EVENT_REPUSHES_SPEC = CollectionSpec(EVENT_REPUSHES, (
    IndexSpec("eventId_1_requestedAt_-1", (("eventId", 1), ("requestedAt", -1))),
))

BUS_SPECS = (EVENTS_SPEC, TOPIC_CONSUMERS_SPEC, EVENT_CONSUMPTIONS_SPEC, CONSUMER_INBOX_SPEC,
             CONSUMER_SEQUENCES_SPEC, EVENT_REPUSHES_SPEC)


def duplicate_on(error: Mapping[str, Any] | None, index: IndexSpec) -> bool | None:
    """Whether a duplicate-key error hit ``index``: True/False when the engine said, None when it did not.

    MongoDB reports ``keyPattern`` (and names the index in the message); the
    embedded engine reports neither, so the caller confirms with a read.
    """
    if not error:
        return None
    pattern = error.get("keyPattern")
    if isinstance(pattern, dict) and pattern:
        return set(pattern) == {name for name, _ in index.keys}
    message = str(error.get("errmsg", ""))
    if "index: " in message:
        return f"index: {index.name} " in message
    return None

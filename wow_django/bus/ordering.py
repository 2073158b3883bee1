"""Dropping stale messages by sequence number (seed 002: "cancel arrives before place").

The producer numbers the events of one partition (e.g. the order id and the
aggregate version: ``partitionKey`` and ``sequence`` in the envelope). A
consumer remembers the highest sequence it applied per partition; a message
whose sequence is not above it is stale and is dropped, so an older fact
cannot undo a newer one. Deduplication (the inbox) stops one message from
running twice; this check stops an earlier message from running after a later one.
"""

from __future__ import annotations

from pymongo import errors as pymongo_errors

from wow_django.bus.envelope import utcnow
from wow_django.bus.store import BusStore


def is_stale(last_applied: int | None, sequence: int) -> bool:
    """Whether ``sequence`` is not newer than the last applied one."""
    return last_applied is not None and sequence <= last_applied


class SequenceTracker:
    """The last applied sequence per partition for one consumer (``consumer_sequences``)."""

    def __init__(self, store: BusStore, consumer_id: str):
        self.store = store
        self.consumer_id = consumer_id

    def _key(self, partition_key: str) -> dict:
        return {"consumerId": self.consumer_id, "partitionKey": partition_key}

    def last(self, partition_key: str) -> int | None:
        doc = self.store.run(self.store.sequences, f"reading sequence of {partition_key}",
                             lambda c: c.find_one(self._key(partition_key), {"sequence": 1}))
        return doc["sequence"] if doc else None

    def is_stale(self, partition_key: str, sequence: int) -> bool:
        return is_stale(self.last(partition_key), sequence)

    def advance(self, partition_key: str, sequence: int) -> None:
        """Record ``sequence`` as applied; never lowers the stored value (``$max``)."""
        key = self._key(partition_key)
        update = {"$max": {"sequence": sequence}, "$set": {"updatedAt": utcnow()}}
        for attempt in range(2):
            try:
                self.store.run(self.store.sequences, f"advancing {partition_key}",
                               lambda c: c.update_one(key, update, upsert=True))
                return
            except pymongo_errors.DuplicateKeyError:
                if attempt:  # two first upserts raced; the second try updates
                    raise

    def accept(self, partition_key: str, sequence: int) -> bool:
        """Atomically advance to ``sequence`` if it is newer; False (and no change) if it is stale."""
        key = self._key(partition_key)
        try:
            self.store.run(self.store.sequences, f"accepting {partition_key}#{sequence}", lambda c: c.update_one(
                {**key, "sequence": {"$lt": sequence}},
                {"$set": {"sequence": sequence, "updatedAt": utcnow()}}, upsert=True))
        except pymongo_errors.DuplicateKeyError:
            # The filter missed because the stored sequence is ≥ ours, and the
            # upsert's insert hit the unique key: stale.
            return False
        return True

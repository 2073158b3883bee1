"""Dropping stale messages by sequence number (seed 002: "cancel arrives before place").

The producer numbers the events of one partition (e.g. the order id and the
aggregate version: ``partitionKey`` and ``sequence`` in the envelope). A
consumer remembers the highest sequence it applied per partition; a message
whose sequence is not above it is stale and is dropped, so an older fact
cannot undo a newer one. Deduplication (the inbox) stops one message from
running twice; this check stops an earlier message from running after a later one.
"""

from __future__ import annotations

from wow_django.bus.envelope import utcnow
from wow_django.persistence.bus import SequenceRecords


def is_stale(last_applied: int | None, sequence: int) -> bool:
    """Whether ``sequence`` is not newer than the last applied one."""
    return last_applied is not None and sequence <= last_applied


class SequenceTracker:
    """The last applied sequence per partition for one consumer (``consumer_sequences``)."""

    def __init__(self, store: SequenceRecords, consumer_id: str):
        self.store = store
        self.consumer_id = consumer_id

    def last(self, partition_key: str) -> int | None:
        return self.store.last_sequence(self.consumer_id, partition_key)

    def is_stale(self, partition_key: str, sequence: int) -> bool:
        return is_stale(self.last(partition_key), sequence)

    def advance(self, partition_key: str, sequence: int) -> None:
        """Record ``sequence`` as applied; never lowers the stored value."""
        self.store.advance_sequence(self.consumer_id, partition_key, sequence, utcnow())

    def accept(self, partition_key: str, sequence: int) -> bool:
        """Atomically advance to ``sequence`` if it is newer; False (and no change) if it is stale."""
        return self.store.accept_sequence(self.consumer_id, partition_key, sequence, utcnow())

    def restore(self, partition_key: str, accepted: int, previous: int | None) -> bool:
        """Undo :meth:`accept` after the handling failed, unless a newer sequence was accepted since."""
        return self.store.restore_sequence(self.consumer_id, partition_key, accepted=accepted, previous=previous,
                                           now=utcnow())

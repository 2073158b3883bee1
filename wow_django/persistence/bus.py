"""The bus store contract: events, topic consumers, consumptions, inbox, sequences, re-push audit.

One small ABC per concern: :class:`TopicConsumerRecords`, :class:`EventRecords`,
:class:`ConsumptionRecords`, :class:`InboxRecords`, :class:`SequenceRecords`
and :class:`RepushAudit`. :class:`BusStore` combines them: it is what the
bus, its consumers and its views rely on (a part that needs one concern, such
as the consumers' inbox, asks for that one). The backends are
:class:`~wow_django.backends.mongo.bus_store.MongoBusStore` (MongoDB, the
production store) and :class:`~wow_django.backends.memory.bus_store.InMemoryBusStore`
(one process, nothing persisted). ``WOW['BUS_STORE']`` picks one.
:class:`wow_django.testing.BusStoreContract` (one mixin per concern) proves a
backend keeps the promises made here.

Records are plain dicts with the camelCase keys of seed 004 and naive-UTC
datetimes at millisecond precision (what BSON stores); a record read from a
store is the caller's own copy. Every conditional write is atomic: of two
concurrent writers whose condition holds for both, exactly one wins.

An event's ``statusRevision`` counts the writes of its ``status``: each one
(:meth:`EventRecords.mark_sent`, :meth:`EventRecords.claim_repush`,
:meth:`EventRecords.set_status_if`) adds 1 in the same atomic step, and an
event without the field (stored before it existed, or never written since it
was inserted) is at revision 0. It is the compare-and-set token of the rollup:
unlike ``statusAt`` it tells apart two writes made in the same millisecond.
"""

from __future__ import annotations

import enum
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from wow_django.exceptions import BusError, ConsumerNotExpected


class EventStatus(enum.StrEnum):
    """Statuses of a bus event (seed 004 §2.4)."""

    PENDING = "PENDING"  # stored, not yet confirmed by the broker
    SENT = "SENT"  # published; consumers have not all reported
    CONSUMED = "CONSUMED"  # every expected consumer reported success
    PARTIAL = "PARTIAL"  # some consumers succeeded, some failed
    FAILED = "FAILED"  # consumers failed and none succeeded
    RETRYING = "RETRYING"  # re-pushed, waiting for feedback


def utcnow() -> datetime:
    """Now as a naive UTC datetime at millisecond precision (what BSON stores)."""
    now = datetime.now(UTC)
    return now.replace(tzinfo=None, microsecond=now.microsecond // 1000 * 1000)


def to_bson_time(moment: datetime) -> datetime:
    """``moment`` as naive UTC at millisecond precision (an aware one is converted, a naive one is UTC)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    elif not moment.microsecond % 1000:
        return moment
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


#: An event's search keys as stored: ``name=value`` texts (from the envelope's ``keys``), what
#: :attr:`EventQuery.keys` finds it by; every bus store indexes them with the listing's order.
SEARCH_KEYS = "searchKeys"

#: The field counting the writes of an event's status (see the module docstring).
STATUS_REVISION = "statusRevision"


def status_revision(event: dict) -> int:
    """The ``statusRevision`` of an event read from a store: 0 when it has none."""
    return event.get(STATUS_REVISION) or 0


def check_revision(revision: object) -> int:
    """``revision`` if it is a status revision (an int ≥ 0); TypeError/ValueError otherwise."""
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise TypeError(f"a status revision is an int, got {revision!r}")
    if revision < 0:
        raise ValueError(f"a status revision is never negative, got {revision}")
    return revision


#: Tries :meth:`ConsumptionRecords.insert_feedback` makes before giving up on concurrent writers.
ATTEMPT_RETRIES = 64


@dataclass(frozen=True)
class EventQuery:
    """A filter of ``events``: every given field must match (``None`` = any).

    ``status`` is one status or a tuple of them (any of them matches: ``("FAILED", "PARTIAL")`` is
    "failed for some consumer"); ``service``, ``user_id`` and ``client_request_id`` are the initiator's; ``since`` ≤ ``occurredAt`` < ``until``;
    ``keys``: search keys (``name=value``), any of them in the event's ``searchKeys``;
    ``sent_before``: ``lastSentAt`` ≤ it (an event never published has none and does not match), with
    ``status`` SENT or RETRYING the events not consumed in time (seed 004 §5.2).
    """

    status: str | tuple[str, ...] | None = None
    topic: str | None = None
    service: str | None = None
    trace_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    user_id: str | None = None
    client_request_id: str | None = None
    sent_before: datetime | None = None
    keys: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("topic", "service", "trace_id", "user_id", "client_request_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):  # a dict would be a query operator on MongoDB
                raise TypeError(f"EventQuery.{name}: text or None, got {value!r}")
        if self.status is not None and not isinstance(self.status, str):
            statuses = tuple(self.status)
            if not all(isinstance(status, str) for status in statuses):
                raise TypeError(f"EventQuery.status: a status or a sequence of them, got {self.status!r}")
            object.__setattr__(self, "status", statuses)  # hashable, and equal to the same statuses given otherwise
        if self.keys is not None:
            keys = (self.keys,) if isinstance(self.keys, str) else tuple(self.keys)
            if not keys or not all(isinstance(key, str) for key in keys):
                raise TypeError(f"EventQuery.keys: a non-empty sequence of name=value texts, got {self.keys!r}")
            object.__setattr__(self, "keys", tuple(dict.fromkeys(keys)))
        for name in ("since", "until", "sent_before"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), datetime):
                raise TypeError(f"EventQuery.{name}: a datetime or None, got {getattr(self, name)!r}")

    @property
    def statuses(self) -> tuple[str, ...] | None:
        """The statuses that match (None: any)."""
        if self.status is None:
            return None
        return (self.status,) if isinstance(self.status, str) else tuple(self.status)

    def matches(self, event: dict) -> bool:
        statuses = self.statuses
        if statuses is not None and event.get("status") not in statuses:
            return False
        if self.topic is not None and event.get("topic") != self.topic:
            return False
        if self.service is not None and (event.get("initiator") or {}).get("service") != self.service:
            return False
        if self.trace_id is not None and event.get("traceId") != self.trace_id:
            return False
        initiator = event.get("initiator") or {}
        if self.user_id is not None and initiator.get("userId") != self.user_id:
            return False
        if self.client_request_id is not None and initiator.get("clientRequestId") != self.client_request_id:
            return False
        if self.since is not None or self.until is not None:
            occurred = event.get("occurredAt")
            if not isinstance(occurred, datetime):
                return False
            if self.since is not None and occurred < self.since:
                return False
            if self.until is not None and occurred >= self.until:
                return False
        if self.keys is not None and not set(self.keys) & set(event.get(SEARCH_KEYS) or ()):
            return False
        if self.sent_before is not None:
            sent = event.get("lastSentAt")
            if not isinstance(sent, datetime) or sent > self.sent_before:
                return False
        return True


class TopicConsumerRecords(ABC):
    """``topic_consumers`` (seed 004 §2.3): which consumers expect the events of a topic."""

    @abstractmethod
    def enabled_consumers(self, topic: str) -> list[str]:
        """The consumer ids enabled for ``topic``, sorted."""

    @abstractmethod
    def set_topic_consumer(self, topic: str, consumer_id: str, *, enabled: bool, description: str | None,
                           updated_by: str | None) -> dict:
        """Create or update the one record of (``topic``, ``consumer_id``); returns it.

        Sets ``enabled``, ``updatedAt``, ``updatedBy``; ``createdAt`` only on
        creation; ``description`` when given (``""`` on creation otherwise).
        Concurrent calls for one pair leave one record.
        """

    @abstractmethod
    def list_topic_consumers(self, *, topic: str | None = None, consumer_id: str | None = None) -> list[dict]:
        """Topic-consumer records, filtered by the arguments given, sorted by topic then consumer id."""


class EventRecords(ABC):
    """``events``: the envelopes with their delivery status, and the reads of the views (listing, trace)."""

    @abstractmethod
    def insert_event(self, document: dict) -> bool:
        """Store a new event; False (and nothing changes) when its ``eventId`` exists already."""

    @abstractmethod
    def get_event(self, event_id: str, fields: Iterable[str] | None = None) -> dict | None:
        """The event, or None; with ``fields``, only those of its keys (the ones it has)."""

    @abstractmethod
    def mark_sent(self, event_id: str, sent_at: datetime) -> bool:
        """PENDING → SENT: ``status``, ``statusAt``, ``sentAt``, ``lastSentAt`` = ``sent_at``, ``lastError`` None,
        ``statusRevision`` + 1, the relay lease removed; True.

        If it is no longer PENDING (feedback rolled it up first), only
        ``sentAt`` and ``lastSentAt`` are set, and only when ``sentAt`` is
        unset; False.
        """

    @abstractmethod
    def record_send_error(self, event_id: str, error: str) -> None:
        """Set ``lastError`` (its first 2000 characters) and remove the relay lease."""

    @abstractmethod
    def stale_pending(self, older_than: datetime, limit: int) -> list[str]:
        """Up to ``limit`` eventIds of PENDING events with ``statusAt`` ≤ ``older_than``, oldest
        ``occurredAt`` first."""

    @abstractmethod
    def lease_for_relay(self, event_id: str, now: datetime, until: datetime) -> dict | None:
        """Lease a PENDING event for one relay run: the event with ``relayLeaseUntil`` = ``until``, or None
        when it is not PENDING or another lease runs past ``now``. Atomic: one of concurrent relays gets it."""

    @abstractmethod
    def claim_repush(self, event_id: str, *, now: datetime, max_count: int, statuses: Iterable[str],
                     sent_before: datetime) -> dict | None:
        """Count one re-push if the event may be re-pushed; the updated event, or None.

        Allowed when ``retryCount`` < ``max_count``, the status is one of
        ``statuses`` or it is SENT with ``lastSentAt`` ≤ ``sent_before``, and
        ``expireAt`` is unset or after ``now``. Then, in the same atomic step:
        ``retryCount`` + 1, ``lastSentAt`` and ``statusAt`` = ``now``, status RETRYING,
        ``statusRevision`` + 1 (also when it was RETRYING already).
        """

    @abstractmethod
    def set_status_if(self, event_id: str, expected_status: str, expected_revision: int, status: str,
                      now: datetime) -> bool:
        """Write ``status``, ``statusAt`` = ``now`` and ``statusRevision`` + 1 (nothing else) if the event's
        status and ``statusRevision`` are still ``expected_status`` and ``expected_revision``; whether it did.

        A writer that read the event before another status write is refused,
        even when both happened in the same millisecond.
        """

    @abstractmethod
    def find_events(self, query: EventQuery, *, skip: int, limit: int) -> tuple[int, list[dict]]:
        """``(total matching, page)``: newest ``occurredAt`` first, then by eventId; ``skip`` then ``limit``."""

    @abstractmethod
    def events_after(self, query: EventQuery, *, after: tuple[datetime, str] | None, limit: int) -> list[dict]:
        """Up to ``limit`` events matching ``query`` in :meth:`find_events`' order (newest ``occurredAt``
        first, then by eventId) that come after the key ``after`` = (``occurredAt``, ``eventId``) of the
        last event of the previous page (None: from the first). Keyset paging: it never skips rows and
        counts nothing, so a deep page costs what the first does. Events without ``occurredAt`` are
        left out (every envelope has one)."""

    @abstractmethod
    def count_events(self, query: EventQuery, *, up_to: int) -> int:
        """How many events match ``query``, counting no further than ``up_to`` (``up_to`` means "that many or
        more"): what a listing shows as its total, at a cost bounded by ``up_to`` however many events there are."""

    @abstractmethod
    def events_before(self, query: EventQuery, *, before: tuple[datetime, str], limit: int) -> list[dict]:
        """The previous page of :meth:`events_after`: up to ``limit`` events matching ``query`` that come just
        before the key ``before`` = (``occurredAt``, ``eventId``) in the listing order (the newer ones, the
        nearest ``limit`` of them), given in the listing order. Keyset paging backwards: what a page back
        costs does not grow with the page's depth."""

    @abstractmethod
    def purge_events(self, *, consumed_before: datetime | None, expired_before: datetime | None,
                     limit: int) -> list[str]:
        """Delete up to ``limit`` events the bus is done with, and every row about them; their eventIds.

        Done with: CONSUMED with ``statusAt`` ≤ ``consumed_before``, or (any status)
        ``expireAt`` ≤ ``expired_before``; ``None`` turns a rule off (both off: nothing).
        Each event is deleted only if it still matches when it is deleted (an event
        re-pushed meanwhile is kept, with its history); then its consumption rows,
        inbox entries and re-push audit go. Oldest ``statusAt`` first.
        """

    @abstractmethod
    def trace_events(self, trace_id: str, limit: int) -> list[dict]:
        """Up to ``limit`` events of ``trace_id``, oldest ``occurredAt`` first, then by eventId."""

    @abstractmethod
    def children(self, event_id: str, limit: int) -> list[dict]:
        """Up to ``limit`` events whose ``parentEventId`` is ``event_id``, oldest first, then by eventId."""


class ConsumptionRecords(ABC):
    """``event_consumptions`` (§2.5): append-only feedback rows, one per (eventId, consumerId, attemptNo)."""

    @abstractmethod
    def init_consumptions(self, event_id: str, consumers: Iterable[str], now: datetime) -> None:
        """One pending row (attemptNo 0, success None, source ``send``) per consumer; existing rows are kept."""

    @abstractmethod
    def latest_consumption(self, event_id: str, consumer_id: str) -> dict | None:
        """The consumer's row with the highest attemptNo for the event, or None."""

    @abstractmethod
    def latest_consumptions(self, event_id: str) -> dict[str, dict]:
        """``{consumerId: its row with the highest attemptNo}`` for the event (what the rollup reads)."""

    @abstractmethod
    def consumption_rows(self, event_ids: Iterable[str]) -> list[dict]:
        """Every row of ``event_ids``, sorted by eventId, consumerId, attemptNo."""

    @abstractmethod
    def consumer_feedback(self, consumer_id: str, *, success: bool | None = None,
                          after: tuple[datetime, str, int] | None = None, limit: int) -> list[dict]:
        """Up to ``limit`` feedback rows of ``consumer_id``: what the consumer reported, newest first.

        Only rows with a ``consumedAt`` (a report; the pending row written at send has none), with
        ``success`` only those whose ``success`` is that value. Order: newest ``consumedAt`` first, then
        by eventId, then the highest attemptNo first. ``after`` is the key (``consumedAt``, ``eventId``,
        ``attemptNo``) of the last row of the previous page (None: from the first). Keyset paging on
        the consumerId + consumedAt index of seed 004 §2.7: a deep page costs what the first does.
        """

    @abstractmethod
    def insert_attempt(self, row: dict) -> bool:
        """Insert one feedback row; False (nothing stored) when its (eventId, consumerId, attemptNo) is taken."""

    def insert_feedback(self, event_id: str, consumer_id: str, fields: dict, *,
                        known_latest: int | None = None) -> dict:
        """Insert a feedback row with the next attemptNo for (eventId, consumerId); returns it.

        The number is the latest plus one; two writers that read the same
        latest collide on the unique (eventId, consumerId, attemptNo) and the
        loser reads again. ``known_latest`` (an attemptNo the caller has just
        read) saves the first read. Raises :class:`ConsumerNotExpected` when
        the consumer has no row for the event (it was not expected when it was sent).
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
            if self.insert_attempt(row):
                return row
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
        raise BusError(f"feedback of {consumer_id!r} on {event_id!r}: no free attempt number after "
                       f"{ATTEMPT_RETRIES} tries (too many concurrent writers)")


class InboxRecords(ABC):
    """``consumer_inbox`` (seed 002): one entry per (consumer, event), so a consumer handles an event once."""

    @abstractmethod
    def inbox_insert(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                     lease_until: datetime) -> bool:
        """Create the (consumer, event) entry as ``processing`` by ``owner``; False if it exists."""

    @abstractmethod
    def inbox_take_over(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                        lease_until: datetime) -> bool:
        """Give a ``processing`` entry whose lease ended by ``now`` to ``owner``; whether it did (atomic)."""

    @abstractmethod
    def inbox_state(self, consumer_id: str, event_id: str) -> str | None:
        """``processing``, ``done`` or None."""

    @abstractmethod
    def inbox_done(self, consumer_id: str, event_id: str, *, owner: str, now: datetime) -> bool:
        """Mark the entry ``done`` (lease removed) if ``owner`` holds it; whether it did."""

    @abstractmethod
    def inbox_release(self, consumer_id: str, event_id: str, *, owner: str) -> None:
        """Delete the entry if ``owner`` holds it and it is still ``processing``."""


class SequenceRecords(ABC):
    """``consumer_sequences`` (seed 002): the last applied sequence per consumer and partition key."""

    @abstractmethod
    def last_sequence(self, consumer_id: str, partition_key: str) -> int | None:
        """The last applied sequence, or None."""

    @abstractmethod
    def advance_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> None:
        """Raise the stored sequence to ``sequence``; never lowers it."""

    @abstractmethod
    def accept_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> bool:
        """Store ``sequence`` if it is above the stored one (or none is stored); whether it did (atomic)."""

    @abstractmethod
    def restore_sequence(self, consumer_id: str, partition_key: str, *, accepted: int, previous: int | None,
                         now: datetime) -> bool:
        """Undo an ``accept_sequence`` whose handling failed: back to ``previous`` (None: no record).

        Only while the stored sequence is still ``accepted`` (no newer one came
        since); whether it did (atomic).
        """


class RepushAudit(ABC):
    """``event_repushes`` (§5): who re-pushed what and when."""

    @abstractmethod
    def insert_repush(self, record: dict) -> None:
        """Record who re-pushed what and when (``eventId``, ``requestedAt``, …)."""

    @abstractmethod
    def repush_history(self, event_id: str, limit: int = 100) -> list[dict]:
        """Up to ``limit`` re-push records of the event, newest ``requestedAt`` first."""


class BusStore(TopicConsumerRecords, EventRecords, ConsumptionRecords, InboxRecords, SequenceRecords, RepushAudit):
    """Storage of the bus records: every concern above. Subclasses implement every abstract method.

    The methods below combine them; each has a correct default made of the abstract ones, which a store
    overrides to do the same work in fewer round trips.
    """

    def insert_event_with_consumptions(self, document: dict, now: datetime) -> bool:
        """What ``send`` stores: the new event (:meth:`insert_event`) and, when it was stored, one pending
        feedback row per consumer of its ``consumers`` (:meth:`init_consumptions`, at ``now``). False (and
        nothing changes) when its ``eventId`` exists already. A store that can writes both at once (one
        transaction); by default a crash between the two leaves the rows to the relay, which writes them."""
        if not self.insert_event(document):
            return False
        self.init_consumptions(document["eventId"], document.get("consumers") or (), now)
        return True

    def get_events(self, event_ids: Iterable[str], fields: Iterable[str] | None = None) -> dict[str, dict]:
        """``{eventId: event}`` for those of ``event_ids`` that exist, each as :meth:`get_event` gives it (with
        ``fields``, only those of its keys): what a batch of rollups reads, in one query where the store can."""
        wanted = None if fields is None else list(fields)
        found: dict[str, dict] = {}
        for event_id in dict.fromkeys(event_ids):
            event = self.get_event(event_id, wanted)
            if event is not None:
                found[event_id] = event
        return found

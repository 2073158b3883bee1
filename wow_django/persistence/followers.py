"""The follower contracts: reading a context's event streams by global position, and followers' durable state.

A **follower** (DESIGN G, seed 001) is a named, durable reader of all event
streams of one bounded context that hands them to a handler in commit order,
at least once, from its own checkpoint. Two contracts serve it; every backend
(memory, mongo, django) implements both, and ``wow_django.testing`` holds the
conformance suite that proves it:

:class:`StreamFeed` — the event store read by **position**. Every stored
stream gets a global position, increasing per context, allocated at append
(one extra round trip per append at most, amortised over a batch). A feed
returns only *visible* (committed) streams, so a position may be missing
below the highest visible one:

* where ``gaps_are_final`` is true, the backend allocates positions in commit
  order (the django backend serialises appends per context; the in-memory
  store under its lock): a position missing below a visible one belongs to an
  append that failed and will never appear. Followers pass it at once.
* where it is false (MongoDB: the position comes from a counter before the
  insert), a missing position may be a **late commit** still on its way. The
  follower holds it and re-reads until it appears or ``gap_timeout_s`` has
  passed since it was first seen; then the gap is skipped and recorded
  (:class:`Gap`), visible in the follower's status. A feed may report
  positions it knows to be void (an allocation whose insert failed) in
  :meth:`StreamFeed.void_positions`, so followers need not wait for those.

:class:`FollowerStore` — each follower's checkpoint (the position it has
handled up to), its lease (two running instances of one follower never both
process: the holder renews it, a dead holder's lease expires and another
instance takes over), pause, rewind, its poison event (the error that stopped
it), the gaps it skipped and the audit of skipped poison events. Every write
that moves a follower forward is conditional on the caller holding the lease:
a stale instance whose lease was taken over raises :class:`LeaseLost` and
changes nothing. Every operator's move (rewind, pause, resume, skip) bumps
the follower's **generation**; a checkpoint or poison write names the
generation its batch was read in and is refused (:class:`CheckpointFenced`,
changing nothing) once it changed, so a batch in flight never undoes a
rewind nor moves a paused follower.

Times are aware UTC datetimes; positions are ints ≥ 1 (0 means "before the
first stream").
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from wow_django.exceptions import CheckpointFenced, LeaseLost, UnknownFollower
from wow_django.persistence.contracts import from_micros, to_micros
from wow_django.persistence.records import EventStream


@dataclass(frozen=True, slots=True)
class PositionedStream:
    """A stored stream and its global position in its context."""

    position: int
    stream: EventStream


@dataclass(frozen=True, slots=True)
class Gap:
    """Positions a follower passed without seeing them: ``first``..``last`` (inclusive)."""

    first: int
    last: int
    #: When the follower first saw the gap, and when it gave up waiting.
    seen_at: datetime
    skipped_at: datetime


@dataclass(frozen=True, slots=True)
class PoisonEvent:
    """The stream a follower's handler failed on; the follower stops there until retried or skipped."""

    position: int
    stream_id: str
    aggregate: str  # "name/id"
    error: str
    at: datetime


@dataclass(frozen=True, slots=True)
class FollowerState:
    """What is stored for one follower."""

    name: str
    position: int
    updated_at: datetime
    paused: bool = False
    lease_owner: str | None = None
    lease_until: datetime | None = None
    poison: PoisonEvent | None = None
    gaps_skipped: int = 0
    last_gap: Gap | None = None
    extra: dict = field(default_factory=dict)
    #: Bumped by every rewind, pause, resume and skip: what a checkpoint write is fenced with.
    generation: int = 0


def check_read_args(after: int, limit: int) -> None:
    """``ValueError`` unless ``after`` is an int ≥ 0 and ``limit`` an int ≥ 1 (every feed's :meth:`StreamFeed.read`)."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be an integer ≥ 0, got {after!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer ≥ 1, got {limit!r}")


def check_position(position: int) -> None:
    """``ValueError`` unless ``position`` is an int ≥ 0 (a checkpoint)."""
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be an integer ≥ 0, got {position!r}")


def poison_time(poison: PoisonEvent | None, now: datetime | None) -> datetime:
    """The time :meth:`FollowerStore.set_poison` checks the lease at."""
    if now is not None:
        return now
    return poison.at if poison is not None else datetime.now(UTC)


def gap_to_json(gap: Gap) -> dict:
    """A :class:`Gap` as stored in a document or JSON column (times in epoch microseconds)."""
    return {"first": gap.first, "last": gap.last, "seenAt": to_micros(gap.seen_at),
            "skippedAt": to_micros(gap.skipped_at)}


def gap_from_json(value: dict | None) -> Gap | None:
    if not value:
        return None
    return Gap(first=value["first"], last=value["last"], seen_at=from_micros(value["seenAt"]),
               skipped_at=from_micros(value["skippedAt"]))


def poison_to_json(poison: PoisonEvent) -> dict:
    """A :class:`PoisonEvent` as stored (its time in epoch microseconds)."""
    return {"position": poison.position, "streamId": poison.stream_id, "aggregate": poison.aggregate,
            "error": poison.error, "at": to_micros(poison.at)}


def poison_from_json(value: dict | None) -> PoisonEvent | None:
    if not value:
        return None
    return PoisonEvent(position=value["position"], stream_id=value["streamId"], aggregate=value["aggregate"],
                       error=value["error"], at=from_micros(value["at"]))


class AppendNotifier:
    """Wakes the waiters of one process when an event store of this process stored streams.

    A store that has one calls :meth:`notify` after each successful append; a
    feed over that store exposes it as :attr:`StreamFeed.notifier`, so a
    follower that is live waits for the next append instead of polling.
    Appends of other processes are not seen: followers back off for those.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._count = 0

    @property
    def count(self) -> int:
        """How many notifications so far: pass it to :meth:`wait`."""
        return self._count

    def notify(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Block until a notification after the ``seen``-th or ``timeout`` s; True when notified."""
        with self._condition:
            return self._condition.wait_for(lambda: self._count != seen, timeout)


class StreamFeed(ABC):
    """One context's event streams in position order (see the module docstring)."""

    @property
    def gaps_are_final(self) -> bool:
        """Whether a position missing below a visible one can never appear later (a subclass may answer with a
        class attribute, or a property that asks its server)."""
        return False

    #: Notified after each append of this process to the feed's store; None: followers poll with backoff.
    notifier: AppendNotifier | None = None

    @abstractmethod
    def read(self, after: int, limit: int) -> list[PositionedStream]:
        """The visible streams of this context with position > ``after``, ascending, at most ``limit``."""

    @abstractmethod
    def head(self) -> int:
        """The highest position in this context (0 when none): what the lag is measured against.

        A backend that allocates positions before the insert commits (MongoDB) reports the highest
        *visible* one, so a refused append's position never counts as lag.
        """

    @abstractmethod
    def position_at(self, time: datetime) -> int:
        """The highest position of a visible stream created before ``time`` (0 when none): rewind by time."""

    @abstractmethod
    def count_between(self, after: int, upto: int) -> int:
        """How many visible streams have ``after`` < position ≤ ``upto``: what a rewind will replay."""

    @abstractmethod
    def position_of(self, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        """The position of the stream of aggregate ``aggregate_name``/``aggregate_id`` at ``version``, or None
        when it is not stored (or not visible yet): what ``PROJECTED`` waits for the projections to pass."""

    def start_watching(self) -> None:
        """Called by every follower that starts running. A feed that can learn of other processes' appends
        (MongoDB's change streams) starts listening, once per feed, and notifies :attr:`notifier`; the
        default does nothing (followers back off between reads)."""

    def change_status(self) -> str | None:
        """How this feed learns of other processes' appends, for operators; None: it does not."""
        return None

    def void_positions(self, after: int, upto: int) -> Iterable[int]:
        """Positions in (``after``, ``upto``] known never to hold a stream (allocated, insert failed)."""
        return ()

    def created_at(self, position: int) -> datetime | None:
        """When the stream at ``position`` was stored, if it is visible: the lag in seconds."""
        streams = self.read(position - 1, 1)
        if not streams or streams[0].position != position:
            return None
        return datetime.fromtimestamp(streams[0].stream.create_time / 1000, UTC)


class FollowerStore(ABC):
    """Followers' durable state (see the module docstring)."""

    #: The Django database alias the state lives in, when it is one (django backend): a transactional
    #: follower's handler writes and the checkpoint then commit in one ``transaction.atomic(using=...)``.
    database_alias: str | None = None

    @abstractmethod
    def get(self, name: str) -> FollowerState | None:
        """The follower's state, or None when it never ran."""

    @abstractmethod
    def all(self) -> list[FollowerState]:
        """Every follower's state, by name."""

    @abstractmethod
    def acquire(self, name: str, owner: str, lease_s: float, *, now: datetime) -> bool:
        """Take or renew the lease of ``name`` for ``owner`` until ``now + lease_s``.

        Creates the follower at position 0 when it has no state. True when
        ``owner`` holds the lease afterwards: it was free, expired, or already
        ``owner``'s. Atomic: of two owners acquiring at once, one wins.
        """

    @abstractmethod
    def release(self, name: str, owner: str) -> None:
        """Give the lease up if ``owner`` holds it (another instance may take over at once)."""

    @abstractmethod
    def advance(self, name: str, owner: str, position: int, *, now: datetime, gaps: tuple[Gap, ...] = (),
                generation: int | None = None) -> None:
        """Move the checkpoint forward to ``position`` and record ``gaps`` skipped on the way.

        Raises :class:`LeaseLost` (changing nothing) unless ``owner`` holds an
        unexpired lease, and :class:`CheckpointFenced` (changing nothing) when
        ``generation`` is given and is no longer the stored one (a rewind, a
        pause since the batch was read). Never moves backwards: a ``position``
        ≤ the stored one changes nothing but the gaps.
        """

    @abstractmethod
    def set_poison(self, name: str, owner: str, poison: PoisonEvent | None, *, now: datetime | None = None,
                   generation: int | None = None) -> None:
        """Record (or clear, with None) the event the follower stopped on. :class:`LeaseLost` and
        :class:`CheckpointFenced` as :meth:`advance`.

        The lease is checked at ``now``; None means ``poison.at`` (or the real now when clearing):
        see :func:`poison_time`.
        """

    @abstractmethod
    def set_paused(self, name: str, paused: bool) -> None:
        """Pause or resume: a paused follower's instances hold no batch (they keep waiting); bumps the
        generation, so the checkpoint of a batch in flight is refused. :class:`UnknownFollower`."""

    @abstractmethod
    def rewind(self, name: str, position: int, *, now: datetime) -> None:
        """Set the checkpoint to ``position`` (backwards or forwards), clear the poison event and bump the
        generation (a batch in flight cannot checkpoint over the rewind).

        Whoever holds the lease keeps it; its next batch reads from the new
        position. :class:`UnknownFollower` when the follower never ran.
        """

    @abstractmethod
    def skip_poison(self, name: str, *, by: str, reason: str, now: datetime) -> PoisonEvent:
        """Pass the poison event: the checkpoint moves to its position, an audit record keeps who, why and
        what; bumps the generation.

        Raises :class:`UnknownFollower`, or ``ValueError`` when the follower is
        not stopped on a poison event.
        """

    @abstractmethod
    def skipped(self, name: str) -> list[dict]:
        """The audit of skipped poison events, oldest first: ``position``, ``streamId``, ``aggregate``,
        ``error``, ``by``, ``reason``, ``at``."""

    def close(self) -> None:
        """Release resources (connections, threads); the default has none."""


__all__ = ["AppendNotifier", "CheckpointFenced", "FollowerState", "FollowerStore", "Gap", "LeaseLost", "PoisonEvent", "PositionedStream", "StreamFeed",
           "UnknownFollower", "check_position", "check_read_args", "from_micros", "gap_from_json", "gap_to_json",
           "poison_from_json", "poison_time", "poison_to_json", "to_micros"]

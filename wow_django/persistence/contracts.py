"""The storage contracts every backend implements.

Backends own document shape, uniqueness and atomicity; callers rely only on
what these docstrings promise. ``wow_django.testing`` holds the conformance
suite that proves a backend keeps the promises.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

from wow_django.exceptions import EventStoreError, KeyAlreadyPrepared, KeyNotHeld
from wow_django.persistence.records import FOREVER, MAX_VERSION, AggregateId, EventStream, PreparedValue, Snapshot


def check_version_range(head_version: int, tail_version: int) -> None:
    """Raise ``ValueError`` unless ``1 ≤ head_version ≤ tail_version``."""
    for name, value in (("head_version", head_version), ("tail_version", tail_version)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if head_version < 1:
        raise ValueError(f"head_version must be ≥ 1, got {head_version}")
    if tail_version < head_version:
        raise ValueError(
            f"tail_version ({tail_version}) must be ≥ head_version ({head_version})"
        )


def check_time_range(start_time: int, end_time: int) -> None:
    for name, value in (("start_time", start_time), ("end_time", end_time)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be epoch milliseconds (an integer ≥ 0), got {value!r}")
    if end_time < start_time:
        raise ValueError(f"end_time ({end_time}) must be ≥ start_time ({start_time})")


def check_scan_args(after_id: str, limit: int) -> None:
    if not isinstance(after_id, str):
        raise ValueError(f"after_id must be a string, got {after_id!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an integer ≥ 1, got {limit!r}")


class EventStore(ABC):
    """Append-only store of event streams, one collection per aggregate type."""

    @abstractmethod
    def append(self, stream: EventStream) -> None:
        """Store ``stream`` or raise.

        Raises ``DuplicateAggregateId`` (version 1 taken), ``EventVersionConflict``
        (version taken), ``DuplicateRequestId`` (request id already stored),
        ``RecoverableStoreError`` (transient; retry with the same request id) or
        ``UnacknowledgedWriteError``. Nothing is stored when it raises one of
        the first three.
        """

    def append_many(self, streams: Sequence[EventStream]) -> list[Exception | None]:
        """Append independent streams; one result per stream (``None`` = stored).

        Unordered: a failing stream does not stop the others.
        """
        results: list[Exception | None] = []
        for stream in streams:
            try:
                self.append(stream)
            except EventStoreError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    # Reads of one aggregate (load, load_by_time, last, get_by_request_id) find its streams only under the
    # tenant of ``aggregate_id``: another tenant's aggregate id finds nothing, whatever the caller checks.

    @abstractmethod
    def load(
        self, aggregate_id: AggregateId, head_version: int = 1, tail_version: int = MAX_VERSION
    ) -> list[EventStream]:
        """Streams with ``head_version ≤ version ≤ tail_version`` in version order.

        ``ValueError`` when ``head_version < 1`` or ``tail_version < head_version``;
        an unknown aggregate (or another tenant's) gives an empty list.
        """

    @abstractmethod
    def load_by_time(self, aggregate_id: AggregateId, start_time: int, end_time: int) -> list[EventStream]:
        """Streams created in ``[start_time, end_time]`` (epoch ms) in version order."""

    @abstractmethod
    def last(self, aggregate_id: AggregateId) -> EventStream | None:
        """The stream with the highest version, or ``None``."""

    @abstractmethod
    def locate(self, aggregate_name: str, aggregate_id: str) -> AggregateId | None:
        """The full id (context, tenant) an aggregate id is stored under, or ``None``.

        For system callers that are given a bare id (a snapshot task, the console, a
        rebuild); request paths know the tenant and pass it instead.
        """

    @abstractmethod
    def scan_aggregate_ids(
        self,
        aggregate_name: str,
        after_id: str = "",
        limit: int = 100,
        *,
        context_name: str | None = None,
        tenant_id: str | None = None,
    ) -> list[AggregateId]:
        """Up to ``limit`` aggregate ids ``> after_id`` in lexicographic order, each once."""

    @abstractmethod
    def exists_request_id(self, aggregate_name: str, request_id: str, aggregate_id: str | None = None) -> bool:
        """Whether a stream with ``request_id`` exists (for one aggregate when given)."""

    @abstractmethod
    def get_by_request_id(self, aggregate_id: AggregateId, request_id: str) -> EventStream | None:
        """The stream one aggregate stored for ``request_id``, or ``None``."""

    def deadline(self, seconds: float | None) -> AbstractContextManager:
        """A block whose storage work (this store's and the other stores' of the same engine) must end
        within ``seconds``, or raise a timeout (a ``RecoverableStoreError``); None: unbounded.

        MongoDB: pymongo's client-side operation timeout. Engines without one: no bound here (their
        own statement timeouts apply).
        """
        return contextlib.nullcontext()

    def iter_all(self, aggregate_name: str, *, batch: int = 500) -> Iterator[AggregateId]:
        """Every aggregate id of a type, by repeated scans."""
        after = ""
        while True:
            ids = self.scan_aggregate_ids(aggregate_name, after, batch)
            yield from ids
            if len(ids) < batch:
                return
            after = ids[-1].id

    def close(self) -> None:
        """Release background resources (batching threads)."""


class SnapshotStore(ABC):
    """Latest state per aggregate; saves are version-guarded."""

    @abstractmethod
    def load(self, aggregate_id: AggregateId) -> Snapshot | None:
        """The stored snapshot, or ``None`` (also when it is another tenant's than ``aggregate_id`` says)."""

    @abstractmethod
    def save(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` unless a higher version is stored (atomically).

        A candidate with the same version replaces the stored one; an older
        candidate is a no-op; a stored version that is missing or not an
        integer is replaced. Concurrent saves leave the highest version.
        """

    def load_with_tail(self, aggregate_id: AggregateId, event_store: EventStore
                       ) -> tuple[Snapshot | None, list[EventStream]] | None:
        """The snapshot (as :meth:`load`) and the streams after it (as ``event_store.load(aggregate_id,
        version + 1)``, from version 1 without a snapshot) read together, in one round trip where the
        store can; ``None`` when it cannot for this ``event_store`` (the default): the caller reads both."""
        return None

    def save_many(self, snapshots: Sequence[Snapshot]) -> None:
        """:meth:`save` of each of ``snapshots`` (a store may do it in fewer round trips). Raises the first
        error; the snapshots of a call that raised may be stored in part (each save stays guarded, so
        saving them again is safe)."""
        for snapshot in snapshots:
            self.save(snapshot)

    def close(self) -> None:
        """Release resources."""


#: A clock: returns the current time as an aware UTC datetime.
Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The real clock: now, aware UTC."""
    return datetime.now(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(moment: datetime) -> int:
    """An aware datetime as epoch microseconds (exact): how the django and Mongo stores keep times they
    compare in their statements (leases, expiries)."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def resolve_ttl(ttl: timedelta | datetime | None, now: datetime | None = None) -> datetime:
    """The UTC end of a reservation: ``None`` → forever, a timedelta → from ``now`` (default: the real now)."""
    if ttl is None:
        return FOREVER
    if isinstance(ttl, timedelta):
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        return (system_clock() if now is None else now) + ttl
    if isinstance(ttl, datetime):
        if ttl.tzinfo is None:
            raise ValueError("ttl datetime must be timezone-aware")
        return ttl.astimezone(UTC)
    raise ValueError(f"ttl must be a timedelta, an aware datetime or None, got {ttl!r}")


def check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"prepare key must be a non-empty string, got {key!r}")


#: The default of an optional argument that may itself be ``None`` (``rollback``'s value, ``change_key``'s
#: old value): "not given", distinct from every value. Backends implementing the contract use it too.
NOT_GIVEN: Any = object()


class PrepareKey(ABC):
    """Reservations of unique keys (e.g. usernames) with an expiry.

    A key is *taken* while a reservation exists and has not expired.
    ``clock`` (default: the real clock) is the store's now: it decides
    expiry and computes the end of a reservation given as a timedelta.
    """

    def __init__(self, name: str, *, clock: Clock | None = None):
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"prepare key name must be letters, digits, '_' or '-', got {name!r}")
        self.name = name
        self.clock: Clock = system_clock if clock is None else clock

    def now(self) -> datetime:
        """The clock's now, aware UTC."""
        moment = self.clock()
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise ValueError(f"the clock of prepare key {self.name!r} must return an aware datetime, got {moment!r}")
        return moment.astimezone(UTC)

    @abstractmethod
    def prepare(self, key: str, value: Any, ttl: timedelta | datetime | None = None) -> bool:
        """Reserve ``key`` for ``value``; ``False`` when it is taken."""

    @abstractmethod
    def get(self, key: str) -> PreparedValue | None:
        """The live reservation of ``key``, or ``None`` (missing or expired)."""

    @abstractmethod
    def rollback(self, key: str, value: Any = NOT_GIVEN) -> bool:
        """Release a live reservation (only if it holds ``value`` when given)."""

    @abstractmethod
    def reprepare(
        self, key: str, new_value: Any, *, old_value: Any = NOT_GIVEN, ttl: timedelta | datetime | None = None
    ) -> bool:
        """Replace the value of a live reservation (only if it holds ``old_value`` when given)."""

    def change_key(self, old_key: str, old_value: Any, new_key: str, new_value: Any,
                   ttl: timedelta | datetime | None = None) -> bool:
        """Move a reservation to another key (a username change), by Wow's rules: take ``new_key`` for
        ``new_value``, then release ``old_key``, which must hold ``old_value``. True when moved.

        - ``new_key`` equal to ``old_key``: ``ValueError`` (to replace a value in place, :meth:`reprepare`).
        - ``new_key`` taken: False, and ``old_key`` is kept (nothing changes).
        - ``old_key`` missing, expired or holding another value: ``KeyNotHeld``, and ``new_key`` is released
          again (nothing changes).
        """
        check_key(old_key)
        check_key(new_key)
        if old_key == new_key:
            raise ValueError(f"change_key moves a reservation to another key; {old_key!r} is both the old and "
                             "the new key (use reprepare to replace its value)")
        if not self.prepare(new_key, new_value, ttl):
            return False
        if not self.rollback(old_key, old_value):
            self.rollback(new_key, new_value)
            raise KeyNotHeld(self.name, old_key, new_key)
        return True

    @contextlib.contextmanager
    def using_prepare(self, key: str, value: Any, ttl: timedelta | datetime | None = None) -> Iterator[PreparedValue]:
        """Reserve ``key`` for the block; roll it back if the block raises.

        Raises ``KeyAlreadyPrepared`` when the key is taken.
        """
        ttl_at = resolve_ttl(ttl, self.now())
        if not self.prepare(key, value, ttl_at):
            raise KeyAlreadyPrepared(self.name, key)
        try:
            yield PreparedValue(value, ttl_at)
        except BaseException:
            self.rollback(key, value)
            raise


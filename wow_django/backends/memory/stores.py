"""In-memory backends: one process, nothing persisted. For tests and demos."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from wow_django.exceptions import (
    DuplicateAggregateId,
    DuplicateEventStreamId,
    DuplicateRequestId,
    EventVersionConflict,
)
from wow_django.persistence.contracts import (
    NOT_GIVEN,
    Clock,
    EventStore,
    PrepareKey,
    SnapshotStore,
    check_key,
    check_scan_args,
    check_time_range,
    check_version_range,
    resolve_ttl,
)
from wow_django.persistence.followers import AppendNotifier, PositionedStream
from wow_django.persistence.records import MAX_VERSION, AggregateId, EventStream, PreparedValue, Snapshot


class _Aggregate:
    __slots__ = ("versions", "streams", "request_ids")

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.streams: list[EventStream] = []
        self.request_ids: dict[str, EventStream] = {}


class InMemoryEventStore(EventStore):
    """Event streams in dicts guarded by one lock.

    ``request_id_index`` mirrors the Mongo setting: ``"aggregate"`` makes a
    request id unique per aggregate, ``"global"`` per aggregate type.
    """

    def __init__(self, request_id_index: str = "aggregate"):
        if request_id_index not in ("aggregate", "global"):
            raise ValueError(f"request_id_index must be 'aggregate' or 'global', got {request_id_index!r}")
        self._global_request_ids = request_id_index == "global"
        self._lock = threading.Lock()
        # aggregate name → aggregate id → _Aggregate
        self._aggregates: dict[str, dict[str, _Aggregate]] = {}
        # aggregate name → sorted aggregate ids (for scans)
        self._sorted_ids: dict[str, list[str]] = {}
        # aggregate name → request id → stream (global mode only)
        self._request_ids: dict[str, dict[str, EventStream]] = {}
        self._stream_ids: set[tuple[str, str]] = set()
        # context name → its streams in append order; a stream's position is its index + 1 (gapless: a
        # refused append takes none, and positions are taken under the lock, so in commit order).
        self._positioned: dict[str, list[PositionedStream]] = {}
        # (context, aggregate name, aggregate id, version) → position
        self._position_of: dict[tuple[str, str, str, int], int] = {}
        self.append_notifier = AppendNotifier()

    def _check(self, stream: EventStream) -> Exception | None:
        agg = stream.aggregate_id
        by_id = self._aggregates.get(agg.aggregate_name)
        record = by_id.get(agg.id) if by_id else None
        if record is not None:
            index = bisect.bisect_left(record.versions, stream.version)
            if index < len(record.versions) and record.versions[index] == stream.version:
                if stream.version == 1:
                    return DuplicateAggregateId(agg.aggregate_name, agg.id)
                return EventVersionConflict(agg.aggregate_name, agg.id, stream.version)
        if self._global_request_ids:
            taken = stream.request_id in self._request_ids.get(agg.aggregate_name, ())
        else:
            taken = record is not None and stream.request_id in record.request_ids
        if taken:
            return DuplicateRequestId(agg.aggregate_name, agg.id, stream.request_id)
        if (agg.aggregate_name, stream.id) in self._stream_ids:
            return DuplicateEventStreamId(f"event stream {stream.id!r} was already appended")
        return None

    def _store(self, stream: EventStream) -> None:
        agg = stream.aggregate_id
        by_id = self._aggregates.setdefault(agg.aggregate_name, {})
        record = by_id.get(agg.id)
        if record is None:
            record = by_id[agg.id] = _Aggregate()
            bisect.insort(self._sorted_ids.setdefault(agg.aggregate_name, []), agg.id)
        if not record.versions or stream.version > record.versions[-1]:
            record.versions.append(stream.version)
            record.streams.append(stream)
        else:
            index = bisect.bisect_left(record.versions, stream.version)
            record.versions.insert(index, stream.version)
            record.streams.insert(index, stream)
        record.request_ids[stream.request_id] = stream
        if self._global_request_ids:
            self._request_ids.setdefault(agg.aggregate_name, {})[stream.request_id] = stream
        self._stream_ids.add((agg.aggregate_name, stream.id))
        positioned = self._positioned.setdefault(agg.context_name, [])
        positioned.append(PositionedStream(len(positioned) + 1, stream))
        self._position_of[(agg.context_name, agg.aggregate_name, agg.id, stream.version)] = len(positioned)

    def append(self, stream: EventStream) -> None:
        with self._lock:
            error = self._check(stream)
            if error is not None:
                raise error
            self._store(stream)
        self.append_notifier.notify()

    def append_many(self, streams: Sequence[EventStream]) -> list[Exception | None]:
        results: list[Exception | None] = []
        with self._lock:
            for stream in streams:
                error = self._check(stream)
                if error is None:
                    self._store(stream)
                results.append(error)
        if any(result is None for result in results):
            self.append_notifier.notify()
        return results

    def positioned(self, context_name: str, after: int, limit: int) -> list[PositionedStream]:
        """The streams of one context with position > ``after``, ascending, at most ``limit`` (followers)."""
        with self._lock:
            streams = self._positioned.get(context_name, [])
            start = max(after, 0)
            return streams[start:start + limit]

    def position_of(self, context_name: str, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        """The position of one stored stream, or None."""
        with self._lock:
            return self._position_of.get((context_name, aggregate_name, aggregate_id, version))

    def positioned_all(self, context_name: str) -> list[PositionedStream]:
        """Every stream of one context in position order."""
        with self._lock:
            return list(self._positioned.get(context_name, []))

    def _record(self, aggregate_id: AggregateId) -> _Aggregate | None:
        """One aggregate's record, if it is the tenant's of ``aggregate_id`` (another tenant's id finds nothing)."""
        by_id = self._aggregates.get(aggregate_id.aggregate_name)
        record = by_id.get(aggregate_id.id) if by_id else None
        if record is None or not record.streams or record.streams[0].aggregate_id.tenant_id != aggregate_id.tenant_id:
            return None
        return record

    def load(
        self, aggregate_id: AggregateId, head_version: int = 1, tail_version: int = MAX_VERSION
    ) -> list[EventStream]:
        check_version_range(head_version, tail_version)
        with self._lock:
            record = self._record(aggregate_id)
            if record is None:
                return []
            start = bisect.bisect_left(record.versions, head_version)
            end = bisect.bisect_right(record.versions, tail_version)
            return record.streams[start:end]

    def load_by_time(self, aggregate_id: AggregateId, start_time: int, end_time: int) -> list[EventStream]:
        check_time_range(start_time, end_time)
        with self._lock:
            record = self._record(aggregate_id)
            streams = list(record.streams) if record else []
        return [s for s in streams if start_time <= s.create_time <= end_time]

    def last(self, aggregate_id: AggregateId) -> EventStream | None:
        with self._lock:
            record = self._record(aggregate_id)
            return record.streams[-1] if record and record.streams else None

    def scan_aggregate_ids(
        self,
        aggregate_name: str,
        after_id: str = "",
        limit: int = 100,
        *,
        context_name: str | None = None,
        tenant_id: str | None = None,
    ) -> list[AggregateId]:
        check_scan_args(after_id, limit)
        found: list[AggregateId] = []
        with self._lock:
            ids = self._sorted_ids.get(aggregate_name, [])
            by_id = self._aggregates.get(aggregate_name, {})
            for index in range(bisect.bisect_right(ids, after_id), len(ids)):
                first = by_id[ids[index]].streams[0].aggregate_id
                if context_name is not None and first.context_name != context_name:
                    continue
                if tenant_id is not None and first.tenant_id != tenant_id:
                    continue
                found.append(first)
                if len(found) == limit:
                    break
        return found

    def exists_request_id(self, aggregate_name: str, request_id: str, aggregate_id: str | None = None) -> bool:
        with self._lock:
            by_id = self._aggregates.get(aggregate_name, {})
            if aggregate_id is not None:
                record = by_id.get(aggregate_id)
                return record is not None and request_id in record.request_ids
            return any(request_id in record.request_ids for record in by_id.values())

    def get_by_request_id(self, aggregate_id: AggregateId, request_id: str) -> EventStream | None:
        with self._lock:
            record = self._record(aggregate_id)
            return record.request_ids.get(request_id) if record else None

    def locate(self, aggregate_name: str, aggregate_id: str) -> AggregateId | None:
        with self._lock:
            by_id = self._aggregates.get(aggregate_name)
            record = by_id.get(aggregate_id) if by_id else None
            return record.streams[0].aggregate_id if record and record.streams else None

    def all_streams(self, aggregate_name: str) -> list[EventStream]:
        """Every stream of one aggregate type (for the in-memory query service)."""
        with self._lock:
            return [s for record in self._aggregates.get(aggregate_name, {}).values() for s in record.streams]


class InMemorySnapshotStore(SnapshotStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[tuple[str, str], Snapshot] = {}

    def load(self, aggregate_id: AggregateId) -> Snapshot | None:
        found = self._snapshots.get((aggregate_id.aggregate_name, aggregate_id.id))
        # Another tenant's aggregate id finds nothing (defence in depth behind the callers).
        return found if found is not None and found.aggregate_id.tenant_id == aggregate_id.tenant_id else None

    def save(self, snapshot: Snapshot) -> None:
        key = (snapshot.aggregate_id.aggregate_name, snapshot.aggregate_id.id)
        with self._lock:
            stored = self._snapshots.get(key)
            if stored is None or snapshot.version >= stored.version:
                self._snapshots[key] = snapshot

    def all(self, aggregate_name: str) -> list[Snapshot]:
        """Every snapshot of one aggregate type (for the in-memory query service)."""
        with self._lock:
            return [s for (name, _), s in self._snapshots.items() if name == aggregate_name]


class InMemoryPrepareKey(PrepareKey):
    def __init__(self, name: str, *, clock: Clock | None = None):
        super().__init__(name, clock=clock)
        self._lock = threading.Lock()
        self._values: dict[str, PreparedValue] = {}

    def _live(self, key: str, now: datetime) -> PreparedValue | None:
        current = self._values.get(key)
        if current is None or current.expired(now):
            return None
        return current

    def prepare(self, key: str, value: Any, ttl: timedelta | datetime | None = None) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = resolve_ttl(ttl, now)
        with self._lock:
            if self._live(key, now) is not None:
                return False
            self._values[key] = PreparedValue(value, ttl_at)
            return True

    def get(self, key: str) -> PreparedValue | None:
        check_key(key)
        now = self.now()
        with self._lock:
            return self._live(key, now)

    def rollback(self, key: str, value: Any = NOT_GIVEN) -> bool:
        check_key(key)
        now = self.now()
        with self._lock:
            current = self._live(key, now)
            if current is None or (value is not NOT_GIVEN and current.value != value):
                return False
            del self._values[key]
            return True

    def reprepare(
        self, key: str, new_value: Any, *, old_value: Any = NOT_GIVEN, ttl: timedelta | datetime | None = None
    ) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = resolve_ttl(ttl, now)
        with self._lock:
            current = self._live(key, now)
            if current is None or (old_value is not NOT_GIVEN and current.value != old_value):
                return False
            self._values[key] = PreparedValue(new_value, ttl_at)
            return True


__all__ = ["InMemoryEventStore", "InMemorySnapshotStore", "InMemoryPrepareKey"]

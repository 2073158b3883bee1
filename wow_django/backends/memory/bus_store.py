"""The bus records in this process's memory: dicts guarded by one lock. For tests, demos and benchmarks.

The same rules as MongoDB with the bus indexes: eventId unique, (topic,
consumerId) unique, (eventId, consumerId, attemptNo) unique, one inbox entry
per (consumerId, eventId) and one sequence per (consumerId, partitionKey).
Each method is one atomic step under the lock. Records are stored and
returned as copies, with datetimes as BSON keeps them (naive UTC,
milliseconds), so callers see what the Mongo store would give them. Nothing is
persisted or shared with other processes.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Collection, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeGuard

from wow_django.persistence.bus import (
    SEARCH_KEYS,
    STATUS_REVISION,
    BusStore,
    EventQuery,
    EventStatus,
    check_revision,
    status_revision,
    to_bson_time,
    utcnow,
)

PENDING = EventStatus.PENDING.value
SENT = EventStatus.SENT.value
RETRYING = EventStatus.RETRYING.value
EARLIEST = datetime.min
LATEST = datetime.max
_SCALARS = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list})


def _stored(value: Any) -> Any:
    """A copy of ``value`` as BSON would keep it: tuples become lists, datetimes naive UTC at ms precision."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, dict):
        return {key: item if type(item) in _SCALARS else _stored(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [item if type(item) in _SCALARS else _stored(item) for item in value]
    if isinstance(value, datetime):
        return to_bson_time(value)
    for base in (str, int, float):  # e.g. an enum member: stored as its plain value
        if isinstance(value, base):
            return base(value)
    return value


def _copy(value: Any) -> Any:
    """A copy of a stored value: new dicts and lists (what ``_stored`` makes), the rest is immutable."""
    kind = type(value)
    if kind is dict:
        return {key: _copy(item) if type(item) in _CONTAINERS else item for key, item in value.items()}
    if kind is list:
        return [_copy(item) if type(item) in _CONTAINERS else item for item in value]
    return value


def _time(value: datetime | None) -> datetime | None:
    return None if value is None else to_bson_time(value)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _time_order(event: dict) -> tuple:
    occurred = event.get("occurredAt")
    return (occurred if isinstance(occurred, datetime) else EARLIEST, event.get("eventId") or "")


def _newest_key(event: dict) -> tuple:
    """Newest ``occurredAt`` first (none: last), then ``eventId`` ascending."""
    occurred = event.get("occurredAt")
    return (LATEST - (occurred if isinstance(occurred, datetime) else EARLIEST), event.get("eventId") or "")


def _newest_first(events: list[dict], count: int | None = None) -> list[dict]:
    """``events`` newest first; with ``count``, only the first ``count`` of them (a page: no full sort)."""
    if count is not None and count < len(events) // 4:
        return heapq.nsmallest(count, events, key=_newest_key)
    return sorted(events, key=_newest_key)


def _search_keys(event: dict) -> list[str]:
    keys = event.get(SEARCH_KEYS)
    return [key for key in keys if isinstance(key, str)] if isinstance(keys, list) else []


def _feedback_key(consumed_at: datetime, event_id: str, attempt_no: int) -> tuple:
    """The order of :meth:`InMemoryBusStore.consumer_feedback`: newest report first, then eventId, then the
    highest attemptNo first."""
    return (LATEST - consumed_at, event_id, -attempt_no)


def _selected(event: dict, wanted: list[str] | None) -> dict:
    """A copy of a stored event: all of it, or the ``wanted`` fields it has."""
    return _copy(event) if wanted is None else {field: _copy(event[field]) for field in wanted if field in event}


class InMemoryBusStore(BusStore):
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._events: dict[str, dict] = {}
        self._by_trace: dict[str, list[str]] = {}
        self._by_parent: dict[str, list[str]] = {}
        self._by_status: dict[object, dict[str, None]] = {}  # status → eventIds (an ordered set)
        self._by_key: dict[str, dict[str, None]] = {}  # search key → eventIds (an ordered set)
        # topic → consumerId → record
        self._topics: dict[str, dict[str, dict]] = {}
        # (eventId, consumerId) → attemptNo → row; eventId → consumer ids with rows
        self._attempts: dict[tuple[str, str], dict[int, dict]] = {}
        self._consumers_of: dict[str, set[str]] = {}
        self._events_of_consumer: dict[str, set[str]] = {}  # consumerId → eventIds with rows
        self._inbox: dict[tuple[str, str], dict] = {}
        self._sequences: dict[tuple[str, str], dict] = {}
        self._repushes: dict[str, list[dict]] = {}

    # --- topic consumers ---------------------------------------------------------

    def enabled_consumers(self, topic: str) -> list[str]:
        with self._lock:
            records = self._topics.get(topic)
            if not records:
                return []
            return sorted(c for c, record in records.items() if record.get("enabled") is True)

    def set_topic_consumer(self, topic: str, consumer_id: str, *, enabled: bool, description: str | None,
                           updated_by: str | None) -> dict:
        now = utcnow()
        with self._lock:
            records = self._topics.setdefault(topic, {})
            record = records.get(consumer_id)
            if record is None:
                record = records[consumer_id] = {"topic": topic, "consumerId": consumer_id}
                record.update(enabled=enabled, updatedAt=now, updatedBy=updated_by)
                record["description"] = description if description is not None else ""
                record["createdAt"] = now
            else:
                record.update(enabled=enabled, updatedAt=now, updatedBy=updated_by)
                if description is not None:
                    record["description"] = description
            return _copy(record)

    def list_topic_consumers(self, *, topic: str | None = None, consumer_id: str | None = None) -> list[dict]:
        with self._lock:
            found = [
                _copy(record)
                for name, records in self._topics.items() if not topic or name == topic
                for consumer, record in records.items() if not consumer_id or consumer == consumer_id
            ]
        found.sort(key=lambda r: (r["topic"], r["consumerId"]))
        return found

    # --- events ------------------------------------------------------------------------

    def insert_event(self, document: dict) -> bool:
        event = _stored(document)
        event_id = event["eventId"]
        with self._lock:
            if event_id in self._events:
                return False
            self._events[event_id] = event
            self._by_status.setdefault(event.get("status"), {})[event_id] = None
            trace_id, parent = event.get("traceId"), event.get("parentEventId")
            if trace_id is not None:
                self._by_trace.setdefault(trace_id, []).append(event_id)
            if parent is not None:
                self._by_parent.setdefault(parent, []).append(event_id)
            for key in _search_keys(event):
                self._by_key.setdefault(key, {})[event_id] = None
        return True

    def get_events(self, event_ids: Iterable[str], fields: Iterable[str] | None = None) -> dict[str, dict]:
        wanted = None if fields is None else list(fields)
        found: dict[str, dict] = {}
        with self._lock:
            for event_id in dict.fromkeys(event_ids):
                event = self._events.get(event_id)
                if event is not None:
                    found[event_id] = _selected(event, wanted)
        return found

    def get_event(self, event_id: str, fields: Iterable[str] | None = None) -> dict | None:
        with self._lock:
            event = self._events.get(event_id)
            return None if event is None else _selected(event, None if fields is None else list(fields))

    def mark_sent(self, event_id: str, sent_at: datetime) -> bool:
        sent_at = to_bson_time(sent_at)
        with self._lock:
            event = self._events.get(event_id)
            if event is None:
                return False
            if event.get("status") == PENDING:
                self._set_status(event, SENT, sent_at)
                event.update(sentAt=sent_at, lastSentAt=sent_at, lastError=None)
                event.pop("relayLeaseUntil", None)
                return True
            if event.get("sentAt") is None:
                event.update(sentAt=sent_at, lastSentAt=sent_at)
            return False

    def record_send_error(self, event_id: str, error: str) -> None:
        with self._lock:
            event = self._events.get(event_id)
            if event is not None:
                event["lastError"] = error[:2000]
                event.pop("relayLeaseUntil", None)

    def stale_pending(self, older_than: datetime, limit: int) -> list[str]:
        older_than = to_bson_time(older_than)
        with self._lock:
            pending = (self._events[i] for i in self._by_status.get(PENDING, ()))
            found = [e for e in pending if isinstance(e.get("statusAt"), datetime) and e["statusAt"] <= older_than]
            found.sort(key=_time_order)
            return [e["eventId"] for e in found[:limit]]

    def lease_for_relay(self, event_id: str, now: datetime, until: datetime) -> dict | None:
        now, until = to_bson_time(now), to_bson_time(until)
        with self._lock:
            event = self._events.get(event_id)
            if event is None or event.get("status") != PENDING:
                return None
            lease = event.get("relayLeaseUntil")
            if lease is not None and not (isinstance(lease, datetime) and lease <= now):
                return None
            event["relayLeaseUntil"] = until
            return _copy(event)

    def claim_repush(self, event_id: str, *, now: datetime, max_count: int, statuses: Iterable[str],
                     sent_before: datetime) -> dict | None:
        now, sent_before, statuses = to_bson_time(now), to_bson_time(sent_before), set(statuses)
        with self._lock:
            event = self._events.get(event_id)
            if event is None:
                return None
            count = event.get("retryCount")
            if not _is_number(count) or not count < max_count:
                return None
            status, last_sent = event.get("status"), event.get("lastSentAt")
            if status not in statuses and not (
                    status == SENT and isinstance(last_sent, datetime) and last_sent <= sent_before):
                return None
            expire_at = event.get("expireAt")
            if expire_at is not None and not (isinstance(expire_at, datetime) and expire_at > now):
                return None
            self._set_status(event, RETRYING, now)
            event.update(retryCount=count + 1, lastSentAt=now)
            return _copy(event)

    def set_status_if(self, event_id: str, expected_status: str, expected_revision: int, status: str,
                      now: datetime) -> bool:
        expected_revision = check_revision(expected_revision)
        now, status = to_bson_time(now), _stored(status)
        with self._lock:
            event = self._events.get(event_id)
            if (event is None or event.get("status") != expected_status
                    or status_revision(event) != expected_revision):
                return False
            self._set_status(event, status, now)
            return True

    def _set_status(self, event: dict, status: str, at: datetime) -> None:
        """Write an event's status: ``status``, ``statusAt``, ``statusRevision`` + 1 and the status index.
        Call with the lock held."""
        old = event.get("status")
        if old != status:
            self._by_status.get(old, {}).pop(event["eventId"], None)
            self._by_status.setdefault(status, {})[event["eventId"]] = None
            event["status"] = status
        event["statusAt"] = at
        event[STATUS_REVISION] = status_revision(event) + 1

    def _status_only(self, query: EventQuery) -> tuple[str, ...] | None:
        """The statuses of a query that asks for nothing else (the status index answers it), else None."""
        statuses = query.statuses
        if statuses is not None and query == EventQuery(status=query.status):
            return tuple(dict.fromkeys(statuses))
        return None

    def _count(self, query: EventQuery) -> int:
        """How many events match. Call with the lock held."""
        statuses = self._status_only(query)
        if statuses is not None:  # the index's sizes: no event is looked at
            return sum(len(self._by_status.get(status, {})) for status in statuses)
        return len(self._matching(query))

    def _matching(self, query: EventQuery) -> list[dict]:
        indexed = self._status_only(query)
        if indexed is not None:  # the status index answers
            return [self._events[i] for status in indexed for i in self._by_status.get(status, {})]
        statuses = query.statuses
        query = replace(query, since=_time(query.since), until=_time(query.until),
                        sent_before=_time(query.sent_before))
        ids: Collection[str] | None = None
        if query.trace_id is not None:
            ids = self._by_trace.get(query.trace_id, ())
        if statuses is not None:
            buckets = [self._by_status.get(status, {}) for status in dict.fromkeys(statuses)]
            if ids is None or sum(map(len, buckets)) < len(ids):
                ids = [i for bucket in buckets for i in bucket]
        if query.keys is not None:
            keyed = list(dict.fromkeys(i for key in query.keys for i in self._by_key.get(key, {})))
            if ids is None or len(keyed) < len(ids):
                ids = keyed
        candidates = self._events.values() if ids is None else (self._events[i] for i in ids)
        return [event for event in candidates if query.matches(event)]

    def find_events(self, query: EventQuery, *, skip: int, limit: int) -> tuple[int, list[dict]]:
        with self._lock:
            if limit <= 0:
                return self._count(query), []
            found = self._matching(query)
            page = _newest_first(found, skip + limit)[skip:skip + limit]
            return len(found), [_copy(e) for e in page]

    def events_after(self, query: EventQuery, *, after: tuple[datetime, str] | None, limit: int) -> list[dict]:
        with self._lock:
            found = [e for e in self._matching(query) if isinstance(e.get("occurredAt"), datetime)]
            if after is not None:
                moment, event_id = _time(after[0]), after[1]
                found = [e for e in found if e["occurredAt"] < moment
                         or (e["occurredAt"] == moment and (e.get("eventId") or "") > event_id)]
            page = _newest_first(found, limit)[:limit] if limit > 0 else []
            return [_copy(e) for e in page]

    def count_events(self, query: EventQuery, *, up_to: int) -> int:
        with self._lock:
            return max(0, min(self._count(query), up_to))

    def events_before(self, query: EventQuery, *, before: tuple[datetime, str], limit: int) -> list[dict]:
        if limit <= 0:
            return []
        moment, event_id = _time(before[0]), before[1]
        with self._lock:
            found = [e for e in self._matching(query) if isinstance(e.get("occurredAt"), datetime)
                     and (e["occurredAt"] > moment or (e["occurredAt"] == moment and (e.get("eventId") or "") < event_id))]
            return [_copy(e) for e in _newest_first(found)[-limit:]]  # the last ``limit``: the nearest to the key

    def _in_time_order(self, event_ids: Iterable[str], limit: int) -> list[dict]:
        """Copies of the first ``limit`` of these events in time order. Call with the lock held."""
        found = sorted((self._events[i] for i in event_ids), key=_time_order)
        return [_copy(e) for e in found[:limit]]

    def trace_events(self, trace_id: str, limit: int) -> list[dict]:
        with self._lock:
            return self._in_time_order(self._by_trace.get(trace_id, ()), limit)

    def children(self, event_id: str, limit: int) -> list[dict]:
        with self._lock:
            return self._in_time_order(self._by_parent.get(event_id, ()), limit)

    # --- consumptions ------------------------------------------------------------------

    def purge_events(self, *, consumed_before: datetime | None, expired_before: datetime | None,
                     limit: int) -> list[str]:
        consumed_before, expired_before = _time(consumed_before), _time(expired_before)

        def done_with(event: dict) -> bool:
            expire_at, status_at = event.get("expireAt"), event.get("statusAt")
            if expired_before is not None and isinstance(expire_at, datetime) and expire_at <= expired_before:
                return True
            return (consumed_before is not None and event.get("status") == EventStatus.CONSUMED.value
                    and isinstance(status_at, datetime) and status_at <= consumed_before)

        if limit <= 0 or (consumed_before is None and expired_before is None):
            return []
        with self._lock:
            found = [e for e in self._events.values() if done_with(e)]
            found.sort(key=lambda e: (e.get("statusAt") or EARLIEST, e["eventId"]))
            deleted = [e["eventId"] for e in found[:limit]]
            for event_id in deleted:
                event = self._events.pop(event_id)
                self._by_status.get(event.get("status"), {}).pop(event_id, None)
                for index, key in ((self._by_trace, event.get("traceId")), (self._by_parent, event.get("parentEventId"))):
                    if key in index and event_id in index[key]:
                        index[key].remove(event_id)
                        if not index[key]:
                            del index[key]
                for key in _search_keys(event):
                    bucket = self._by_key.get(key, {})
                    bucket.pop(event_id, None)
                    if not bucket:
                        self._by_key.pop(key, None)
                for consumer_id in self._consumers_of.pop(event_id, set()):
                    self._attempts.pop((event_id, consumer_id), None)
                    self._events_of_consumer.get(consumer_id, set()).discard(event_id)
                self._repushes.pop(event_id, None)
            gone = set(deleted)
            for key in [key for key in self._inbox if key[1] in gone]:
                del self._inbox[key]
        return deleted

    def _add_row(self, row: dict) -> bool:
        """Store ``row`` unless its (eventId, consumerId, attemptNo) is taken. Call with the lock held."""
        key = (row["eventId"], row["consumerId"])
        attempts = self._attempts.get(key)
        if attempts is None:
            attempts = self._attempts[key] = {}
            self._consumers_of.setdefault(key[0], set()).add(key[1])
            self._events_of_consumer.setdefault(key[1], set()).add(key[0])
        elif row["attemptNo"] in attempts:
            return False
        attempts[row["attemptNo"]] = row
        return True

    def insert_event_with_consumptions(self, document: dict, now: datetime) -> bool:
        with self._lock:  # the event and its rows appear together
            if not self.insert_event(document):
                return False
            self.init_consumptions(document["eventId"], document.get("consumers") or (), now)
            return True

    def init_consumptions(self, event_id: str, consumers: Iterable[str], now: datetime) -> None:
        now = to_bson_time(now)
        rows = [{"eventId": event_id, "consumerId": consumer, "attemptNo": 0, "success": None, "consumedAt": None,
                 "error": None, "source": "send", "createdAt": now} for consumer in consumers]
        with self._lock:
            for row in rows:
                self._add_row(row)  # a row that exists already (a relay after a crash) is kept

    def latest_consumption(self, event_id: str, consumer_id: str) -> dict | None:
        with self._lock:
            attempts = self._attempts.get((event_id, consumer_id))
            if not attempts:
                return None
            return _copy(attempts[max(attempts)])

    def latest_consumptions(self, event_id: str) -> dict[str, dict]:
        with self._lock:
            latest = {}
            for consumer in self._consumers_of.get(event_id, ()):
                attempts = self._attempts[(event_id, consumer)]
                latest[consumer] = _copy(attempts[max(attempts)])
            return latest

    def consumption_rows(self, event_ids: Iterable[str]) -> list[dict]:
        rows: list[dict] = []
        with self._lock:
            for event_id in sorted(set(event_ids)):
                for consumer in sorted(self._consumers_of.get(event_id, ())):
                    attempts = self._attempts[(event_id, consumer)]
                    rows.extend(_copy(attempts[n]) for n in sorted(attempts))
        return rows

    def consumer_feedback(self, consumer_id: str, *, success: bool | None = None,
                          after: tuple[datetime, str, int] | None = None, limit: int) -> list[dict]:
        if limit <= 0:
            return []
        with self._lock:
            rows = [row for event_id in self._events_of_consumer.get(consumer_id, ())
                    for row in self._attempts[(event_id, consumer_id)].values()
                    if isinstance(row.get("consumedAt"), datetime)
                    and (success is None or row.get("success") is success)]
            if after is not None:
                key = _feedback_key(to_bson_time(after[0]), after[1], after[2])
                rows = [row for row in rows if _feedback_key(row["consumedAt"], row["eventId"], row["attemptNo"]) > key]
            page = heapq.nsmallest(limit, rows, key=lambda r: _feedback_key(r["consumedAt"], r["eventId"],
                                                                            r["attemptNo"]))
            return [_copy(row) for row in page]

    def insert_attempt(self, row: dict) -> bool:
        stored = _stored(row)
        with self._lock:
            return self._add_row(stored)

    # --- inbox -----------------------------------------------------------------------------

    def inbox_insert(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                     lease_until: datetime) -> bool:
        key = (consumer_id, event_id)
        record = {"consumerId": consumer_id, "eventId": event_id, "state": "processing", "owner": owner,
                  "leaseUntil": to_bson_time(lease_until), "claimedAt": to_bson_time(now)}
        with self._lock:
            if key in self._inbox:
                return False
            self._inbox[key] = record
            return True

    def inbox_take_over(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                        lease_until: datetime) -> bool:
        now, lease_until = to_bson_time(now), to_bson_time(lease_until)
        with self._lock:
            record = self._inbox.get((consumer_id, event_id))
            if record is None or record.get("state") != "processing":
                return False
            lease = record.get("leaseUntil")
            if not (isinstance(lease, datetime) and lease <= now):
                return False
            record.update(owner=owner, leaseUntil=lease_until, claimedAt=now)
            return True

    def inbox_state(self, consumer_id: str, event_id: str) -> str | None:
        with self._lock:
            record = self._inbox.get((consumer_id, event_id))
            return None if record is None else record.get("state")

    def inbox_done(self, consumer_id: str, event_id: str, *, owner: str, now: datetime) -> bool:
        with self._lock:
            record = self._inbox.get((consumer_id, event_id))
            if record is None or record.get("owner") != owner:
                return False
            record.update(state="done", doneAt=to_bson_time(now))
            record.pop("leaseUntil", None)
            return True

    def inbox_release(self, consumer_id: str, event_id: str, *, owner: str) -> None:
        key = (consumer_id, event_id)
        with self._lock:
            record = self._inbox.get(key)
            if record is not None and record.get("owner") == owner and record.get("state") == "processing":
                del self._inbox[key]

    # --- sequences -------------------------------------------------------------------------

    def last_sequence(self, consumer_id: str, partition_key: str) -> int | None:
        with self._lock:
            record = self._sequences.get((consumer_id, partition_key))
            return None if record is None else record["sequence"]

    def advance_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> None:
        key = (consumer_id, partition_key)
        now = to_bson_time(now)
        with self._lock:
            record = self._sequences.get(key)
            if record is None:
                self._sequences[key] = {"consumerId": consumer_id, "partitionKey": partition_key,
                                        "sequence": sequence, "updatedAt": now}
                return
            current = record.get("sequence")
            if current is None or sequence > current:
                record["sequence"] = sequence
            record["updatedAt"] = now

    def accept_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> bool:
        key = (consumer_id, partition_key)
        now = to_bson_time(now)
        with self._lock:
            record = self._sequences.get(key)
            if record is None:
                self._sequences[key] = {"consumerId": consumer_id, "partitionKey": partition_key,
                                        "sequence": sequence, "updatedAt": now}
                return True
            current = record.get("sequence")
            if not (_is_number(current) and current < sequence):
                return False
            record.update(sequence=sequence, updatedAt=now)
            return True

    def restore_sequence(self, consumer_id: str, partition_key: str, *, accepted: int, previous: int | None,
                         now: datetime) -> bool:
        key = (consumer_id, partition_key)
        now = to_bson_time(now)
        with self._lock:
            record = self._sequences.get(key)
            if record is None or record.get("sequence") != accepted:
                return False
            if previous is None:
                del self._sequences[key]
            else:
                record.update(sequence=previous, updatedAt=now)
            return True

    # --- re-push audit -----------------------------------------------------------------

    def insert_repush(self, record: dict) -> None:
        stored = _stored(record)
        with self._lock:
            self._repushes.setdefault(stored["eventId"], []).append(stored)

    def repush_history(self, event_id: str, limit: int = 100) -> list[dict]:
        with self._lock:
            records = list(reversed(self._repushes.get(event_id, ())))
            records.sort(key=lambda r: r.get("requestedAt") or EARLIEST, reverse=True)
            return [_copy(r) for r in records[:limit]]

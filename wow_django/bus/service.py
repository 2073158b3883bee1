"""The bus: send, relay, feedback, rollup, re-push, trace and listing (seed 004 §3–§6).

::

    from wow_django.bus import get_bus

    result = get_bus().send("order.purchased", {"orderId": "o-1", "amount": "19.90"})
    result.status        # "SENT", "PENDING" (broker down: the relay publishes it) or None (no consumer)

``send`` raises :class:`~wow_django.exceptions.EnvelopeValidationError` for bad
input and lets storage errors through; it does not raise when the topic has no
enabled consumer (logged at ERROR, nothing stored) or the broker is down (the
event stays PENDING).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from wow_django.bus.envelope import (
    ID_RE,
    SEARCH_KEYS,
    Envelope,
    EventStatus,
    Initiator,
    build_envelope,
    check_consumer_id,
    check_search_key,
    check_topic,
    iso,
    parse_time,
    utcnow,
)
from wow_django.bus.rollup import (
    compute_status,
    consumed_summary,
    expected_consumers,
    last_error,
    latest_by_consumer,
    outcome,
)
from wow_django.bus.trace import build_tree
from wow_django.bus.transport import BusTransport
from wow_django.exceptions import (
    BusError,
    ConsumerNotExpected,
    EnvelopeValidationError,
    EventNotFound,
    RecoverableStoreError,
    RepushRefused,
    TraceNotFound,
    TransportUnavailable,
)
from wow_django.persistence.bus import STATUS_REVISION, BusStore, EventQuery, status_revision

# Pages beyond this would skip more rows than a server should walk (and overflow its skip).
MAX_PAGE = 100_000

logger = logging.getLogger("wow_django.bus")

MAX_ERROR_LENGTH = 4000
MAX_FILTER_LENGTH = 200  # a text filter of the event list: as long as the envelope's texts
MAX_TRACE_EVENTS = 1000
MAX_CHILDREN = 200
ROLLUP_ROUNDS = 16
ROLLUP_FIELDS = ("status", STATUS_REVISION, "consumers")  # what the rollup reads of an event
INTERNAL_FIELDS = frozenset({"_id", "relayLeaseUntil", STATUS_REVISION, SEARCH_KEYS})  # kept out of the output
REPUSH_STATUSES = (EventStatus.FAILED.value, EventStatus.PARTIAL.value, EventStatus.RETRYING.value)


@dataclass(frozen=True)
class SendResult:
    event_id: str
    status: str | None  # None: not stored (no enabled consumer)
    stored: bool
    duplicate: bool = False
    consumers: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict:
        return {"eventId": self.event_id, "status": self.status, "stored": self.stored,
                "duplicate": self.duplicate, "consumers": list(self.consumers), "error": self.error}


@dataclass(frozen=True)
class RelayReport:
    published: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"published": list(self.published), "failed": list(self.failed)}


@dataclass(frozen=True)
class RepushResult:
    event_id: str
    consumer_id: str | None
    retry_count: int
    status: str
    requested_by: str
    requested_at: datetime

    def to_json(self) -> dict:
        return {"eventId": self.event_id, "consumerId": self.consumer_id, "retryCount": self.retry_count,
                "status": self.status, "requestedBy": self.requested_by, "requestedAt": iso(self.requested_at)}


def document_to_json(doc: dict, summary: dict | None = None) -> dict:
    """A stored bus document for output: ISO times, no internal fields."""
    out = {key: iso(value) if isinstance(value, datetime) else value
           for key, value in doc.items() if key not in INTERNAL_FIELDS}
    if summary is not None:
        out["consumption"] = {**summary, "lastFailure": summary["lastFailure"] and {
            key: iso(value) if isinstance(value, datetime) else value for key, value in summary["lastFailure"].items()}}
        if "lastError" in out or summary["lastFailure"]:
            out["lastError"] = last_error(doc, summary)
    return out


def encode_cursor(occurred_at: datetime, event_id: str, *more: int) -> str:
    """The page cursor after the row with this key (a time, an eventId, and for a feedback row its attemptNo):
    URL-safe text."""
    raw = json.dumps([iso(occurred_at), event_id, *more], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, name: str = "cursor") -> tuple[datetime, str]:
    """The key of :func:`encode_cursor`'s text for an event list; EnvelopeValidationError naming ``name`` for
    anything else."""
    moment, event_id = _decode_key(cursor, 2, name)
    return moment, event_id


def decode_feedback_cursor(cursor: str) -> tuple[datetime, str, int]:
    """The key (consumedAt, eventId, attemptNo) of a consumer's feedback page; EnvelopeValidationError otherwise."""
    moment, event_id, attempt_no = _decode_key(cursor, 3)
    return moment, event_id, attempt_no


def _decode_key(cursor: str, size: int, name: str = "cursor") -> tuple:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
        if not isinstance(key, list) or len(key) != size:
            raise ValueError("not a cursor")
        moment, event_id, *more = key
        if not isinstance(moment, str) or not isinstance(event_id, str) or not ID_RE.match(event_id) or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**63 for n in more):
            raise ValueError("not a cursor")
        return (parse_time(moment), event_id, *more)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise EnvelopeValidationError.from_errors(
            "event query", [{"name": name, "msg": "is not a page cursor of this list; start from the first page"}]
        ) from None


def _text_or_none(value: Any, name: str, limit: int) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise EnvelopeValidationError.from_errors("feedback", [{"name": name, "msg": "must be a string"}])
    # A consumer's own words (an exception's message may hold anything): kept, with a NUL written out, as no
    # database of the SQL stores takes one.
    return value[:limit].replace("\x00", "\\u0000")


class EventBus:
    def __init__(self, store: BusStore, transport: BusTransport, *, service_name: str,
                 rollup_queue: Callable[[list[str]], list[str]] | None = None, relay_after_s: float = 30.0,
                 repush_timeout_s: float = 300.0, repush_max_count: int = 5, max_page_size: int = 200,
                 retention_days: float | None = None, expired_retention_days: float | None = None,
                 search_fields: Iterable[str] = ()):
        """``rollup_queue(event_ids)`` queues their rollups (the runtime's task queue) and returns the ids
        it did not queue; this bus rolls those up inline, and every one without a queue."""
        self.store = store
        self.rollup_queue = rollup_queue
        self._batches = threading.local()  # the rollup requests of a thread's batched_rollups() block
        self.max_page_size = max_page_size
        self._rollup_lock = threading.Lock()  # rollups of this process one at a time (the queue is serial too)
        self.transport = transport
        self.service_name = service_name
        self.relay_after_s = relay_after_s
        self.repush_timeout_s = repush_timeout_s
        self.repush_max_count = repush_max_count
        self.retention_days = retention_days
        self.expired_retention_days = expired_retention_days
        #: The payload's top-level fields each event is found by (WOW['BUS_SEARCH_FIELDS']), besides its keys.
        self.search_fields = tuple(search_fields)

    # --- send (§3.2) -----------------------------------------------------------------

    def send(self, topic: str, payload: Any, *, event_id: str | None = None, trace_id: str | None = None,
             span_id: str | None = None, parent_event_id: str | None = None,
             initiator: Initiator | dict | None = None, occurred_at: datetime | str | None = None,
             payload_type: str | None = None, contract_version: int | None = None,
             partition_key: str | None = None, sequence: int | None = None,
             expire_at: datetime | str | None = None, keys: dict[str, str] | None = None) -> SendResult:
        """Validate, store PENDING with one pending feedback row per expected consumer, publish, mark SENT.

        ``keys``: search keys (name → text) the event is found by in the listing and the console, besides the
        payload fields of ``WOW['BUS_SEARCH_FIELDS']`` (e.g. :func:`~wow_django.bus.envelope.aggregate_keys`).
        """
        data: dict = {"topic": topic, "payload": payload}
        if keys is not None:
            data["keys"] = keys
        optional = {"eventId": event_id, "traceId": trace_id, "spanId": span_id, "parentEventId": parent_event_id,
                    "occurredAt": occurred_at, "payloadType": payload_type, "contractVersion": contract_version,
                    "partitionKey": partition_key, "sequence": sequence, "expireAt": expire_at}
        data.update({key: value for key, value in optional.items() if value is not None})
        if isinstance(initiator, Initiator):
            initiator = {key: value for key, value in initiator.to_json().items() if value is not None}
        if initiator is not None:
            data["initiator"] = initiator
        return self.send_envelope(data)

    def send_envelope(self, data: dict) -> SendResult:
        """:meth:`send` for a wire-form envelope (the HTTP endpoint's entry point)."""
        envelope = build_envelope(data, default_service=self.service_name, search_fields=self.search_fields)
        consumers = self.store.enabled_consumers(envelope.topic)
        if not consumers:
            logger.error(
                "bus: topic %r has no enabled consumer in topic_consumers; event %s (trace %s) was not stored "
                "and not published. Configure a consumer for the topic and send it again.",
                envelope.topic, envelope.event_id, envelope.trace_id,
            )
            return SendResult(envelope.event_id, None, stored=False)
        now = utcnow()
        document = {
            **envelope.to_document(),
            "status": EventStatus.PENDING.value, "statusAt": now, "retryCount": 0, "lastSentAt": None,
            "lastError": None, "consumers": consumers, "createdAt": now,
        }
        if not self.store.insert_event_with_consumptions(document, now):
            existing = self.store.get_event(envelope.event_id) or {}
            logger.info("bus: event %s was sent before; keeping the stored record (status %s)",
                        envelope.event_id, existing.get("status"))
            return SendResult(envelope.event_id, existing.get("status"), stored=True, duplicate=True,
                              consumers=tuple(existing.get("consumers") or ()))
        status, error = self._publish(envelope, consumers)
        return SendResult(envelope.event_id, status, stored=True, consumers=tuple(consumers), error=error)

    def _publish(self, envelope: Envelope, consumers: list[str]) -> tuple[str, str | None]:
        sent_at = utcnow()
        try:
            message = envelope.to_json()
            message["sentAt"] = iso(sent_at)  # envelope.with_sent_at(sent_at).to_json(), without a copy of it
            self.transport.publish(message, topic=envelope.topic, consumers=consumers)
        except TransportUnavailable as exc:
            logger.warning("bus: %s", exc)
            self.store.record_send_error(envelope.event_id, str(exc))
            return EventStatus.PENDING.value, str(exc)
        if self.store.mark_sent(envelope.event_id, sent_at):
            return EventStatus.SENT.value, None
        current = self.store.get_event(envelope.event_id) or {}
        return current.get("status", EventStatus.SENT.value), None

    # --- relay ---------------------------------------------------------------------------

    def relay_pending(self, *, older_than_s: float | None = None, limit: int = 500) -> RelayReport:
        """Publish PENDING events older than ``older_than_s`` (default ``BUS_RELAY_AFTER_S``).

        Each event is leased atomically first, so concurrent relays do not
        publish it twice; a broker failure ends the run (the next one retries).
        """
        wait = self.relay_after_s if older_than_s is None else older_than_s
        now = utcnow()
        lease = timedelta(seconds=max(60.0, 4 * self.transport.timeout))
        published: list[str] = []
        failed: list[str] = []
        for event_id in self.store.stale_pending(now - timedelta(seconds=wait), limit):
            document = self.store.lease_for_relay(event_id, now, now + lease)
            if document is None:
                continue
            envelope = Envelope.from_document(document)
            consumers = list(document.get("consumers") or self.store.enabled_consumers(envelope.topic))
            if not consumers:
                logger.error("bus relay: pending event %s (topic %r) has no consumer to deliver to",
                             event_id, envelope.topic)
                self.store.record_send_error(event_id, "no enabled consumer for the topic")
                failed.append(event_id)
                continue
            # A crash between storing the event and its pending rows leaves them missing.
            self.store.init_consumptions(event_id, consumers, document.get("createdAt") or now)
            status, error = self._publish(envelope, consumers)
            if error:
                failed.append(event_id)
                break
            published.append(event_id)
        if published or failed:
            logger.info("bus relay: published %d pending events, %d failed", len(published), len(failed))
        return RelayReport(tuple(published), tuple(failed))

    # --- feedback and rollup (§2.5, §2.6) -------------------------------------------------

    def record_feedback(self, event_id: str, consumer_id: str, success: bool, error: str | None = None, *,
                        source: str = "sdk", retrying: bool = False, dead_lettered: bool = False,
                        note: str | None = None, known_latest: int | None = None) -> dict:
        """Insert one feedback row (next attemptNo) and queue the event's rollup; returns the row.

        ``known_latest``: the consumer's latest attemptNo if the caller just read it (saves a read).
        """
        if not isinstance(success, bool):
            raise EnvelopeValidationError.from_errors("feedback", [{"name": "success", "msg": "must be true or false"}])
        if not isinstance(event_id, str) or not event_id:
            raise EnvelopeValidationError.from_errors("feedback", [{"name": "eventId", "msg": "is required"}])
        check_consumer_id(consumer_id)
        error = _text_or_none(error, "error", MAX_ERROR_LENGTH)
        now = utcnow()
        fields = {"success": success, "consumedAt": now, "error": None if success else (error or "failed"),
                  "source": source, "retrying": bool(retrying and not success),
                  "deadLettered": bool(dead_lettered and not success), "createdAt": now}
        if note:
            fields["note"] = note
        try:
            row = self.store.insert_feedback(event_id, consumer_id, fields, known_latest=known_latest)
        except ConsumerNotExpected:
            if self.store.get_event(event_id) is None:
                raise EventNotFound(event_id) from None
            raise
        self.queue_rollup(event_id)
        return row

    def queue_rollup(self, event_id: str) -> None:
        """Queue the event's rollup; roll up inline when there is no queue or it cannot take it.

        Inside this thread's :meth:`batched_rollups` block, it is queued when the block ends.
        """
        batch = getattr(self._batches, "ids", None)
        if batch is not None:
            batch[event_id] = None
            return
        self.queue_rollups([event_id])

    def queue_rollups(self, event_ids: Iterable[str]) -> None:
        """Queue the events' rollups in one request to the queue; roll up inline those it did not take."""
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return
        inline = ids
        if self.rollup_queue is not None:
            try:
                inline = list(self.rollup_queue(ids))
            except Exception:
                logger.warning("bus: could not queue the rollups of %s; rolling up inline", ", ".join(ids[:20]),
                               exc_info=True)
        for event_id in inline:
            try:
                self.rollup(event_id)
            except Exception:
                logger.exception("bus: inline rollup of %s failed", event_id)

    @contextlib.contextmanager
    def batched_rollups(self) -> Iterator[None]:
        """Collect this thread's rollup requests (:meth:`queue_rollup`) during the block and queue them
        together when it ends, even by an exception (their feedback rows are stored): one request to the
        queue for a burst of feedback. A caller that must know its rollups queued (a consumer before it
        acknowledges its messages) acts after the block. Nested blocks join the outer one.
        """
        if getattr(self._batches, "ids", None) is not None:
            yield
            return
        self._batches.ids = {}
        try:
            yield
        finally:
            ids, self._batches.ids = self._batches.ids, None
            self.queue_rollups(ids)

    def resweep(self, *, older_than_s: float = 60.0, limit: int = 500) -> dict:
        """Roll up again events whose status may be stale: not yet settled (SENT, RETRYING, PARTIAL,
        FAILED) and older than ``older_than_s``, at most ``limit`` per status, newest first.

        A rollup is queued after each feedback; a queue that lost it (a broker outage, a worker killed
        before the rollup ran, an inline rollup that failed) leaves the status behind the feedback, and
        nothing else would correct it. Rollups are idempotent, so re-rolling a current status costs a
        read and changes nothing. Returns ``{"checked": n, "changed": {eventId: status}}``. The Celery
        task ``wow_django.bus.resweep`` runs it (see :func:`wow_django.tasks.beat_schedule`).
        """
        until = utcnow() - timedelta(seconds=older_than_s)
        checked, changed = 0, {}
        for status in (EventStatus.SENT, EventStatus.RETRYING, EventStatus.PARTIAL, EventStatus.FAILED):
            after = None
            left = limit
            while left > 0:
                events = self.store.events_after(EventQuery(status=status.value, until=until), after=after,
                                                 limit=min(left, 100))
                if not events:
                    break
                for event in events:
                    checked += 1
                    now = self.rollup(event["eventId"])
                    if now is not None and now != status.value:
                        changed[event["eventId"]] = now
                left -= len(events)
                last = events[-1]
                after = (last["occurredAt"], last["eventId"])
        if changed:
            logger.warning("bus: %d event status(es) were behind their feedback and were rolled up: %s",
                           len(changed), ", ".join(sorted(changed)[:20]))
        return {"checked": checked, "changed": changed}

    def purge(self, *, batch: int = 500, max_events: int = 50_000, now: datetime | None = None) -> list[str]:
        """Delete the events retention is over for, with every row about them; their eventIds.

        CONSUMED events ``retention_days`` after they settled (``statusAt``), and
        events of any status ``expired_retention_days`` after their ``expireAt``
        (``WOW['BUS_RETENTION_DAYS']`` / ``WOW['BUS_EXPIRED_RETENTION_DAYS']``;
        None keeps them). In batches of ``batch``, at most ``max_events`` per call
        (the next call goes on). Run by the Celery task ``wow_django.bus.purge``
        (see :func:`wow_django.tasks.beat_schedule`) and ``manage.py wow_bus_purge``.
        """
        if self.retention_days is None and self.expired_retention_days is None:
            return []
        now = now or utcnow()
        consumed_before = now - timedelta(days=self.retention_days) if self.retention_days is not None else None
        expired_before = (now - timedelta(days=self.expired_retention_days)
                          if self.expired_retention_days is not None else None)
        purged: list[str] = []
        while len(purged) < max_events:
            deleted = self.store.purge_events(consumed_before=consumed_before, expired_before=expired_before,
                                              limit=min(batch, max_events - len(purged)))
            purged.extend(deleted)
            if not deleted:
                break
        if purged:
            logger.info("bus: purged %d event(s) past their retention", len(purged))
        return purged

    def rollup(self, event_id: str) -> str | None:
        """Recompute the status from the latest row per consumer; write only the status if it changed.

        Idempotent. The write is conditional on the status and its revision
        (``statusRevision``) read, so a rollup that read stale rows cannot
        overwrite a newer result, even one written in the same millisecond; it
        reads again instead. Returns the status (None: no such event).
        """
        with self._rollup_lock:
            for _ in range(ROLLUP_ROUNDS):
                event = self.store.get_event(event_id, fields=ROLLUP_FIELDS)
                if event is None:
                    logger.warning("bus rollup: no event %s", event_id)
                    return None
                latest = self.store.latest_consumptions(event_id)
                target = compute_status(expected_consumers(event, latest), latest, event["status"])
                if target == event["status"]:
                    return target
                if self.store.set_status_if(event_id, event["status"], status_revision(event), target, utcnow()):
                    return target
        raise BusError(f"rollup of {event_id} did not settle after {ROLLUP_ROUNDS} rounds of concurrent changes")

    def rollup_many(self, event_ids: Iterable[str]) -> dict[str, str | None]:
        """:meth:`rollup` each event; ``{eventId: status}`` (None: no such event, or its rollup failed).

        The batch is read at once: its events (one :meth:`~BusStore.get_events`) and their feedback (one
        :meth:`~BusStore.consumption_rows`); each status the feedback changes is written as :meth:`rollup`
        writes it, conditional on the status and revision read. An event whose write lost to a concurrent
        change, or that the batch read did not find, is rolled up on its own. A failed rollup is logged and
        the others go on; the resweep repairs it. A ``RecoverableStoreError`` ends the batch: the caller
        retries the whole of it.
        """
        ids = list(dict.fromkeys(event_ids))
        statuses: dict[str, str | None] = {}
        try:
            statuses.update(self._rollup_batch(ids))
        except RecoverableStoreError:
            raise
        except Exception:
            logger.exception("bus: the batched rollup of %d events failed; rolling them up one by one", len(ids))
        for event_id in ids:
            if event_id in statuses:
                continue
            try:
                statuses[event_id] = self.rollup(event_id)
            except RecoverableStoreError:
                raise
            except Exception:
                logger.exception("bus: rollup of %s failed; the resweep rolls it up later", event_id)
                statuses[event_id] = None
        return statuses

    def _rollup_batch(self, event_ids: list[str]) -> dict[str, str]:
        """One round of :meth:`rollup` for many events, reading them and their feedback once; the statuses
        it settled (those left out are for :meth:`rollup`)."""
        if len(event_ids) < 2:
            return {}
        settled: dict[str, str] = {}
        with self._rollup_lock:
            events = self.store.get_events(event_ids, fields=ROLLUP_FIELDS)
            if not events:
                return settled
            rows: dict[str, list[dict]] = {}
            for row in self.store.consumption_rows(list(events)):
                rows.setdefault(row["eventId"], []).append(row)
            now = utcnow()
            for event_id, event in events.items():
                latest = latest_by_consumer(rows.get(event_id, ()))
                target = compute_status(expected_consumers(event, latest), latest, event["status"])
                if target == event["status"] or self.store.set_status_if(
                        event_id, event["status"], status_revision(event), target, now):
                    settled[event_id] = target
        return settled

    # --- re-push (§5) ------------------------------------------------------------------------

    def repush(self, event_id: str, *, requested_by: str, consumer_id: str | None = None) -> RepushResult:
        """Publish a stored event again: to every consumer, or straight to ``consumer_id``'s queue.

        Allowed for FAILED, PARTIAL and RETRYING events, and for SENT ones not
        consumed within ``BUS_REPUSH_TIMEOUT_S``; never for expired events or
        beyond ``BUS_REPUSH_MAX_COUNT``. The check and the count
        (``retryCount`` + 1, ``lastSentAt``, RETRYING) are one atomic update;
        ``event_repushes`` records who and when.
        """
        if not isinstance(requested_by, str) or not requested_by:
            raise ValueError("requested_by must name who re-pushes (a user name or a service)")
        event = self.store.get_event(event_id)
        if event is None:
            raise EventNotFound(event_id)
        consumers = list(event.get("consumers") or ())
        now = utcnow()
        self._check_target(event, consumer_id)
        self._check_repushable(event, now)
        claimed = self.store.claim_repush(event_id, now=now, max_count=self.repush_max_count,
                                          statuses=REPUSH_STATUSES,
                                          sent_before=now - timedelta(seconds=self.repush_timeout_s))
        if claimed is None:
            fresh = self.store.get_event(event_id)
            if fresh is None:
                raise EventNotFound(event_id)
            self._check_repushable(fresh, now)
            raise RepushRefused("RepushConflict", f"event {event_id!r} changed while re-pushing; try again.")
        record = {"eventId": event_id, "consumerId": consumer_id, "requestedBy": requested_by, "requestedAt": now,
                  "retryCount": claimed["retryCount"], "previousStatus": event["status"]}
        envelope = Envelope.from_document(claimed)
        try:
            self.transport.publish(envelope.with_sent_at(now).to_json(), topic=envelope.topic,
                                   consumers=consumers, target=consumer_id)
        except TransportUnavailable as exc:
            self.store.record_send_error(event_id, str(exc))
            self.store.insert_repush({**record, "outcome": "failed", "error": str(exc)[:2000]})
            raise
        self.store.insert_repush({**record, "outcome": "published", "error": None})
        logger.info("bus: %s re-pushed %s%s (re-push %d)", requested_by, event_id,
                    f" to {consumer_id}" if consumer_id else "", claimed["retryCount"])
        return RepushResult(event_id, consumer_id, claimed["retryCount"], claimed["status"], requested_by, now)

    def repush_refusal(self, event: dict, consumer_id: str | None = None) -> RepushRefused | None:
        """Why :meth:`repush` would refuse this stored event (to ``consumer_id``) now, or None if it
        would go ahead (a concurrent change may still refuse it then). Reads nothing for a whole event."""
        try:
            self._check_target(event, consumer_id)
            self._check_repushable(event, utcnow())
        except RepushRefused as exc:
            return exc
        return None

    def _check_target(self, event: dict, consumer_id: str | None) -> None:
        if consumer_id is None:
            return
        event_id, consumers = event["eventId"], list(event.get("consumers") or ())
        check_consumer_id(consumer_id)
        if consumer_id not in consumers:
            raise RepushRefused("ConsumerNotExpected",
                                f"{consumer_id!r} is not a consumer of event {event_id!r} "
                                f"(its consumers: {', '.join(consumers) or 'none'}).")
        if outcome(self.store.latest_consumption(event_id, consumer_id)) is True:
            raise RepushRefused("AlreadyConsumed",
                                f"{consumer_id!r} has already consumed event {event_id!r}; nothing to re-push.")

    def _check_repushable(self, event: dict, now: datetime) -> None:
        event_id, status = event["eventId"], event["status"]
        expire_at = event.get("expireAt")
        if expire_at is not None and expire_at <= now:
            raise RepushRefused("EventExpired", f"event {event_id!r} expired at {iso(expire_at)}; it is not re-pushed.")
        if event.get("retryCount", 0) >= self.repush_max_count:
            raise RepushRefused("RepushLimitReached",
                                f"event {event_id!r} was re-pushed {event.get('retryCount', 0)} times; the limit "
                                f"is {self.repush_max_count} (WOW['BUS_REPUSH_MAX_COUNT']).")
        if status in REPUSH_STATUSES:
            return
        if status == EventStatus.SENT.value:
            last = event.get("lastSentAt") or event.get("sentAt")
            due = last + timedelta(seconds=self.repush_timeout_s) if last else now
            if due > now:
                raise RepushRefused("RepushTooEarly",
                                    f"event {event_id!r} was sent at {iso(last)} and may still be consumed; a SENT "
                                    f"event can be re-pushed {self.repush_timeout_s:g}s after it was sent "
                                    f"(from {iso(due)}).")
            return
        why = {EventStatus.PENDING.value: "it has not been published yet; the relay publishes it",
               EventStatus.CONSUMED.value: "every consumer has consumed it"}.get(status, f"its status is {status}")
        raise RepushRefused("RepushNotAllowed",
                            f"event {event_id!r} cannot be re-pushed: {why}. Re-push is for FAILED, PARTIAL and "
                            "RETRYING events, and SENT ones not consumed in time.")

    # --- reading -------------------------------------------------------------------------------

    def get_event(self, event_id: str) -> dict:
        event = self.store.get_event(event_id)
        if event is None:
            raise EventNotFound(event_id)
        return event

    def summaries(self, events: list[dict]) -> dict[str, dict]:
        """``{eventId: consumed summary}`` for ``events`` with one read of their feedback."""
        rows: dict[str, list[dict]] = {}
        for row in self.store.consumption_rows(e["eventId"] for e in events):
            rows.setdefault(row["eventId"], []).append(row)
        out = {}
        for event in events:
            latest = latest_by_consumer(rows.get(event["eventId"], []))
            out[event["eventId"]] = consumed_summary(expected_consumers(event, latest), latest)
        return out

    def event_detail(self, event_id: str) -> dict:
        """The event, its feedback history per consumer, its parent and children, and its re-pushes."""
        event = self.get_event(event_id)
        rows = self.store.consumption_rows([event_id])
        latest = latest_by_consumer(rows)
        expected = expected_consumers(event, latest)
        consumers = []
        for consumer in sorted(set(expected) | set(latest)):
            history = [document_to_json(r) for r in rows if r["consumerId"] == consumer]
            result = outcome(latest.get(consumer))
            consumers.append({
                "consumerId": consumer, "expected": consumer in expected,
                "state": {True: "CONSUMED", False: "FAILED", None: "WAITING"}[result],
                "attempts": history,
            })
        parent = self.store.get_event(event["parentEventId"]) if event.get("parentEventId") else None
        children = self.store.children(event_id, MAX_CHILDREN)
        related = self.summaries([*([parent] if parent else []), *children])  # one read: their lastError too
        return {
            "event": document_to_json(event, consumed_summary(expected, latest)),
            "consumers": consumers,
            "parent": document_to_json(parent, related[parent["eventId"]]) if parent else None,
            "children": [document_to_json(child, related[child["eventId"]]) for child in children],
            "repushes": [document_to_json(r) for r in self.store.repush_history(event_id)],
        }

    def trace(self, trace_id: str) -> dict:
        """Every event of ``trace_id`` in time order, and the same events as a parent → child tree."""
        if not isinstance(trace_id, str) or not trace_id:
            raise EnvelopeValidationError.from_errors("trace", [{"name": "traceId", "msg": "is required"}])
        events = self.store.trace_events(trace_id, MAX_TRACE_EVENTS + 1)
        truncated = len(events) > MAX_TRACE_EVENTS
        events = events[:MAX_TRACE_EVENTS]
        if not events:
            raise TraceNotFound(trace_id)
        summaries = self.summaries(events)

        def render(doc: dict) -> dict:
            return document_to_json(doc, summaries[doc["eventId"]])

        return {
            "traceId": trace_id,
            "total": len(events),
            "truncated": truncated,
            "timeline": [render(e) for e in events],
            "tree": [node.to_json(render) for node in build_tree(events)],
        }

    def query_of(self, *, status: str | Iterable[str] | None = None, topic: str | None = None,
                 service: str | None = None, since: datetime | str | None = None, until: datetime | str | None = None,
                 trace_id: str | None = None, user_id: str | None = None,
                 client_request_id: str | None = None, key: str | Iterable[str] | None = None) -> EventQuery:
        """The :class:`EventQuery` of these filters; EnvelopeValidationError naming each bad one.

        ``status``: one status, several (``"FAILED,PARTIAL"`` or a list: any of them), or None/"" for any.
        ``service``, ``user_id``, ``client_request_id``: the initiator's. ``key``: a search key
        ``name=value`` (an envelope's ``keys``, or a payload field of ``WOW['BUS_SEARCH_FIELDS']``), or several
        (any of them).
        """
        query, errors = self._query_and_errors(status, topic, service, since, until, trace_id, user_id,
                                               client_request_id, key)
        if errors or query is None:  # None comes with its errors
            raise EnvelopeValidationError.from_errors("event query", errors)
        return query

    @staticmethod
    def _query_and_errors(status, topic, service, since, until, trace_id, user_id=None,
                          client_request_id=None, key=None) -> tuple[EventQuery | None, list[dict]]:
        """The filters as an :class:`EventQuery` (None when one is bad) and the binding error of each bad one."""
        errors: list[dict] = []
        keys: tuple[str, ...] | None = None
        if key:
            keys = (key,) if isinstance(key, str) else tuple(key)
            for text in keys:
                try:
                    check_search_key(text)
                except EnvelopeValidationError as exc:
                    errors.extend(exc.binding_errors[:1])
                    break
        for name, value in (("service", service), ("traceId", trace_id), ("userId", user_id),
                            ("clientRequestId", client_request_id)):
            if value is not None and (not isinstance(value, str) or len(value) > MAX_FILTER_LENGTH
                                      or "\x00" in value):
                # no stored text is longer; a NUL, which no SQL store takes, is a 400, not a 500
                errors.append({"name": name, "msg": f"must be text of at most {MAX_FILTER_LENGTH} characters "
                                                    "without NUL"})
        if isinstance(status, str):
            status = status.split(",") if status else ()
        statuses = tuple(dict.fromkeys(part.strip() if isinstance(part, str) else part for part in status or ()))
        if any(not isinstance(part, str) or part not in EventStatus.__members__ for part in statuses):
            errors.append({"name": "status", "msg": f"must be one of {', '.join(EventStatus.__members__)}, or "
                           "several of them separated by commas (FAILED,PARTIAL: failed for some consumer)"})
        if topic:
            try:
                check_topic(topic)
            except EnvelopeValidationError as exc:
                errors.extend(exc.binding_errors)
        window: dict[str, datetime | None] = {"since": None, "until": None}
        for name, value in (("since", since), ("until", until)):
            if value:
                try:
                    window[name] = parse_time(value)
                except ValueError as exc:
                    errors.append({"name": name, "msg": str(exc)})
        if errors:
            return None, errors
        return EventQuery(status=(statuses[0] if len(statuses) == 1 else statuses) or None, topic=topic or None,
                          service=service or None, trace_id=trace_id or None, since=window["since"],
                          until=window["until"], user_id=user_id or None,
                          client_request_id=client_request_id or None, keys=keys or None), errors

    def events_page(self, query: EventQuery, *, cursor: str | None = None, before: str | None = None,
                    size: int = 20) -> dict:
        """``{list, next, previous}``: a page of events newest first, each with its consumed summary.

        The page comes after ``cursor`` (None: the first page), or with ``before``, just before it (the page
        back). ``next`` and ``previous`` are the cursors of the pages after and before it (None at either end):
        give ``next`` as ``cursor``, ``previous`` as ``before``.

        Keyset paging (:meth:`~wow_django.persistence.bus.EventRecords.events_after` and ``events_before``):
        a deep page costs what the first does. A cursor that is not one of ``next``'s or ``previous``' is an
        EnvelopeValidationError.
        """
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= self.max_page_size:
            raise EnvelopeValidationError.from_errors(
                "event query", [{"name": "size", "msg": f"must be an integer from 1 to {self.max_page_size}"}])
        if cursor and before:
            raise EnvelopeValidationError.from_errors("event query", [
                {"name": "before", "msg": "cursor and before are two ways of paging (forward and back): give one of them"}])
        if before:
            events = self.store.events_before(query, before=decode_cursor(before, "before"), limit=size + 1)
            newer, events = len(events) > size, events[-size:]
            if not events:  # nothing before it: the first page
                return self.events_page(query, size=size)
            more = True  # the event of ``before`` comes after this page
        else:
            after = decode_cursor(cursor) if cursor else None
            events = self.store.events_after(query, after=after, limit=size + 1)
            more, events = len(events) > size, events[:size]
            newer = bool(after is not None and events and self.store.events_before(
                query, before=(events[0]["occurredAt"], events[0]["eventId"]), limit=1))
        summaries = self.summaries(events)
        first, last = (events[0], events[-1]) if events else (None, None)
        return {"list": [document_to_json(e, summaries[e["eventId"]]) for e in events],
                "next": encode_cursor(last["occurredAt"], last["eventId"]) if more and last else None,
                "previous": encode_cursor(first["occurredAt"], first["eventId"]) if newer and first else None}

    def not_consumed_query(self, now: datetime | None = None) -> EventQuery:
        """The events not consumed in time (seed 004 §5.2): SENT or RETRYING, last sent at least
        ``BUS_REPUSH_TIMEOUT_S`` ago — the SENT ones a re-push is allowed for, and re-pushes still unanswered."""
        cutoff = (now or utcnow()) - timedelta(seconds=self.repush_timeout_s)
        return EventQuery(status=(EventStatus.SENT.value, EventStatus.RETRYING.value), sent_before=cutoff)

    def consumer_feedback_page(self, consumer_id: str, *, success: bool | None = None, cursor: str | None = None,
                               size: int = 20) -> dict:
        """``{list, next}``: what ``consumer_id`` reported, newest first (each report with its event's topic,
        status and time; ``event`` None when the event was purged), keyset-paged like :meth:`events_page`.

        ``success``: only its successes (True) or failures (False). EnvelopeValidationError for a bad
        consumer id, size or cursor.
        """
        errors: list[dict] = []
        try:
            check_consumer_id(consumer_id)
        except EnvelopeValidationError as exc:
            errors.extend(exc.binding_errors)
        if success is not None and not isinstance(success, bool):
            errors.append({"name": "success", "msg": "must be true, false or absent"})
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= self.max_page_size:
            errors.append({"name": "size", "msg": f"must be an integer from 1 to {self.max_page_size}"})
        if errors:
            raise EnvelopeValidationError.from_errors("feedback query", errors)
        after = decode_feedback_cursor(cursor) if cursor else None
        rows = self.store.consumer_feedback(consumer_id, success=success, after=after, limit=size + 1)
        more, rows = len(rows) > size, rows[:size]
        events: dict[str, dict | None] = {}
        for row in rows:
            if row["eventId"] not in events:
                events[row["eventId"]] = self.store.get_event(
                    row["eventId"], fields=("eventId", "topic", "status", "occurredAt", "traceId", "retryCount"))
        last = rows[-1] if rows else None
        return {"list": [{**document_to_json(row), "event": document_to_json(event)
                          if (event := events[row["eventId"]]) else None} for row in rows],
                "next": encode_cursor(last["consumedAt"], last["eventId"], last["attemptNo"])
                if more and last else None}

    def list_events(self, *, status: str | None = None, topic: str | None = None, service: str | None = None,
                    since: datetime | str | None = None, until: datetime | str | None = None,
                    trace_id: str | None = None, user_id: str | None = None, client_request_id: str | None = None,
                    key: str | Iterable[str] | None = None, page: int = 1, size: int = 20) -> dict:
        """``{total, page, size, list}`` of events, newest first, filtered by any of the arguments."""
        query, errors = self._query_and_errors(status, topic, service, since, until, trace_id, user_id,
                                               client_request_id, key)
        max_size = self.max_page_size
        if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= MAX_PAGE:
            errors.append({"name": "page", "msg": f"must be an integer from 1 to {MAX_PAGE}"})
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= max_size:
            errors.append({"name": "size", "msg": f"must be an integer from 1 to {max_size}"})
        if errors or query is None:  # None comes with its errors
            raise EnvelopeValidationError.from_errors("event query", errors)
        total, events = self.store.find_events(query, skip=(page - 1) * size, limit=size)
        summaries = self.summaries(events)
        return {"total": total, "page": page, "size": size,
                "list": [document_to_json(e, summaries[e["eventId"]]) for e in events]}

    # --- topic consumers (§2.3) ---------------------------------------------------------------

    def set_topic_consumer(self, topic: str, consumer_id: str, *, enabled: bool = True,
                           description: str | None = None, updated_by: str | None = None) -> dict:
        """Create or update one (topic, consumerId) configuration; returns it."""
        check_topic(topic)
        check_consumer_id(consumer_id)
        if not isinstance(enabled, bool):
            raise EnvelopeValidationError.from_errors("topic consumer", [{"name": "enabled", "msg": "must be true or false"}])
        if description is not None and (not isinstance(description, str) or len(description) > 500):
            raise EnvelopeValidationError.from_errors(
                "topic consumer", [{"name": "description", "msg": "must be text of at most 500 characters"}])
        doc = self.store.set_topic_consumer(topic, consumer_id, enabled=enabled, description=description,
                                            updated_by=updated_by)
        return document_to_json(doc)

    def topic_consumers(self, *, topic: str | None = None, consumer_id: str | None = None) -> list[dict]:
        return [document_to_json(d) for d in self.store.list_topic_consumers(topic=topic, consumer_id=consumer_id)]

    def close(self) -> None:
        self.transport.close()

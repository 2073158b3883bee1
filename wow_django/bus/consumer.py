"""The consumer SDK: declare handlers per consumer id and topic, run them with a worker.

::

    from wow_django.bus import consumer

    @consumer("member-service", topics=["order.purchased"])
    def add_points(event, ctx):
        award(event.payload["userId"], points, key=ctx.idempotency_key)   # idempotent effect
        ctx.send("points.added", {"userId": ..., "points": points})       # a child in the same trace

Run it with ``manage.py wow_consume member-service`` (or :class:`ConsumerWorker`
in a thread). For each delivered event the worker:

1. skips it when this consumer is not expected for the event (not an enabled
   topic consumer when the event was sent) or already reported success (then
   it queues the event's rollup again, which a crash may have lost);
2. claims it in the inbox (:mod:`wow_django.bus.inbox`) — a claim already
   done means the handler ran: only the feedback is completed;
3. optionally drops it when its sequence is stale (``drop_stale=True``);
4. runs the handler in the event's bus context (children inherit the trace),
   retrying with exponential backoff (``BUS_CONSUMER_MAX_ATTEMPTS``,
   ``BUS_CONSUMER_BACKOFF_S``); every attempt writes a feedback row;
5. after the last failure the event is dead-lettered: the final row has
   ``success: false``, ``deadLettered: true`` and the error, the rollup makes
   the event FAILED (or PARTIAL), and a re-push delivers it again;
6. acknowledges the message only after its outcome is stored and its rollup
   queued. Messages the broker has already delivered (up to the prefetch
   count) are handled as one burst whose rollups are queued in one request
   (:meth:`EventBus.batched_rollups`), then acknowledged together.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from kombu import Consumer as KombuConsumer
from kombu.exceptions import OperationalError

from wow_django.bus.context import bus_context
from wow_django.bus.envelope import WIRE_NAMES, Envelope, build_envelope, check_consumer_id, check_topic
from wow_django.bus.inbox import BUSY, DONE, Inbox
from wow_django.bus.ordering import SequenceTracker
from wow_django.bus.rollup import outcome
from wow_django.bus.transport import CONTENT_TYPE
from wow_django.conf import wow_settings
from wow_django.domain.registry import Current
from wow_django.exceptions import EnvelopeValidationError
from wow_django.log import describe_failure, first_line

logger = logging.getLogger("wow_django.bus.consumer")

CHILD_ID_NAMESPACE = uuid.UUID("8f0c3a52-4f5e-4c8e-9a7d-2b1f6d0e9c11")


@dataclass(frozen=True)
class HandlerSpec:
    consumer_id: str
    topic: str
    fn: Callable
    drop_stale: bool = False

    @property
    def label(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


class ConsumerRegistry:
    """The consumers declared with :func:`consumer`: ``{consumer id: {topic: HandlerSpec}}``. Thread-safe.

    One is current per process; :func:`wow_django.testing.isolated_registry`
    swaps in a copy for a test.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._consumers: dict[str, dict[str, HandlerSpec]] = {}

    def copy(self) -> ConsumerRegistry:
        other = ConsumerRegistry()
        with self._lock:
            other._consumers = {cid: dict(handlers) for cid, handlers in self._consumers.items()}
        return other

    def add(self, spec: HandlerSpec) -> None:
        with self._lock:
            handlers = self._consumers.setdefault(spec.consumer_id, {})
            previous = handlers.get(spec.topic)
            if previous is not None and previous.label != spec.label:
                raise ImproperlyConfigured(
                    f"consumer {spec.consumer_id!r} has two handlers for {spec.topic!r}: {previous.label} and "
                    f"{spec.label}"
                )
            handlers[spec.topic] = spec

    def consumer_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._consumers)

    def handlers_of(self, consumer_id: str) -> dict[str, HandlerSpec]:
        """``{topic: HandlerSpec}`` of one consumer (empty when it is not declared)."""
        with self._lock:
            return dict(self._consumers.get(consumer_id, {}))


_current: Current[ConsumerRegistry] = Current(ConsumerRegistry())


def consumers() -> ConsumerRegistry:
    """The current consumer registry."""
    return _current.get()


def use_consumers(registry: ConsumerRegistry):
    """Make ``registry`` the current one inside a ``with`` block; the previous one comes back after it."""
    return _current.use(registry)


def consumer(consumer_id: str, *, topics: Iterable[str], drop_stale: bool = False):
    """Register ``fn(event: Envelope, ctx: ConsumerContext)`` as ``consumer_id``'s handler for ``topics``.

    With ``drop_stale`` an event whose ``sequence`` is not above the last one
    this consumer applied for its ``partitionKey`` is dropped (and reported as
    consumed, with a note).
    """
    check_consumer_id(consumer_id)
    topics = [check_topic(t) for t in ([topics] if isinstance(topics, str) else list(topics))]
    if not topics:
        raise ImproperlyConfigured(f"consumer {consumer_id!r} needs at least one topic")

    def decorate(fn):
        for topic in topics:
            consumers().add(HandlerSpec(consumer_id, topic, fn, drop_stale))
        return fn

    return decorate


class ConsumerContext:
    """What a handler may know and do besides reading the event."""

    def __init__(self, bus, consumer_id: str, event: Envelope, *, attempt: int, redelivered: bool, operation: str):
        self.bus = bus
        self.consumer_id = consumer_id
        self.event = event
        self.attempt = attempt
        self.redelivered = redelivered
        self.operation = operation
        self._sent = 0

    @property
    def idempotency_key(self) -> str:
        """Stable for this consumer and event across redeliveries and re-pushes: use it to make effects idempotent."""
        return f"{self.consumer_id}:{self.event.event_id}"

    def child_event_id(self, topic: str, index: int) -> str:
        """The eventId of the ``index``-th child this handler sends: the same on every redelivery."""
        return "evt-" + str(uuid.uuid5(CHILD_ID_NAMESPACE, f"{self.event.event_id}|{self.consumer_id}|{topic}|{index}"))

    def send(self, topic: str, payload, *, operation: str | None = None, event_id: str | None = None, **fields):
        """Send a child event: same traceId, parentEventId = this event, initiator = this consumer.

        Its eventId is derived from the parent, the consumer, the topic and the
        order of sends, so a handler that runs again sends the same child ids
        and the bus keeps one record each.
        """
        self._sent += 1
        parent = self.event
        initiator = {"service": self.consumer_id, "operation": operation or self.operation}
        if parent.initiator.user_id:
            initiator["userId"] = parent.initiator.user_id
        if parent.initiator.client_request_id:
            initiator["clientRequestId"] = parent.initiator.client_request_id
        return self.bus.send(topic, payload, event_id=event_id or self.child_event_id(topic, self._sent),
                             trace_id=parent.trace_id, parent_event_id=parent.event_id, initiator=initiator,
                             **fields)


@dataclass
class WorkerStats:
    received: int = 0
    handled: int = 0
    duplicates: int = 0
    failed: int = 0
    skipped: int = 0
    stale: int = 0
    requeued: int = 0
    invalid: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "errors"}

    def error(self, text: str) -> None:
        """Remember a broker or store error (the latest 50)."""
        self.errors.append(text)
        del self.errors[:-50]


ACK = "ack"
REQUEUE = "requeue"


class ConsumerWorker:
    """Consumes one consumer id's queue until :meth:`stop` (or a limit) — one message at a time."""

    def __init__(self, consumer_id: str, *, bus, prefetch: int | None = None, max_attempts: int | None = None,
                 backoff_s: float | None = None, lease_s: float | None = None):
        """``bus``: the :class:`~wow_django.bus.service.EventBus` to report to (``get_bus()`` for the process's)."""
        self.handlers = consumers().handlers_of(consumer_id)
        if not self.handlers:
            known = ", ".join(consumers().consumer_ids()) or "none"
            raise ImproperlyConfigured(
                f"no consumer {consumer_id!r} is declared (declared: {known}); declare it with "
                "@wow_django.bus.consumer in an installed app's consumers or integration module"
            )
        self.consumer_id = consumer_id
        self.bus = bus
        self.prefetch = prefetch or wow_settings.BUS_CONSUMER_PREFETCH
        self.max_attempts = max_attempts or wow_settings.BUS_CONSUMER_MAX_ATTEMPTS
        self.backoff_s = wow_settings.BUS_CONSUMER_BACKOFF_S if backoff_s is None else backoff_s
        self.inbox = Inbox(self.bus.store, consumer_id,
                           lease_s=lease_s if lease_s is not None else wow_settings.BUS_INBOX_LEASE_S)
        self.sequences = SequenceTracker(self.bus.store, consumer_id)
        self.stats = WorkerStats()
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._last_activity = time.monotonic()
        self._handled: list = []  # messages of the current burst, acknowledged once its rollups are queued
        # Whether this thread's database connections were checked since the last wait for the broker: a
        # message handled right after another one needs no check before it (the one after it counts).
        self._connections_checked = False

    @property
    def topics(self) -> list[str]:
        return sorted(self.handlers)

    @property
    def queue_name(self) -> str:
        return self.bus.transport.queue(self.consumer_id).name

    def stop(self) -> None:
        """Finish the current message, then return from :meth:`run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- the loop -------------------------------------------------------------------

    def run(self, *, max_messages: int | None = None, idle_timeout: float | None = None) -> WorkerStats:
        """Consume until stopped, until ``max_messages`` were received, or after ``idle_timeout`` s without one.

        Run in a thread other than the main one, the thread's database connections are closed when it returns.
        """
        try:
            return self._consume(max_messages, idle_timeout)
        finally:
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()

    def _consume(self, max_messages: int | None, idle_timeout: float | None) -> WorkerStats:
        transport = self.bus.transport
        queue = transport.queue(self.consumer_id, self.topics)
        retry_delay = 0.5
        self._last_activity = time.monotonic()
        while not self.stopping:
            connection = transport.new_connection()
            self._handled = []  # a lost channel's unacknowledged messages come back
            try:
                connection.ensure_connection(max_retries=0, timeout=transport.timeout)
                channel = connection.channel()
                transport.exchange(channel).declare()
                queue(channel).declare()
                # on_message: the body is decoded here (what is not JSON is rejected as invalid, not raised
                # out of this loop); accept: kombu's own decoding, for a body our publisher did not write.
                with KombuConsumer(channel, queues=[queue], on_message=self._on_message, accept=["json"],
                                   on_decode_error=self._on_decode_error, prefetch_count=self.prefetch):
                    self.ready.set()
                    retry_delay = 0.5
                    while not self.stopping:
                        if max_messages is not None and self.stats.received >= max_messages:
                            return self.stats
                        idle = False
                        self._connections_checked = False
                        # A burst: the next message, then those already delivered (up to the prefetch
                        # count); their rollups are queued in one request when it ends, then they are
                        # acknowledged. A crash before that redelivers them, and the redelivery queues
                        # the rollups again.
                        with self.bus.batched_rollups():
                            try:
                                connection.drain_events(timeout=0.2)
                                self._drain_delivered(connection, max_messages)
                            except TimeoutError:
                                idle = True
                        self._acknowledge_handled()
                        if idle and idle_timeout is not None and time.monotonic() - self._last_activity >= idle_timeout:
                            return self.stats
            except (OperationalError, *connection.connection_errors, *connection.channel_errors) as exc:
                self.stats.error(f"{type(exc).__name__}: {exc}")
                logger.warning("consumer %s: broker connection lost (%s); reconnecting in %.1fs",
                               self.consumer_id, exc, retry_delay)
                self._stop.wait(retry_delay)
                retry_delay = min(retry_delay * 2, 10.0)
            finally:
                try:
                    connection.release()
                except Exception:
                    logger.debug("closing the consumer connection failed", exc_info=True)
        return self.stats

    def _drain_delivered(self, connection, max_messages: int | None) -> None:
        """Handle the messages the broker has already delivered, without waiting for more."""
        while len(self._handled) < self.prefetch and not self.stopping and (
                max_messages is None or self.stats.received < max_messages):
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:
                return

    def _acknowledge_handled(self) -> None:
        handled, self._handled = self._handled, []
        if len(handled) > 1 and self.bus.transport.is_amqp:
            # One frame for the burst: every message of this channel up to the last one's delivery tag.
            # Those of them not in the burst were rejected or requeued already, so none is left out.
            handled[-1].ack(multiple=True)
            return
        for message in handled:
            message.ack()

    def _on_decode_error(self, message, exc: Exception) -> None:
        """A message kombu could not even build (e.g. a ``compression`` header it cannot undo): invalid."""
        self.stats.received += 1
        self._last_activity = time.monotonic()
        self._reject_invalid(message, f"cannot be decoded: {type(exc).__name__}: {str(exc)[:200]}")

    def _reject_invalid(self, message, reason: object) -> None:
        self.stats.invalid += 1
        logger.error("consumer %s: rejected an invalid message (%s)", self.consumer_id, reason)
        message.reject()

    def _on_message(self, message) -> None:
        self.stats.received += 1
        self._last_activity = time.monotonic()
        try:
            body = decode_body(message)
            if not isinstance(body, dict) or not body.get("eventId"):
                raise EnvelopeValidationError("message has no eventId")
            unknown = sorted(body.keys() - WIRE_NAMES)
            if unknown:  # a newer producer's fields: this consumer reads the ones it knows
                logger.debug("consumer %s: ignoring fields %s of event %s", self.consumer_id, unknown,
                             body.get("eventId"))
                body = {key: value for key, value in body.items() if key in WIRE_NAMES}
            envelope = build_envelope(body, default_service="")
        except EnvelopeValidationError as exc:
            self._reject_invalid(message, exc)
            return
        redelivered = bool((message.delivery_info or {}).get("redelivered"))
        if not self._connections_checked:  # the first message after a wait: as at a request's start
            release_database_connections()
        try:
            verdict = self.process(envelope, redelivered=redelivered)
        except Exception as exc:  # the store failed: leave the message to a later delivery
            self.stats.error(f"{type(exc).__name__}: {exc}")
            logger.exception("consumer %s: processing %s failed; requeueing it", self.consumer_id, envelope.event_id)
            verdict = REQUEUE
        finally:
            release_database_connections()  # as at a request's end; it is the next message's start too
            self._connections_checked = True
        if verdict == REQUEUE:
            self.stats.requeued += 1
            self._stop.wait(min(max(self.backoff_s, 0.05), 1.0))
            self._requeue(body, envelope, message)
        else:
            self._handled.append(message)  # acknowledged when the burst's rollups are queued

    def _requeue(self, body: dict, envelope: Envelope, message) -> None:
        """Give the message back to this consumer's queue only.

        AMQP's reject-with-requeue returns it to the same queue. kombu's
        virtual transports (``memory://``) route a rejected message through
        the exchange again, which would hand a copy to every consumer of the
        topic; there the message is published to this queue, then acknowledged.
        """
        transport = self.bus.transport
        if transport.is_amqp:
            message.requeue()
            return
        transport.publish(body, topic=envelope.topic, consumers=(), target=self.consumer_id)
        message.ack()

    # --- one event ---------------------------------------------------------------------

    def process(self, event: Envelope, *, redelivered: bool = False) -> str:
        """Handle one delivered event; returns ``"ack"`` or ``"requeue"``."""
        bus, event_id = self.bus, event.event_id
        latest = bus.store.latest_consumption(event_id, self.consumer_id)
        if latest is None:
            self.stats.skipped += 1
            logger.warning("consumer %s: not an expected consumer of %s (topic %r): skipped. Enable it in "
                           "topic_consumers to consume this topic.", self.consumer_id, event_id, event.topic)
            return ACK
        if outcome(latest) is True:
            self.stats.duplicates += 1
            # A worker that died between its feedback and queueing the rollup left the event's status
            # behind; the redelivery is the one chance to catch up (rollups are idempotent).
            bus.queue_rollup(event_id)
            return ACK
        known = latest["attemptNo"]

        def feedback(success: bool, error: str | None = None, **fields) -> None:
            nonlocal known  # our latest attemptNo: saves a read per feedback row
            row = bus.record_feedback(event_id, self.consumer_id, success, error, known_latest=known, **fields)
            known = row["attemptNo"]

        claim = self.inbox.claim(event_id)
        if claim.state == DONE:  # handled before; its feedback was lost
            self.stats.duplicates += 1
            feedback(True, note="handled before (inbox); feedback completed")
            return ACK
        if claim.state == BUSY:  # another worker of this consumer holds it
            return REQUEUE
        token = cast(str, claim.token)  # claimed: a claimed Claim has its token
        handler = self.handlers.get(event.topic)
        if handler is None:
            self.inbox.release(event_id, token)
            self.stats.failed += 1
            feedback(False, f"consumer {self.consumer_id!r} has no handler for topic {event.topic!r}",
                     dead_lettered=True)
            return ACK
        # (partition key, sequence) of an event whose handler drops stale ones, else None
        ordered = ((event.partition_key, event.sequence) if handler.drop_stale and event.partition_key is not None
                   and event.sequence is not None else None)
        previous = self.sequences.last(ordered[0]) if ordered else None
        # Taken before handling, atomically: of two messages of one partition
        # handled at once, the older one is dropped, never applied after the newer.
        if ordered and not self.sequences.accept(*ordered):
            self.inbox.done(event_id, token)
            self.stats.stale += 1
            feedback(True, note=f"stale: sequence {event.sequence} of {event.partition_key!r} is not newer "
                                 "than the last applied one; dropped")
            return ACK
        error = ""
        for attempt in range(1, self.max_attempts + 1):
            ctx = ConsumerContext(bus, self.consumer_id, event, attempt=attempt, redelivered=redelivered,
                                  operation=handler.fn.__name__)
            try:
                with bus_context(trace_id=event.trace_id, parent_event_id=event.event_id, service=self.consumer_id,
                                 operation=handler.fn.__name__, user_id=event.initiator.user_id,
                                 client_request_id=event.initiator.client_request_id):
                    handler.fn(event, ctx)
            except Exception as exc:
                error = describe_failure(exc)
                logger.warning("consumer %s: %s failed on %s (attempt %d of %d): %s", self.consumer_id,
                               handler.label, event_id, attempt, self.max_attempts, first_line(error),
                               exc_info=attempt == self.max_attempts)
                if attempt == self.max_attempts:
                    break
                feedback(False, error, retrying=True)
                if self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                    if ordered:
                        self.sequences.restore(*ordered, previous)
                    self.inbox.release(event_id, token)  # stopping: another worker takes it over
                    return REQUEUE
                continue
            if not self.inbox.done(event_id, token):
                logger.warning("consumer %s: the inbox claim on %s expired while handling it (raise "
                               "WOW['BUS_INBOX_LEASE_S'])", self.consumer_id, event_id)
            self.stats.handled += 1
            feedback(True)
            return ACK
        if ordered:  # not applied: a re-push of this event must not be dropped as stale
            self.sequences.restore(*ordered, previous)
        self.inbox.release(event_id, token)
        self.stats.failed += 1
        feedback(False, error, dead_lettered=True)
        logger.error("consumer %s: %s dead-lettered after %d attempts: %s", self.consumer_id, event_id,
                     self.max_attempts, first_line(error))
        return ACK


def decode_body(message) -> Any:
    """The JSON body of a delivered message; :class:`EnvelopeValidationError` when it has none.

    What this library publishes (``application/json`` in UTF-8) is read with one ``json.loads`` (kombu has
    undone a ``compression`` already); anything else goes through kombu's decoding, which refuses a content
    type other than JSON.
    """
    try:
        body = message.body
        if message.content_type == CONTENT_TYPE and message.content_encoding in ("utf-8", "utf8", None):
            # Strict UTF-8, as kombu decodes it (json.loads of bytes would also take UTF-16 and UTF-32).
            return json.loads(body.decode("utf-8") if isinstance(body, bytes) else body)
        return message.decode()
    except Exception as exc:  # kombu's ContentDisallowed or DecodeError, a JSON or Unicode error
        raise EnvelopeValidationError(f"message body is not a JSON envelope ({type(exc).__name__}: "
                                      f"{str(exc)[:200]})") from exc


def release_database_connections() -> None:
    """What Django does around a request, around one message: a connection that broke or outlived
    ``CONN_MAX_AGE`` is closed so that the next query connects again (a long-running consumer would
    otherwise keep failing on a connection the database dropped). A connection inside a transaction
    (a test's, or a caller's) is left alone."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def run_in_thread(worker: ConsumerWorker, **run_kwargs) -> threading.Thread:
    """Start ``worker.run(**run_kwargs)`` in a daemon thread; returns once the worker is consuming."""
    thread = threading.Thread(target=worker.run, kwargs=run_kwargs, name=f"wow-consumer-{worker.consumer_id}",
                              daemon=True)
    thread.start()
    if not worker.ready.wait(worker.bus.transport.timeout + 5):
        worker.stop()
        raise RuntimeError(f"consumer {worker.consumer_id} did not start consuming (is the broker reachable?)")
    return thread

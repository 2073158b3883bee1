"""After an append: snapshotting, local projections, event processors — in order.

Streams of one aggregate go to one lane (by hash of its id) and a lane runs
them one at a time, in the order the gateway submitted them, which within a
process is version order. Each stream runs: the snapshot step, then every
matching projection, then every matching event processor. A failing handler
is logged and reported to whoever waits; it does not stop the others.

Register handlers in an installed app's ``aggregates`` or ``projections``
module::

    @projection("order", events=[OrderPaid])
    def count_paid(message: DomainEventMessage) -> None: ...

    @event_processor("order", events=[OrderPaid])
    def publish_purchase(message: DomainEventMessage) -> None: ...
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from wow_django.domain.messages import Event
from wow_django.records import EventStream, Snapshot
from wow_django.repository import DomainEventMessage, stream_messages

logger = logging.getLogger("wow_django.dispatch")


@dataclass(frozen=True)
class Handler:
    aggregate_name: str
    event_names: frozenset[str] | None
    fn: Callable[[DomainEventMessage], object]
    kind: str  # "projection" or "processor"

    def matches(self, message: DomainEventMessage) -> bool:
        return message.aggregate_id.aggregate_name == self.aggregate_name and (
            self.event_names is None or message.name in self.event_names
        )

    @property
    def label(self) -> str:
        return f"{self.kind} {self.fn.__module__}.{self.fn.__qualname__}"


_handlers_lock = threading.Lock()
_handlers: list[Handler] = []


def _aggregate_name(aggregate) -> str:
    return aggregate if isinstance(aggregate, str) else aggregate.aggregate_name


def _register(kind: str, aggregate, events: Iterable[type[Event] | str] | None):
    names = None
    if events is not None:
        names = frozenset(e if isinstance(e, str) else e.event_name for e in events)

    def decorate(fn):
        with _handlers_lock:
            _handlers.append(Handler(_aggregate_name(aggregate), names, fn, kind))
        return fn

    return decorate


def projection(aggregate, events: Iterable[type[Event] | str] | None = None):
    """Run ``fn(message)`` for the aggregate's events (all, or those listed) before PROJECTED."""
    return _register("projection", aggregate, events)


def event_processor(aggregate, events: Iterable[type[Event] | str] | None = None):
    """Run ``fn(message)`` after the projections, e.g. to publish integration events."""
    return _register("processor", aggregate, events)


def unregister(fn) -> None:
    with _handlers_lock:
        _handlers[:] = [h for h in _handlers if h.fn is not fn]


def handlers_for(aggregate_name: str) -> list[Handler]:
    with _handlers_lock:
        return [h for h in _handlers if h.aggregate_name == aggregate_name]


def has_handlers(aggregate_name: str) -> bool:
    return any(h.aggregate_name == aggregate_name for h in _handlers)


@dataclass
class Tracker:
    """Signals the stages of one stream's dispatch to whoever waits."""

    snapshot_done: threading.Event = field(default_factory=threading.Event)
    projected_done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)


# A tracker whose stages are already done (nothing to dispatch); shared, never written to.
COMPLETED = Tracker()
COMPLETED.snapshot_done.set()
COMPLETED.projected_done.set()


@dataclass
class Job:
    stream: EventStream
    snapshot: Snapshot | None  # inline snapshot to save, if the strategy asked for one
    queue_snapshot: bool  # ask the Celery snapshot task instead
    tracker: Tracker


class Dispatcher:
    def __init__(self, *, lanes: int = 4, save_snapshot: Callable[[Snapshot], None] | None = None,
                 queue_snapshot: Callable[[EventStream], None] | None = None):
        if lanes < 1:
            raise ValueError("lanes must be ≥ 1")
        self.lane_count = lanes
        self.save_snapshot = save_snapshot
        self.queue_snapshot = queue_snapshot
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(self.lane_count)]
        self._threads: list[threading.Thread | None] = [None] * self.lane_count
        self._lock = threading.Lock()

    def submit(self, job: Job) -> None:
        if os.getpid() != self._pid:  # forked (Celery prefork): lanes did not survive
            self._start()
        index = zlib.crc32(job.stream.aggregate_id.id.encode()) % self.lane_count
        if self._threads[index] is None:
            with self._lock:
                if self._threads[index] is None:
                    thread = threading.Thread(target=self._run, args=(self._queues[index],),
                                              name=f"wow-dispatch-{index}", daemon=True)
                    thread.start()
                    self._threads[index] = thread
        self._queues[index].put(job)

    def close(self, timeout: float = 5.0) -> None:
        if os.getpid() != self._pid:
            return
        for index, thread in enumerate(self._threads):
            if thread is not None:
                self._queues[index].put(None)
                thread.join(timeout)
        self._start()

    def _run(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            try:
                self.run_job(job)
            except Exception:  # never let one job kill the lane
                logger.exception("dispatch of %s failed", job.stream.id)
            finally:
                job.tracker.snapshot_done.set()
                job.tracker.projected_done.set()

    def run_job(self, job: Job) -> None:
        tracker = job.tracker
        stream = job.stream
        try:
            if job.snapshot is not None and self.save_snapshot is not None:
                self.save_snapshot(job.snapshot)
            elif job.queue_snapshot and self.queue_snapshot is not None:
                self.queue_snapshot(stream)
        except Exception as exc:
            logger.exception("snapshot of %s %r v%s failed", stream.aggregate_name, stream.aggregate_id.id,
                             stream.version)
            tracker.errors.append(f"snapshot: {exc}")
        tracker.snapshot_done.set()
        handlers = handlers_for(stream.aggregate_name)
        if handlers:
            messages = stream_messages(stream)
            for kind in ("projection", "processor"):
                for handler in handlers:
                    if handler.kind != kind:
                        continue
                    for message in messages:
                        if not handler.matches(message):
                            continue
                        try:
                            handler.fn(message)
                        except Exception as exc:
                            logger.exception("%s failed on %s v%s", handler.label, message.name, message.version)
                            tracker.errors.append(f"{handler.label}: {exc}")
        tracker.projected_done.set()

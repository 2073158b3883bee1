"""Opt-in batching: concurrent ``append`` calls grouped into ``append_many``.

Each lane has one flusher thread. A caller's stream joins the lane chosen by
the hash of its aggregate id; the flusher waits at most ``max_delay`` seconds
for up to ``max_size`` streams, appends them in one unordered call and hands
each caller its own result or error. At most ``max_pending`` streams wait at
once; further callers block until there is room.

Threads start on first use and belong to the process that started them: a
forked child (Celery prefork) must not use a store built before the fork;
it gets its own from the runtime (see :mod:`wow_django.application.runtime`).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.contracts import EventStore
from wow_django.persistence.records import MAX_VERSION, AggregateId, EventStream


class _Waiter:
    __slots__ = ("stream", "done", "error")

    def __init__(self, stream: EventStream):
        self.stream = stream
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Lane:
    def __init__(self, owner: BatchingEventStore):
        self._owner = owner
        self._items: deque[_Waiter] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, waiter: _Waiter) -> None:
        with self._cond:
            if self._closed:
                raise RecoverableStoreError("the batching event store is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wow-append-batch", daemon=True)
                self._thread.start()
            self._items.append(waiter)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _take_batch(self) -> list[_Waiter] | None:
        owner = self._owner
        with self._cond:
            while not self._items:
                if self._closed:
                    return None
                self._cond.wait()
            if owner.max_delay > 0:
                deadline = time.monotonic() + owner.max_delay
                while len(self._items) < owner.max_size and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            count = min(len(self._items), owner.max_size)
            return [self._items.popleft() for _ in range(count)]

    def _run(self) -> None:
        owner = self._owner
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                results: list[BaseException | None] = list(owner.inner.append_many([w.stream for w in batch]))
            except BaseException as exc:  # the whole call failed: every caller sees it
                results = [exc] * len(batch)
            for waiter, result in zip(batch, results, strict=True):
                waiter.error = result
                waiter.done.set()
                owner._room.release()


class BatchingEventStore(EventStore):
    """Wraps an event store; reads go straight through, appends are batched."""

    def __init__(
        self,
        inner: EventStore,
        *,
        max_size: int = 128,
        max_delay_ms: float = 1.0,
        max_pending: int = 4096,
        lane_count: int = 1,
    ):
        if max_size < 1 or max_pending < 1 or lane_count < 1 or max_delay_ms < 0:
            raise ValueError("max_size, max_pending and lane_count must be ≥ 1 and max_delay_ms ≥ 0")
        self.inner = inner
        self.max_size = max_size
        self.max_delay = max_delay_ms / 1000.0
        self.max_pending = max_pending
        self.lane_count = lane_count
        self._start()

    def _start(self) -> None:
        self._room = threading.BoundedSemaphore(self.max_pending)
        self._lanes = [_Lane(self) for _ in range(self.lane_count)]

    def _lane(self, stream: EventStream) -> _Lane:
        if self.lane_count == 1:
            return self._lanes[0]
        key = stream.aggregate_id.id.encode()
        return self._lanes[zlib.crc32(key) % self.lane_count]

    def append(self, stream: EventStream) -> None:
        lane = self._lane(stream)
        waiter = _Waiter(stream)
        self._room.acquire()
        try:
            lane.submit(waiter)
        except BaseException:
            self._room.release()
            raise
        waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error

    def append_many(self, streams: Sequence[EventStream]) -> list[Exception | None]:
        return self.inner.append_many(streams)

    def load(self, aggregate_id: AggregateId, head_version: int = 1,
             tail_version: int = MAX_VERSION) -> list[EventStream]:
        return self.inner.load(aggregate_id, head_version, tail_version)

    def load_by_time(self, aggregate_id: AggregateId, start_time: int, end_time: int) -> list[EventStream]:
        return self.inner.load_by_time(aggregate_id, start_time, end_time)

    def last(self, aggregate_id: AggregateId) -> EventStream | None:
        return self.inner.last(aggregate_id)

    def scan_aggregate_ids(self, aggregate_name: str, after_id: str = "", limit: int = 100, *,
                           context_name: str | None = None, tenant_id: str | None = None) -> list[AggregateId]:
        return self.inner.scan_aggregate_ids(
            aggregate_name, after_id, limit, context_name=context_name, tenant_id=tenant_id
        )

    def exists_request_id(self, aggregate_name: str, request_id: str, aggregate_id: str | None = None) -> bool:
        return self.inner.exists_request_id(aggregate_name, request_id, aggregate_id)

    def get_by_request_id(self, aggregate_id: AggregateId, request_id: str) -> EventStream | None:
        return self.inner.get_by_request_id(aggregate_id, request_id)

    def locate(self, aggregate_name: str, aggregate_id: str) -> AggregateId | None:
        return self.inner.locate(aggregate_name, aggregate_id)

    def deadline(self, seconds: float | None) -> AbstractContextManager:
        # Bounds this thread's reads; a batched append runs on the lane's thread, which its waiter bounds.
        return self.inner.deadline(seconds)

    def close(self) -> None:
        """Flush what is queued, stop the lanes, close the inner store."""
        for lane in self._lanes:
            lane.close()
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Backend extras (e.g. the Mongo store's collection()) stay reachable.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

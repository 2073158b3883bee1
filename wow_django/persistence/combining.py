"""Concurrent calls written together by one of their callers (flat combining), with no thread of its own.

A caller queues its item; if no other caller is writing, it becomes the
writer: it takes what is queued (its own item first in line with the others,
at most ``max_size``), writes it in one call, hands every caller of the batch
its own result, and goes on until its own item is written. Then it lets the
next caller in line write. The others wait on a condition and return as soon
as their item's batch is written.

Nothing waits for a batch to fill: a lone caller writes at once (a batch of
one), so one thread pays a queue and a lock, no latency. Under load the
batches grow by themselves: what arrives while one batch is being written
goes into the next, so a database commits several appends at once instead of
one after another.

The write runs in the writing caller's thread, on its connection; callers
whose write belongs to their own transaction must not come here.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class BatchFailed:
    """The result of an item whose whole batch failed: ``error`` is what the write raised, ``writer`` the
    ident of the thread that wrote it (made in that thread). The caller decides what to do: typically,
    write its item again on its own unless it was the writer itself."""

    __slots__ = ("error", "writer")

    def __init__(self, error: BaseException):
        self.error = error
        self.writer = threading.get_ident()

    @property
    def by_this_thread(self) -> bool:
        """Whether the calling thread wrote the failed batch (trying again alone would repeat it)."""
        return self.writer == threading.get_ident()

    def __repr__(self) -> str:
        return f"BatchFailed({self.error!r})"


class _Slot(Generic[T]):
    __slots__ = ("item", "done", "result")

    def __init__(self, item: T):
        self.item = item
        self.done = False
        self.result: object = None


class Combiner(Generic[T, R]):
    """Writes concurrent :meth:`submit` calls' items in batches, each batch by one of the callers.

    ``write(items)`` returns one result per item, in order (an exception it
    raises is every item's :class:`BatchFailed`). Fork-safe: a child process
    starts with an empty queue and no writer.
    """

    def __init__(self, write: Callable[[list[T]], Sequence[R]], *, max_size: int = 128):
        if max_size < 1:
            raise ValueError(f"max_size must be ≥ 1, got {max_size!r}")
        self._write = write
        self.max_size = max_size
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Slot[T]] = deque()
        self._writing = False
        self._last = 0

    def submit(self, item: T) -> R | BatchFailed:
        """Write ``item`` (with whatever else is queued) and return its result, or :class:`BatchFailed`."""
        if self._pid != os.getpid():  # a forked child: the parent's waiters and writer are not here
            self._reset()
        slot: _Slot[T] = _Slot(item)
        cond = self._cond
        with cond:
            self._queue.append(slot)
            while self._writing and not slot.done:
                cond.wait()
            if slot.done:
                return slot.result  # type: ignore[return-value]
            self._writing = True
        try:
            while not slot.done:
                if len(self._queue) < self._last:
                    time.sleep(0)
                with cond:
                    batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_size))]
                self._last = len(batch)
                self._write_batch(batch)
                with cond:
                    cond.notify_all()  # the batch's callers return now, not when this writer is done
        finally:
            with cond:
                self._writing = False
                cond.notify_all()  # the next caller in line writes
        return slot.result

    def _write_batch(self, batch: list[_Slot[T]]) -> None:
        """Write ``batch``; every slot of it is done afterwards, whatever happened."""
        results: Sequence[object]
        try:
            results = self._write([slot.item for slot in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch write returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:
            results = [BatchFailed(exc)] * len(batch)
            for slot, result in zip(batch, results, strict=True):
                slot.result, slot.done = result, True
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the writer stops
                raise
            return
        for slot, result in zip(batch, results, strict=True):
            slot.result, slot.done = result, True


__all__ = ["BatchFailed", "Combiner"]

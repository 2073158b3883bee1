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
import weakref
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


#: What :meth:`Combiner.submit` returns when its ``timeout`` passed before any write took its item (the item
#: was taken back out of the queue: it is never written).
TIMED_OUT = object()


class _Slot(Generic[T]):
    __slots__ = ("item", "taken", "done", "result")

    def __init__(self, item: T):
        self.item = item
        self.taken = False  # a writer has it: it is written (or failed) whatever its caller does now
        self.done = False
        self.result: object = None


_combiners: weakref.WeakSet[Combiner] = weakref.WeakSet()


def _reset_in_child() -> None:
    # Right after a fork, in the child's only thread: the parent's queue and writer are not here.
    for combiner in list(_combiners):
        combiner._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


class Combiner(Generic[T, R]):
    """Writes concurrent :meth:`submit` calls' items in batches, each batch by one of the callers.

    ``write(items)`` returns one result per item, in order (an exception it
    raises is every item's :class:`BatchFailed`). A caller interrupted while
    its item waits in the queue takes it back out (it is not written). Fork-safe:
    a child process starts with an empty queue and no writer.
    """

    def __init__(self, write: Callable[[list[T]], Sequence[R]], *, max_size: int = 128):
        if max_size < 1:
            raise ValueError(f"max_size must be ≥ 1, got {max_size!r}")
        self._write = write
        self.max_size = max_size
        self._reset()
        _combiners.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Slot[T]] = deque()
        self._writing = False
        self._last = 0
        self._written = 0  # writes finished: what a queued caller's timeout measures progress by

    def submit(self, item: T, *, timeout: float | None = None) -> R | BatchFailed | object:
        """Write ``item`` (with whatever else is queued) and return its result, or :class:`BatchFailed`;
        :data:`TIMED_OUT` if it waited in the queue ``timeout`` seconds during which no write finished (a
        writer stuck, not a busy one: each finished write starts the wait again). Then it is taken back out
        and never written; once a writer took it, its caller waits for that write's outcome."""
        slot: _Slot[T] = _Slot(item)
        cond = self._cond
        with cond:
            self._queue.append(slot)
            written = self._written
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while self._writing and not slot.done:
                    if deadline is None or slot.taken:
                        cond.wait()
                        continue
                    if self._written != written:  # a write finished: the writers are moving
                        written = self._written
                        deadline = time.monotonic() + timeout  # type: ignore[operator]
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._queue.remove(slot)
                        return TIMED_OUT
                    cond.wait(remaining)
            except BaseException:
                self._withdraw(slot)
                raise
            if slot.done:
                return slot.result
            self._writing = True
        try:
            while not slot.done:
                if len(self._queue) < self._last:
                    time.sleep(0)  # let the callers of the last batch queue their next items first
                batch: list[_Slot[T]] = []
                try:
                    with cond:
                        while self._queue and len(batch) < self.max_size:
                            taken = self._queue.popleft()
                            taken.taken = True
                            batch.append(taken)
                    if not batch:  # cannot happen: this caller's item is queued until a writer takes it
                        raise RuntimeError("a combiner's writer found its own item neither queued nor written")
                    self._last = len(batch)
                    self._write_batch(batch)
                finally:
                    for taken in batch:  # whatever came in between, no caller of the batch waits for ever
                        if not taken.done:
                            taken.result = BatchFailed(RuntimeError("the write of this batch was interrupted"))
                            taken.done = True
                    with cond:
                        self._written += 1
                        cond.notify_all()  # the batch's callers return now, not when this writer is done
        except BaseException:
            with cond:
                self._withdraw(slot)
            raise
        finally:
            with cond:
                self._writing = False
                cond.notify_all()  # the next caller in line writes
        return slot.result

    def _withdraw(self, slot: _Slot[T]) -> None:
        """Take an interrupted caller's item back out of the queue (the condition's lock held)."""
        if not slot.taken and not slot.done:
            try:
                self._queue.remove(slot)
            except ValueError:
                pass

    def _write_batch(self, batch: list[_Slot[T]]) -> None:
        """Write ``batch`` and hand each slot its result (an interruption in between: see :meth:`submit`)."""
        results: Sequence[object]
        try:
            results = self._write([slot.item for slot in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch write returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:
            for slot in batch:
                slot.result, slot.done = BatchFailed(exc), True
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the writer stops
                raise
            return
        for slot, result in zip(batch, results, strict=True):
            slot.result, slot.done = result, True


__all__ = ["TIMED_OUT", "BatchFailed", "Combiner"]

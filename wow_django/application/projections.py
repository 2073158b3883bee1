"""The snapshot step that follows an append, off the request thread.

Streams of one aggregate go to one lane (by hash of its id) and a lane runs
them one at a time, in the order the gateway submitted them, which within a
process is version order. For each stream the lane saves the snapshot the
strategy asked for (``SNAPSHOT_MODE="inline"``) or asks the task queue for
one (``"celery"``). A failure is logged and reported to whoever waits.

Projections and event processors do not run here: they run on followers
(:mod:`wow_django.application.followers`), from durable checkpoints, so a
process that dies after an append loses none of them. A lost snapshot costs
nothing but a longer load (the next one, or ``wow_rebuild_snapshots``,
writes it).

Around each stream a lane does what Django does around a request: the
database connections it used are closed when they broke or outlived
``CONN_MAX_AGE``, so a lane (a thread that lives as long as its process)
neither keeps failing on a connection the server dropped nor holds one
open forever.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from wow_django.bus.consumer import release_database_connections
from wow_django.persistence.records import EventStream, Snapshot

logger = logging.getLogger("wow_django.application.projections")


@dataclass
class Tracker:
    """Signals the stages of one stream's dispatch to whoever waits."""

    snapshot_done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)


# A tracker whose stages are already done (nothing to dispatch); shared, never written to.
COMPLETED = Tracker()
COMPLETED.snapshot_done.set()
# The tracker of a stream whose snapshot the snapshot follower writes (SNAPSHOT_MODE="follower"): the
# SNAPSHOT stage waits for that follower's checkpoint; shared, never written to.
BY_FOLLOWER = Tracker()
BY_FOLLOWER.snapshot_done.set()


@dataclass
class Job:
    stream: EventStream
    snapshot: Snapshot | None  # inline snapshot to save, if the strategy asked for one
    queue_snapshot: bool  # ask the task queue for a snapshot instead
    tracker: Tracker


def _release_connections() -> None:
    try:
        release_database_connections()
    except Exception:  # closing a broken connection may fail too; the next use reconnects
        logger.warning("releasing a dispatch lane's database connections failed", exc_info=True)


class Dispatcher:
    def __init__(self, *, lanes: int = 4, save_snapshot: Callable[[Snapshot], None] | None = None,
                 queue_snapshot: Callable[[EventStream], object] | None = None):
        if lanes < 1:
            raise ValueError("lanes must be ≥ 1")
        self.lane_count = lanes
        self.save_snapshot = save_snapshot
        self.queue_snapshot = queue_snapshot
        self._start()

    def _start(self) -> None:
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(self.lane_count)]
        self._threads: list[threading.Thread | None] = [None] * self.lane_count
        self._lock = threading.Lock()

    def submit(self, job: Job) -> None:
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
        """Let every lane finish what it was given, stop it, and start afresh on the next submit."""
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
            _release_connections()
            try:
                self.run_job(job)
            except Exception:  # never let one job kill the lane
                logger.exception("dispatch of %s failed", job.stream.id)
            finally:
                job.tracker.snapshot_done.set()
                _release_connections()

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


class InlineDispatcher(Dispatcher):
    """A dispatcher without lanes: :meth:`submit` runs the job in the calling thread, before it returns.

    What the runtime uses in inline mode (:func:`wow_django.application.runtime.inline_background`,
    turned on by the test isolation of :mod:`wow_django.testing`): a snapshot saved by a lane would
    go through the lane's own database connection, outside the transaction a Django ``TestCase``
    wraps its test in.
    """

    def __init__(self, *, save_snapshot: Callable[[Snapshot], None] | None = None,
                 queue_snapshot: Callable[[EventStream], object] | None = None):
        super().__init__(lanes=1, save_snapshot=save_snapshot, queue_snapshot=queue_snapshot)

    def submit(self, job: Job) -> None:
        self.run_job(job)  # reports its own failure to the tracker and sets it done

    def close(self, timeout: float = 5.0) -> None:
        return None

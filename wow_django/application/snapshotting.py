"""Snapshot strategies, the snapshot follower, the snapshot refresh (what a queued snapshot task runs), and
the rebuild.

**The snapshot follower** (``SNAPSHOT_MODE="follower"``, the default) writes snapshots from the event
feed, off the command path, as Wow's snapshot processor does: a follower named
:data:`SNAPSHOT_FOLLOWER` (checkpointed, leased, run by ``wow_follow`` or the follower threads like any
other) keeps the latest state of the aggregates it has seen, applies each stream to it, and at the end of
each batch saves one snapshot per aggregate the strategy asked for (the latest state: ten commands to one
aggregate within a batch cost one write, not ten). Saves stay version-guarded. An aggregate it has not
seen, or whose next stream skips versions it did not see, is loaded from the stores (snapshot + tail). A
store's transient failure fails the batch, which is handed again from the checkpoint: a snapshot is never
lost to an outage, and nothing needs repairing by hand. The ``SNAPSHOT`` wait stage waits for this
follower to pass the command's stream.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from wow_django.application.repository import AggregateRepository, apply_stream, snapshot_of
from wow_django.domain.aggregate import Aggregate
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.records import now_ms

logger = logging.getLogger("wow_django.application.snapshotting")

#: The name of the snapshot follower (``wow_followers`` shows it; rewind it to rewrite snapshots).
SNAPSHOT_FOLLOWER = "wow-snapshots"


def should_snapshot(strategy: str, aggregate: Aggregate, *, version_offset: int, time_offset_s: float,
                    now: int | None = None) -> bool:
    """Whether the aggregate, just advanced, should be snapshotted.

    ``all``: every version. ``version_offset``: when at least ``version_offset``
    versions passed since the snapshot it was loaded from. ``time_offset``:
    when the snapshot it was loaded from is older than ``time_offset_s`` (or
    there is none). ``none``: never.
    """
    if strategy == "all":
        return True
    if strategy == "version_offset":
        return aggregate.version - aggregate.snapshot_version >= version_offset
    if strategy == "time_offset":
        if aggregate.snapshot_time == 0:
            return True
        return (now if now is not None else now_ms()) - aggregate.snapshot_time >= time_offset_s * 1000
    if strategy == "none":
        return False
    raise ValueError(f"unknown snapshot strategy {strategy!r}")


def refresh_snapshot(repository: AggregateRepository, cls: type[Aggregate], aggregate_id: str) -> int | None:
    """Load the aggregate (snapshot + later events) and save it; the version saved, or None."""
    key = repository.locate(cls, aggregate_id)  # a task serves every tenant: the one the aggregate is stored under
    aggregate = repository.load(cls, aggregate_id, tenant_id=key.tenant_id) if key is not None else None
    if aggregate is None or repository.snapshot_store is None:
        return None
    if aggregate.version == aggregate.snapshot_version:
        return aggregate.version  # already current
    repository.snapshot_store.save(snapshot_of(aggregate, repository.context_name))
    return aggregate.version


def rebuild_snapshots(repository: AggregateRepository, cls: type[Aggregate], *,
                      progress: Callable[[int, str], None] | None = None, batch: int = 500) -> int:
    """Replay every aggregate of ``cls`` from its events and save the snapshot.

    Safe to rerun and to run beside live traffic: saves are version-guarded.
    Calls ``progress(done, aggregate_id)`` after each aggregate; returns the count.
    """
    if repository.snapshot_store is None:
        raise ValueError("no snapshot store configured")
    done = 0
    for key in repository.event_store.iter_all(cls.aggregate_name, batch=batch):
        aggregate = repository.load(cls, key.id, tenant_id=key.tenant_id, use_snapshot=False)
        if aggregate is not None:
            repository.snapshot_store.save(snapshot_of(aggregate, repository.context_name))
        done += 1
        if progress is not None:
            progress(done, key.id)
    return done


class SnapshotWriter:
    """The snapshot follower's handler (see the module docstring): ``writer(item)`` per stream, then
    :meth:`flush` before the batch's checkpoint.

    ``repository`` gives the stores to read and write (called once per stream: a runtime rebuilt after a
    settings change is followed, with the states forgotten); ``transient`` tells a store's passing failure
    (re-raised: the batch is handed again) from any other. At most ``capacity`` aggregates' states are
    kept, the least recently seen dropped first (an unsaved one never).
    """

    def __init__(self, repository: Callable[[], AggregateRepository | None], *, strategy: str, version_offset: int,
                 time_offset_s: float, aggregate_type: Callable[[str], type[Aggregate] | None],
                 transient: Callable[[BaseException], bool], capacity: int = 10_000):
        if capacity < 1:
            raise ValueError("capacity must be ≥ 1")
        self._repository = repository
        self.strategy = strategy
        self.version_offset = version_offset
        self.time_offset_s = time_offset_s
        self._aggregate_type = aggregate_type
        self._transient = transient
        self.capacity = capacity
        self._states: OrderedDict[tuple[str, str, str], Aggregate] = OrderedDict()
        self._dirty: dict[tuple[str, str, str], Aggregate] = {}
        self._source: AggregateRepository | None = None
        self._lock = threading.Lock()  # one runner holds the lease, but inline and thread runners may share it
        #: Counters for tests and benches: streams applied, aggregates loaded from the stores, snapshots saved.
        self.applied = self.loaded = self.saved = 0

    def _current(self) -> AggregateRepository | None:
        repository = self._repository()
        if repository is not self._source:
            self._states.clear()
            self._dirty.clear()
            self._source = repository
        return repository

    def __call__(self, item) -> None:
        with self._lock:
            repository = self._current()
            if repository is None or repository.snapshot_store is None:
                return
            stream = item.stream
            cls = self._aggregate_type(stream.aggregate_name)
            if cls is None:
                return  # an aggregate type this code does not declare (any more): nothing to snapshot
            agg = stream.aggregate_id
            key = (agg.aggregate_name, agg.id, agg.tenant_id)
            aggregate = self._states.get(key)
            if aggregate is not None and aggregate.version >= stream.version:
                return  # already applied (a batch handed again, a rewind): its state holds it
            try:
                if aggregate is None and stream.version == 1:
                    aggregate = cls(agg.id, agg.tenant_id)  # a new aggregate: nothing to load
                if aggregate is not None and aggregate.version == stream.version - 1:
                    apply_stream(aggregate, stream)
                    self.applied += 1
                else:
                    aggregate = repository.load(cls, agg.id, tenant_id=agg.tenant_id)
                    self.loaded += 1
                    if aggregate is None or aggregate.version < stream.version:
                        # The feed saw it, the store's read did not (yet): a lagging read, retried with the batch.
                        raise RecoverableStoreError(
                            f"{agg.aggregate_name} {agg.id!r} v{stream.version} is in the feed but not loadable "
                            "from the event store yet; retry")
            except BaseException:
                # A half-applied state is never kept. A snapshot the strategy asked for before this stream (its
                # state now half-applied too) is taken again from the stores, as it was before this stream.
                self._states.pop(key, None)
                if self._dirty.pop(key, None) is not None and stream.version > 1:
                    try:
                        before = repository.load(cls, agg.id, tenant_id=agg.tenant_id, tail_version=stream.version - 1)
                    except Exception:  # the snapshot is lost to this failure only (logged with it)
                        logger.exception("reloading %s %r v%s after a failed stream failed", agg.aggregate_name,
                                         agg.id, stream.version - 1)
                    else:
                        if before is not None:
                            self._dirty[key] = before
                raise
            self._remember(key, aggregate)
            if should_snapshot(self.strategy, aggregate, version_offset=self.version_offset,
                               time_offset_s=self.time_offset_s):
                self._dirty[key] = aggregate

    def _remember(self, key: tuple[str, str, str], aggregate: Aggregate) -> None:
        self._states[key] = aggregate
        self._states.move_to_end(key)
        while len(self._states) > self.capacity:
            oldest = next((k for k in self._states if k not in self._dirty), None)
            if oldest is None:
                break
            del self._states[oldest]

    def flush(self) -> None:
        """Save the snapshot of every aggregate the strategy asked for since the last flush (its latest
        state). A transient store error propagates (the batch is handed again; what is unsaved stays so);
        any other error is logged and that aggregate's snapshot is dropped (the next due stream, or
        ``wow_rebuild_snapshots``, writes it)."""
        with self._lock:
            repository = self._current()
            if repository is None or repository.snapshot_store is None:
                self._dirty.clear()
                return
            due = [(key, aggregate, snapshot_of(aggregate, repository.context_name))
                   for key, aggregate in self._dirty.items()]
            if not due:
                return
            try:  # all of them together (one statement on the django backend)...
                repository.snapshot_store.save_many([snapshot for _, _, snapshot in due])
            except Exception as exc:
                if self._transient(exc):
                    raise
                # ...or, when one cannot be stored, one by one: the others are saved, that one is dropped.
                logger.warning("saving %d snapshots together failed (%s: %s); saving them one by one", len(due),
                               type(exc).__name__, exc)
                for key, aggregate, snapshot in due:
                    try:
                        repository.snapshot_store.save(snapshot)
                    except Exception as exc:
                        if self._transient(exc):
                            raise
                        logger.exception("snapshot of %s %r v%s failed; dropped", key[0], key[1], aggregate.version)
                    else:
                        self._saved(aggregate, snapshot)
                    del self._dirty[key]
                return
            for key, aggregate, snapshot in due:
                self._saved(aggregate, snapshot)
                del self._dirty[key]

    def _saved(self, aggregate: Aggregate, snapshot) -> None:
        self.saved += 1
        aggregate.snapshot_version = aggregate.version
        aggregate.snapshot_time = snapshot.snapshot_time


_repository_provider: Callable[[], AggregateRepository | None] | None = None


def install_repository_provider(provider: Callable[[], AggregateRepository | None]) -> None:
    """Where the snapshot follower finds the stores (the runtime installs its own when it is imported)."""
    global _repository_provider
    _repository_provider = provider


def runtime_repository() -> AggregateRepository | None:
    """The installed provider's repository (None before a runtime is installed)."""
    provider = _repository_provider
    return provider() if provider is not None else None

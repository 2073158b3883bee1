"""Snapshot strategies, the snapshot refresh (what a queued snapshot task runs), and the rebuild."""

from __future__ import annotations

from collections.abc import Callable

from wow_django.application.repository import AggregateRepository, snapshot_of
from wow_django.domain.aggregate import Aggregate
from wow_django.persistence.records import now_ms


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

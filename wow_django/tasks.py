"""Celery tasks. They take ids (or a queued command message), stay thin, and are idempotent.

- ``process_command``: a command sent with wait stage SENT. Reprocessing the
  same message is recognised by its request id and appends nothing.
- ``save_snapshot``: brings one aggregate's snapshot up to date; repeated
  requests for one aggregate are coalesced by ``request_snapshot``.
- ``rebuild_snapshots``: replays every aggregate of a type.

Transient store errors (``RecoverableStoreError``) are retried with backoff.
"""

from __future__ import annotations

import dataclasses
import logging

from celery import shared_task
from django.core.cache import cache

from wow_django.exceptions import CommandError, EventVersionConflict, RecoverableStoreError

logger = logging.getLogger("wow_django.tasks")

# How long a pending-snapshot marker lives: the bound on snapshot lag if a task is lost.
SNAPSHOT_PENDING_TTL_S = 60
RETRY = {"autoretry_for": (RecoverableStoreError,), "retry_backoff": True, "retry_backoff_max": 60,
         "retry_jitter": True, "max_retries": 5}


def _snapshot_key(aggregate_name: str, aggregate_id: str) -> str:
    return f"wow:snapshot-pending:{aggregate_name}:{aggregate_id}"


@shared_task(name="wow_django.process_command", acks_late=True, **RETRY)
def process_command(message: dict) -> dict:
    """Process a queued command; returns the command result as JSON."""
    from wow_django.gateway import CommandMessage, WaitStage, get_gateway

    queued = CommandMessage.from_dict(message)
    # A redelivered message must be recognised: always check its request id.
    queued = dataclasses.replace(queued, request_id_given=True)
    try:
        result = get_gateway().process_message(queued, WaitStage.PROJECTED)
    except (CommandError, EventVersionConflict) as exc:
        logger.info("queued command %s refused: %s", queued.command_id, exc)
        return {
            "commandId": queued.command_id, "requestId": queued.request_id,
            "aggregateName": queued.aggregate_name, "aggregateId": queued.aggregate_id,
            "errorCode": exc.error_code, "errorMsg": str(exc),
            "bindingErrors": list(getattr(exc, "binding_errors", [])),
        }
    return result.to_json()


def request_snapshot(aggregate_name: str, aggregate_id: str) -> bool:
    """Queue ``save_snapshot`` unless one is already pending for this aggregate."""
    if not cache.add(_snapshot_key(aggregate_name, aggregate_id), 1, SNAPSHOT_PENDING_TTL_S):
        return False
    try:
        save_snapshot.delay(aggregate_name, aggregate_id)
    except Exception:
        cache.delete(_snapshot_key(aggregate_name, aggregate_id))
        raise
    return True


@shared_task(name="wow_django.save_snapshot", **RETRY)
def save_snapshot(aggregate_name: str, aggregate_id: str) -> int | None:
    """Save the latest snapshot of one aggregate; returns its version (None if unknown)."""
    from wow_django.domain.aggregate import aggregate_type
    from wow_django.gateway import get_gateway
    from wow_django.snapshots import refresh_snapshot

    # Clear the marker first: events appended from now on queue a new task.
    cache.delete(_snapshot_key(aggregate_name, aggregate_id))
    cls = aggregate_type(aggregate_name)
    if cls is None:
        logger.error("save_snapshot: no aggregate named %r", aggregate_name)
        return None
    return refresh_snapshot(get_gateway().repository, cls, aggregate_id)


@shared_task(name="wow_django.rebuild_snapshots", **RETRY)
def rebuild_snapshots(aggregate_name: str) -> int:
    """Replay every aggregate of one type and save its snapshot; returns how many."""
    from wow_django.domain.aggregate import aggregate_type
    from wow_django.gateway import get_gateway
    from wow_django.snapshots import rebuild_snapshots as rebuild

    cls = aggregate_type(aggregate_name)
    if cls is None:
        raise ValueError(f"no aggregate named {aggregate_name!r}")
    return rebuild(get_gateway().repository, cls)

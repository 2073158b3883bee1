"""Celery tasks, and the task queue (:class:`CeleryTaskQueue`) the application hands work to.

Tasks take ids (or a queued command message), stay thin (they call the
runtime's services) and are idempotent:

- ``wow_django.process_command``: a command sent with wait stage SENT.
  Reprocessing the same message is recognised by its request id and appends nothing.
- ``wow_django.save_snapshot``: brings one aggregate's snapshot up to date;
  repeated requests for one aggregate are coalesced by :meth:`CeleryTaskQueue.request_snapshot`.
- ``wow_django.rebuild_snapshots``: replays every aggregate of a type.
- ``wow_django.bus.rollup``: recompute one bus event's status from its
  feedback. Queued on ``WOW['BUS_ROLLUP_QUEUE']`` by every feedback; run that
  queue with a single serial worker (``celery worker -Q wow.bus.rollup -c 1``).
- ``wow_django.bus.relay_pending``: publish PENDING events older than
  ``WOW['BUS_RELAY_AFTER_S']``; schedule it periodically (celery beat).
- ``wow_django.bus.repush``: re-push an event (whole, or to one consumer).
- ``wow_django.bus.purge``: delete events past their retention (``WOW['BUS_RETENTION_DAYS']``).
- ``wow_django.follow``: run followers (projections, event processors,
  ``@follower``) until caught up, within a time budget; schedule it with
  celery beat where ``WOW['FOLLOWERS_RUN'] == "celery"`` (:func:`beat_schedule`).

Transient store errors (``RecoverableStoreError``) are retried with backoff.

Tasks the application queues by itself (commands, snapshots, rollups, the relay,
the resweep, followers) are fire-and-forget: nobody waits on them, so they store
no result (``ignore_result``), and a result backend does not fill up with one
entry per command. Their effects are in the stores (a command's outcome: its
events, or the request's status). ``rebuild_snapshots`` and ``repush`` keep
their results for the operator who queued them; a test or a script that wants
one of the others' results asks for it: ``apply_async(args, ignore_result=False)``.
"""

from __future__ import annotations

import dataclasses
import logging

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.core.cache import cache

from wow_django.application.following import run_until_caught_up
from wow_django.application.gateway import CommandMessage, WaitStage
from wow_django.application.ports import TaskQueue
from wow_django.application.runtime import close_runtime, get_runtime
from wow_django.application.snapshotting import rebuild_snapshots as rebuild
from wow_django.application.snapshotting import refresh_snapshot
from wow_django.conf import wow_settings
from wow_django.domain.registry import aggregate_type
from wow_django.exceptions import CommandError, EventVersionConflict, RecoverableStoreError

logger = logging.getLogger("wow_django.tasks")

# How long a pending-snapshot marker lives: the bound on snapshot lag if a task is lost.
SNAPSHOT_PENDING_TTL_S = 60
RETRY = {"autoretry_for": (RecoverableStoreError,), "retry_backoff": True, "retry_backoff_max": 60,
         "retry_jitter": True, "max_retries": 5}


def _snapshot_key(aggregate_name: str, aggregate_id: str) -> str:
    return f"wow:snapshot-pending:{aggregate_name}:{aggregate_id}"


# --- the application's task queue ----------------------------------------------------------


class CeleryTaskQueue(TaskQueue):
    """The default ``WOW['TASK_QUEUE']``: each piece of work is a Celery task."""

    def process_command(self, message: dict) -> None:
        process_command.delay(message)

    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        """Queue ``save_snapshot`` unless one is already pending for this aggregate (a cache marker)."""
        if not cache.add(_snapshot_key(aggregate_name, aggregate_id), 1, SNAPSHOT_PENDING_TTL_S):
            return False
        try:
            save_snapshot.delay(aggregate_name, aggregate_id)
        except Exception:
            cache.delete(_snapshot_key(aggregate_name, aggregate_id))
            raise
        return True

    def rollup(self, event_id: str) -> bool:
        if rollup_event.app.conf.task_always_eager:
            # Not queued: the bus rolls up inline what the eager task would, without
            # Celery caching a broker pool and a result backend on the app.
            return False
        rollup_event.apply_async((event_id,), queue=wow_settings.BUS_ROLLUP_QUEUE)
        return True


@worker_process_shutdown.connect(weak=False, dispatch_uid="wow_django.tasks.close_runtime")
def close_runtime_in_pool_process(**kwargs) -> None:
    """A pool process leaves with ``os._exit`` (no ``atexit``): what its runtime's dispatch lanes still hold
    (event processors of commands a task sent) runs before it goes."""
    close_runtime()


# --- commands and snapshots ------------------------------------------------------------------


# Acknowledged after the task ran; a pool process killed meanwhile (OOM, a deploy) has the message
# redelivered, not acknowledged as failed: the command was answered SENT and must still run. Both tasks
# are idempotent (request ids; the rollup recomputes).
@shared_task(name="wow_django.process_command", acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             **RETRY)
def process_command(message: dict) -> dict:
    """Process a queued command; returns the command result as JSON."""
    queued = CommandMessage.from_dict(message)
    # A redelivered message must be recognised: always check its request id.
    queued = dataclasses.replace(queued, request_id_given=True)
    try:
        result = get_runtime().gateway.process_message(queued, WaitStage.PROJECTED)
    except (CommandError, EventVersionConflict) as exc:
        logger.info("queued command %s refused: %s", queued.command_id, exc)
        return {
            "commandId": queued.command_id, "requestId": queued.request_id,
            "aggregateName": queued.aggregate_name, "aggregateId": queued.aggregate_id,
            "errorCode": exc.error_code, "errorMsg": str(exc),
            "bindingErrors": list(getattr(exc, "binding_errors", [])),
        }
    return result.to_json()


@shared_task(name="wow_django.save_snapshot", ignore_result=True, **RETRY)
def save_snapshot(aggregate_name: str, aggregate_id: str) -> int | None:
    """Save the latest snapshot of one aggregate; returns its version (None if unknown)."""
    # Clear the marker first: events appended from now on queue a new task.
    cache.delete(_snapshot_key(aggregate_name, aggregate_id))
    cls = aggregate_type(aggregate_name)
    if cls is None:
        logger.error("save_snapshot: no aggregate named %r", aggregate_name)
        return None
    return refresh_snapshot(get_runtime().gateway.repository, cls, aggregate_id)


@shared_task(name="wow_django.rebuild_snapshots", **RETRY)
def rebuild_snapshots(aggregate_name: str) -> int:
    """Replay every aggregate of one type and save its snapshot; returns how many."""
    cls = aggregate_type(aggregate_name)
    if cls is None:
        raise ValueError(f"no aggregate named {aggregate_name!r}")
    return rebuild(get_runtime().gateway.repository, cls)


# --- the bus -------------------------------------------------------------------------------------


@shared_task(name="wow_django.bus.rollup", acks_late=True, reject_on_worker_lost=True, ignore_result=True, **RETRY)
def rollup_event(event_id: str) -> str | None:
    """The event's status after the rollup (None: no such event)."""
    return get_runtime().bus.rollup(event_id)


@shared_task(name="wow_django.bus.relay_pending", ignore_result=True, **RETRY)
def relay_pending(limit: int = 500) -> dict:
    """``{"published": [...], "failed": [...]}`` event ids."""
    return get_runtime().bus.relay_pending(limit=limit).to_json()


@shared_task(name="wow_django.bus.resweep", ignore_result=True, **RETRY)
def resweep_statuses(older_than_s: float = 60.0, limit: int = 500) -> dict:
    """Roll up again event statuses that may be behind their feedback (a lost rollup); see
    :meth:`EventBus.resweep`."""
    return get_runtime().bus.resweep(older_than_s=older_than_s, limit=limit)


@shared_task(name="wow_django.bus.purge", ignore_result=True, **RETRY)
def purge_events() -> int:
    """Delete bus events past their retention (``WOW['BUS_RETENTION_DAYS']``,
    ``WOW['BUS_EXPIRED_RETENTION_DAYS']``); how many. See :meth:`EventBus.purge`."""
    return len(get_runtime().bus.purge())


@shared_task(name="wow_django.bus.repush", **RETRY)
def repush_event(event_id: str, requested_by: str, consumer_id: str | None = None) -> dict:
    """The re-push result as JSON; a refused re-push raises ``RepushRefused``."""
    return get_runtime().bus.repush(event_id, requested_by=requested_by, consumer_id=consumer_id).to_json()


# --- followers -----------------------------------------------------------------------------------


@shared_task(name="wow_django.follow", ignore_result=True)
def follow(names: list[str] | None = None, budget_s: float = 50.0) -> dict:
    """Run the named followers (default: every declared one) until each is caught up, or ``budget_s`` has
    passed; their positions. The leases keep two runs (an overlapping beat, two workers) from processing
    one follower at once: the second waits for the lease until its budget ends."""
    return run_until_caught_up(names, budget_s=budget_s)


def beat_schedule(*, follow_every_s: float = 5.0, relay_every_s: float = 30.0, resweep_every_s: float = 300.0,
                  purge_every_s: float = 3600.0) -> dict:
    """The periodic tasks wow_django needs, for ``app.conf.beat_schedule``::

        app.conf.beat_schedule = {**wow_django.tasks.beat_schedule(), ...}

    The bus relay (PENDING events the broker did not take) and the status resweep (statuses a lost
    rollup left behind their feedback) always; the bus purge when a retention is set
    (``WOW['BUS_RETENTION_DAYS']`` or ``WOW['BUS_EXPIRED_RETENTION_DAYS']``); the followers when
    ``WOW['FOLLOWERS_RUN'] == "celery"`` (each run's budget is the interval, and a run expires unstarted
    after it, so runs never pile up behind a busy worker).
    """
    schedule = {
        "wow-bus-relay-pending": {"task": "wow_django.bus.relay_pending", "schedule": relay_every_s,
                                  "options": {"expires": relay_every_s}},
        "wow-bus-resweep": {"task": "wow_django.bus.resweep", "schedule": resweep_every_s,
                            "options": {"expires": resweep_every_s}},
    }
    if wow_settings.BUS_RETENTION_DAYS is not None or wow_settings.BUS_EXPIRED_RETENTION_DAYS is not None:
        schedule["wow-bus-purge"] = {"task": "wow_django.bus.purge", "schedule": purge_every_s,
                                     "options": {"expires": purge_every_s}}
    if wow_settings.FOLLOWERS_RUN == "celery":
        schedule["wow-follow"] = {"task": "wow_django.follow", "schedule": follow_every_s,
                                  "kwargs": {"budget_s": follow_every_s}, "options": {"expires": follow_every_s}}
    return schedule

"""Celery tasks, and the task queue (:class:`CeleryTaskQueue`) the application hands work to.

Tasks take ids (or a queued command message), stay thin (they call the
runtime's services) and are idempotent:

- ``wow_django.process_command``: a command sent with wait stage SENT.
  Reprocessing the same message is recognised by its request id and appends nothing.
- ``wow_django.save_snapshot``: brings one aggregate's snapshot up to date;
  repeated requests for one aggregate are coalesced by :meth:`CeleryTaskQueue.request_snapshot`.
- ``wow_django.rebuild_snapshots``: replays every aggregate of a type.
- ``wow_django.bus.rollup_pending``: roll up every bus event a feedback marked
  pending (coalesced rollups, :class:`PendingRollups`). A feedback queues it on
  ``WOW['BUS_ROLLUP_QUEUE']`` only when none is queued already; run that queue
  with a single serial worker (``celery worker -Q wow.bus.rollup -c 1``).
- ``wow_django.bus.rollup``: recompute one bus event's status from its
  feedback: what each feedback queues instead when rollups are not coalesced
  (``WOW['BUS_ROLLUP_COALESCE']`` off, or a default cache that is not Redis).
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

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache

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
# How long the "a rollup drain is queued" marker lives: the bound on rollup lag if that task is lost.
ROLLUP_QUEUED_TTL_S = 60
# Events a drain rolls up between two updates of its progress in Redis.
ROLLUP_BATCH = 200
# A drain that found nothing pending watches for more this long before it lets go of the marker: under a
# steady stream of feedback one task keeps rolling up, instead of a task (and its Celery overhead) per
# handful of events. Rollups are not delayed by it: what comes in is rolled up at the next look.
ROLLUP_LINGER_S = 0.1
ROLLUP_LINGER_POLL_S = 0.01
# A drain hands over to a new task after this long: a Redis broker redelivers a task still unacknowledged
# after its visibility timeout (an hour by default), and other tasks of the queue wait behind it.
ROLLUP_DRAIN_BUDGET_S = 30.0
RETRY = {"autoretry_for": (RecoverableStoreError,), "retry_backoff": True, "retry_backoff_max": 60,
         "retry_jitter": True, "max_retries": 5}


def _snapshot_key(aggregate_name: str, aggregate_id: str) -> str:
    return f"wow:snapshot-pending:{aggregate_name}:{aggregate_id}"


def queue_once(marker: str, ttl_s: float, send: Callable[[], object], *,
               claim: Callable[[], bool] | None = None) -> bool:
    """Call ``send()`` (queue a task) unless ``marker`` is set in the default cache; whether it did.

    The marker is set for ``ttl_s`` (the bound on lag if the queued task is lost) and
    cleared again if ``send`` fails; the task clears it when it has started (snapshots) or
    finished (rollup drains), so requests made meanwhile are coalesced into that task.
    ``claim()``, if given, sets the marker instead (``cache.add``'s way, along with what it
    does in the same round trip) and says whether it did.
    """
    if not (claim() if claim is not None else cache.add(marker, 1, ttl_s)):
        return False
    try:
        send()
    except Exception:
        cache.delete(marker)
        raise
    return True


class PendingRollups:
    """The events waiting for a coalesced rollup: a Redis set in the default cache's server, one per rollup
    queue, and the marker that says a drain task is queued.

    A feedback adds its eventId (:meth:`add`) after storing its row. A drain (:meth:`drain`) renames the
    pending set to a taken set (atomic: later adds start a new pending set), rolls the taken events up
    in batches, and removes each batch from the taken set only once it is rolled up, so a drain that
    died mid-batch leaves its events for the next drain, which starts with them. Every id in either set
    had its feedback row stored before it was added: a rollup that reads after taking it sees the row.

    Needs a cache every process shares (Django's ``RedisCache``, :meth:`available`); a process-local
    cache would keep each process's pending events from the worker.
    """

    def __init__(self, queue: str):
        self.queue = queue
        self.marker = f"wow:bus-rollup-queued:{queue}"
        self.pending = cache.make_and_validate_key(f"wow:bus-rollup-pending:{queue}")
        self.taken = cache.make_and_validate_key(f"wow:bus-rollup-taken:{queue}")

    @staticmethod
    def available() -> bool:
        """Whether the default cache is Redis, where the pending set can live."""
        return isinstance(caches["default"], RedisCache)

    @staticmethod
    def _client():
        return cache._cache.get_client(write=True)  # the server Django's RedisCache writes to

    def add(self, event_ids: list[str], *, marker_ttl_s: float) -> bool:
        """Add the events to the pending set and set the marker unless it is set (as ``cache.add`` would),
        in one round trip; whether this call set the marker (then it must queue a drain)."""
        pipe = self._client().pipeline(transaction=False)  # the commands still run in this order
        pipe.sadd(self.pending, *event_ids)
        pipe.set(cache.make_and_validate_key(self.marker), 1, ex=int(marker_ttl_s), nx=True)
        return bool(pipe.execute()[1])

    def has_any(self) -> bool:
        """Whether an event is pending (or taken by a drain that did not finish)."""
        return bool(self._client().exists(self.pending, self.taken))

    def wait_for_more(self, seconds: float, *, poll_s: float = ROLLUP_LINGER_POLL_S) -> bool:
        """Whether an event became pending within ``seconds`` (looked for every ``poll_s``)."""
        client = self._client()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(poll_s)
            if client.exists(self.pending):
                return True
        return False

    def drain(self, rollup_many: Callable[[list[str]], object], *, batch: int | None = None,
              deadline: float | None = None) -> int:
        """Roll up pending events, ``batch`` (default ``ROLLUP_BATCH``) at a time, until none is left
        (or ``deadline``, a ``time.monotonic()``, passed); how many."""
        client = self._client()
        batch = batch or ROLLUP_BATCH
        done = 0
        while deadline is None or time.monotonic() < deadline:
            ids = [i.decode() if isinstance(i, bytes) else i for i in client.srandmember(self.taken, batch)]
            if not ids:
                if not self._take(client):
                    break
                continue
            rollup_many(ids)
            client.srem(self.taken, *ids)
            done += len(ids)
        return done

    def _take(self, client) -> bool:
        """Make the pending set the taken set; False when nothing is pending."""
        import redis

        try:
            # False: a taken set exists (a concurrent drain's, against the one-worker rule): roll it up too.
            client.renamenx(self.pending, self.taken)
        except redis.ResponseError:  # no pending set: nothing is pending
            return False
        return True


# --- the application's task queue ----------------------------------------------------------


class CeleryTaskQueue(TaskQueue):
    """The default ``WOW['TASK_QUEUE']``: each piece of work is a Celery task."""

    def process_command(self, message: dict) -> None:
        process_command.delay(message)

    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        """Queue ``save_snapshot`` unless one is already pending for this aggregate (a cache marker)."""
        return queue_once(_snapshot_key(aggregate_name, aggregate_id), SNAPSHOT_PENDING_TTL_S,
                          lambda: save_snapshot.delay(aggregate_name, aggregate_id))

    def rollup(self, event_id: str) -> bool:
        return not self.rollup_many([event_id])

    def rollup_many(self, event_ids: list[str]) -> list[str]:
        """Mark the events pending and queue a drain unless one is queued, in one round trip to Redis
        (coalesced, see :func:`coalesced_rollups`); else queue each event's own rollup task."""
        if rollup_event.app.conf.task_always_eager:
            # Not queued: the bus rolls up inline what the eager task would, without
            # Celery caching a broker pool and a result backend on the app.
            return list(event_ids)
        queue = wow_settings.BUS_ROLLUP_QUEUE
        if not event_ids:
            return []
        if coalesced_rollups():
            pending = PendingRollups(queue)
            queue_once(pending.marker, ROLLUP_QUEUED_TTL_S, lambda: _queue_drain(queue),
                       claim=lambda: pending.add(event_ids, marker_ttl_s=ROLLUP_QUEUED_TTL_S))
            return []
        for event_id in event_ids:
            rollup_event.apply_async((event_id,), queue=queue)
        return []


def coalesced_rollups() -> bool:
    """Whether feedback marks its event pending for a drain task (``WOW['BUS_ROLLUP_COALESCE']`` and a
    Redis default cache) rather than queueing a task per feedback."""
    return wow_settings.BUS_ROLLUP_COALESCE and PendingRollups.available()


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


def _queue_drain(queue: str) -> None:
    """Queue a drain of ``queue``'s pending set (:func:`rollup_pending`), on that queue."""
    rollup_pending.apply_async((queue,), queue=queue)


@shared_task(name="wow_django.bus.rollup_pending", acks_late=True, reject_on_worker_lost=True, ignore_result=True,
             **RETRY)
def rollup_pending(queue: str) -> int:
    """Roll up every event pending on ``queue``'s set (:class:`PendingRollups`); how many rollups ran.

    The queued marker is cleared only once nothing has been pending for ``ROLLUP_LINGER_S``, and taken
    back if a feedback came in between: a feedback that found it set (and queued nothing) is always
    rolled up, by this run or the next. Past ``ROLLUP_DRAIN_BUDGET_S`` the run queues its successor and
    ends.
    """
    if not PendingRollups.available():
        logger.error("bus rollup: this worker's CACHES['default'] is not Redis, so it cannot see the events "
                     "pending on %r; configure the same Redis cache as the processes that record feedback "
                     "(the resweep repairs their statuses meanwhile).", queue)
        return 0
    pending = PendingRollups(queue)
    rollup_many = get_runtime().bus.rollup_many
    deadline = time.monotonic() + ROLLUP_DRAIN_BUDGET_S
    done = 0
    try:
        while True:
            done += pending.drain(rollup_many, deadline=deadline)
            if time.monotonic() >= deadline and pending.has_any():
                cache.set(pending.marker, 1, ROLLUP_QUEUED_TTL_S)
                _queue_drain(queue)
                return done
            if ROLLUP_LINGER_S and time.monotonic() < deadline and pending.wait_for_more(ROLLUP_LINGER_S):
                continue  # still holding the marker: more feedback came in
            cache.delete(pending.marker)
            # A feedback added after the drain found nothing may have seen the marker still set.
            if not pending.has_any() or not cache.add(pending.marker, 1, ROLLUP_QUEUED_TTL_S):
                return done
    except Exception:
        # The next feedback queues a drain (a retry may come too): the taken events are rolled up first.
        with contextlib.suppress(Exception):
            cache.delete(pending.marker)
        raise


@shared_task(name="wow_django.bus.relay_pending", ignore_result=True, **RETRY)
def relay_pending(limit: int = 500) -> dict:
    """``{"published": [...], "failed": [...]}`` event ids. Also queues a rollup drain for events stranded on
    the pending set (:func:`queue_stranded_rollups`)."""
    relayed = get_runtime().bus.relay_pending(limit=limit).to_json()
    try:
        queue_stranded_rollups()
    except Exception:  # the relay's own work is done; the next run (or the resweep) tries again
        logger.warning("bus rollup: could not check the pending set for stranded events", exc_info=True)
    return relayed


def queue_stranded_rollups() -> bool:
    """Queue a rollup drain when events wait on the pending set and no drain is queued; whether it did.

    A feedback adds its event and sets the queued marker in one round trip, then queues the drain: a process
    killed in between (SIGKILL, the OOM killer, a deploy) leaves the marker set with no task behind it. Later
    feedback sees the marker and queues nothing; once the marker expires (``ROLLUP_QUEUED_TTL_S``) only the
    next feedback of the queue, or the resweep, would roll those events up. ``relay_pending``, which beat runs
    every ``relay_every_s``, calls this, so such events wait at most the marker's life and one relay period.
    """
    if rollup_event.app.conf.task_always_eager or not coalesced_rollups():
        return False
    queue = wow_settings.BUS_ROLLUP_QUEUE
    pending = PendingRollups(queue)
    if not pending.has_any():
        return False
    queued = queue_once(pending.marker, ROLLUP_QUEUED_TTL_S, lambda: _queue_drain(queue))
    if queued:
        logger.warning("bus rollup: events were pending on %r with no drain queued (a process died between "
                       "recording feedback and queueing the drain); queued one", queue)
    return queued


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

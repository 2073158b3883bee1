"""Celery tasks of the bus. They take ids, stay thin and are idempotent.

- ``wow_django.bus.rollup``: recompute one event's status from its feedback.
  Queued on ``WOW['BUS_ROLLUP_QUEUE']`` by every feedback; run that queue with
  a single serial worker (``celery worker -Q wow.bus.rollup -c 1``) so
  rollups never run concurrently. Rerunning it changes nothing.
- ``wow_django.bus.relay_pending``: publish PENDING events older than
  ``WOW['BUS_RELAY_AFTER_S']``; schedule it periodically (celery beat).
- ``wow_django.bus.repush``: re-push an event (whole, or to one consumer).

Transient store errors (``RecoverableStoreError``) are retried with backoff.
"""

from __future__ import annotations

from celery import shared_task

from wow_django.tasks import RETRY


@shared_task(name="wow_django.bus.rollup", acks_late=True, ignore_result=True, **RETRY)
def rollup_event(event_id: str) -> str | None:
    """The event's status after the rollup (None: no such event)."""
    from wow_django.bus.service import get_bus

    return get_bus().rollup(event_id)


@shared_task(name="wow_django.bus.relay_pending", **RETRY)
def relay_pending(limit: int = 500) -> dict:
    """``{"published": [...], "failed": [...]}`` event ids."""
    from wow_django.bus.service import get_bus

    return get_bus().relay_pending(limit=limit).to_json()


@shared_task(name="wow_django.bus.repush", **RETRY)
def repush_event(event_id: str, requested_by: str, consumer_id: str | None = None) -> dict:
    """The re-push result as JSON; a refused re-push raises ``RepushRefused``."""
    from wow_django.bus.service import get_bus

    return get_bus().repush(event_id, requested_by=requested_by, consumer_id=consumer_id).to_json()

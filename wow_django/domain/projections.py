"""Declaring projections and event processors: code run for the events of one aggregate type.

Register them in an installed app's ``aggregates`` or ``projections`` module::

    @projection("order", events=[OrderPaid])
    def count_paid(message: DomainEventMessage) -> None: ...

    @event_processor("order", events=[OrderPaid])
    def publish_purchase(message: DomainEventMessage) -> None: ...

For each stored event stream the projections run first, then the processors,
each for the events it names (all of the aggregate's when ``events`` is
None). The application layer (:mod:`wow_django.application.projections`)
runs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wow_django.domain import registry
from wow_django.domain.registry import EventHandler
from wow_django.exceptions import DeclarationError


def _declare(kind: str, aggregate: Any, events: Iterable[Any] | None):
    aggregate_name = aggregate if isinstance(aggregate, str) else getattr(aggregate, "aggregate_name", None)
    if not isinstance(aggregate_name, str) or not aggregate_name:
        raise DeclarationError(f"@{kind} takes an aggregate name or Aggregate class, got {aggregate!r}")
    names = None
    if events is not None:
        names = frozenset(e if isinstance(e, str) else e.event_name for e in events)

    def decorate(fn):
        registry.current().add_handler(EventHandler(aggregate_name, names, fn,
                                                    "projection" if kind == "projection" else "processor"))
        return fn

    return decorate


def projection(aggregate: Any, events: Iterable[Any] | None = None):
    """Run ``fn(message)`` for the aggregate's events (all, or those listed); PROJECTED waits for it."""
    return _declare("projection", aggregate, events)


def event_processor(aggregate: Any, events: Iterable[Any] | None = None):
    """Run ``fn(message)`` after the projections, e.g. to publish integration events."""
    return _declare("event_processor", aggregate, events)

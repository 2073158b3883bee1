"""Declaring projections and event processors: code run for the events of one aggregate type.

Register them in an installed app's ``aggregates`` or ``projections`` module::

    @projection("order", events=[OrderPaid])
    def count_paid(message: DomainEventMessage) -> None: ...

    @event_processor("order", events=[OrderPaid])
    def publish_purchase(message: DomainEventMessage) -> None: ...

Each runs as a **follower** (DESIGN G, :mod:`wow_django.application.followers`):
it gets the aggregate's streams in commit order, at least once, from its own
durable checkpoint, one event at a time for the events it names (all of the
aggregate's when ``events`` is None). A stream stored while no follower ran
(a process killed after the append, a redeploy) is handled when one runs
again; a projection can be replayed by rewinding its follower
(``manage.py wow_followers rewind NAME --to 0``). So handlers must be
idempotent: an upsert keyed by the aggregate id and version, or an
integration event sent with an ``event_id`` derived from ``message.event_id``.

The follower is named ``name`` when given, else ``projection-<aggregate>-<function>``
(``processor-…`` for processors). Renaming one starts a new follower from the
first stream. ``PROJECTED`` waits for the aggregate's projections, not for
its processors.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from wow_django.domain import registry
from wow_django.domain.registry import EventHandler, check_name
from wow_django.exceptions import DeclarationError

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

#: A handler: ``fn(message)``, returned as it is by the decorators.
_Handler = TypeVar("_Handler", bound=Callable[[Any], object])


def default_name(kind: str, aggregate_name: str, fn: Any) -> str:
    """``<kind>-<aggregate>-<function>``, made a valid follower name (≤ 63 characters)."""
    name = _UNSAFE.sub("_", f"{kind}-{aggregate_name}-{getattr(fn, '__name__', 'handler')}")
    if len(name) > 63:
        name = f"{name[:54]}-{zlib.crc32(name.encode()):08x}"
    return name


def _declare(kind: str, aggregate: Any, events: Iterable[Any] | None,
             name: str | None = None) -> Callable[[_Handler], _Handler]:
    aggregate_name = aggregate if isinstance(aggregate, str) else getattr(aggregate, "aggregate_name", None)
    if not isinstance(aggregate_name, str) or not aggregate_name:
        raise DeclarationError(f"@{kind} takes an aggregate name or Aggregate class, got {aggregate!r}")
    names = None
    if events is not None:
        names = frozenset(e if isinstance(e, str) else e.event_name for e in events)

    short = "projection" if kind == "projection" else "processor"
    if name is not None:
        check_name(name, f"@{kind} name")

    def decorate(fn: _Handler) -> _Handler:
        registry.current().add_handler(EventHandler(aggregate_name, names, fn, short,
                                                    name or default_name(short, aggregate_name, fn)))
        return fn

    return decorate


def projection(aggregate: Any, events: Iterable[Any] | None = None, *,
               name: str | None = None) -> Callable[[_Handler], _Handler]:
    """Run ``fn(message)`` for the aggregate's events (all, or those listed) on follower ``name``;
    PROJECTED waits for it."""
    return _declare("projection", aggregate, events, name)


def event_processor(aggregate: Any, events: Iterable[Any] | None = None, *,
                    name: str | None = None) -> Callable[[_Handler], _Handler]:
    """Run ``fn(message)`` for the aggregate's events on follower ``name``, e.g. to publish integration
    events (the bus relay: send with an ``event_id`` derived from ``message.event_id``)."""
    return _declare("event_processor", aggregate, events, name)

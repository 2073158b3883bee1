"""The bus context: what ``send`` fills in when the caller leaves it out (seed 004 §3.3, §6.1).

A consumer handler runs inside the context of the event it handles, so the
events it sends become that event's children in the same trace::

    with bus_context(trace_id="trace-1", user_id="user-A", client_request_id="req-9"):
        bus.send("order.purchased", payload)   # traceId trace-1, initiator.userId user-A

Context variables follow the thread (and asyncio task) that set them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class BusContext:
    trace_id: str | None = None
    parent_event_id: str | None = None
    service: str | None = None
    operation: str | None = None
    user_id: str | None = None
    client_request_id: str | None = None


_EMPTY = BusContext()
_current: ContextVar[BusContext | None] = ContextVar("wow_bus_context", default=None)
_NAMES = {f.name for f in fields(BusContext)}


def current_context() -> BusContext:
    return _current.get() or _EMPTY


@contextlib.contextmanager
def bus_context(**values: str | None) -> Iterator[BusContext]:
    """Set context fields (``trace_id``, ``parent_event_id``, ``service``, ``operation``,
    ``user_id``, ``client_request_id``) for the block; the others are kept."""
    unknown = set(values) - _NAMES
    if unknown:
        raise TypeError(f"bus_context() got unknown fields {sorted(unknown)}; known: {sorted(_NAMES)}")
    current = _current.get()
    context = BusContext(**values) if current is None else replace(current, **values)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)

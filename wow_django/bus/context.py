"""The bus context: what ``send`` fills in when the caller leaves it out (seed 004 §3.3, §6.1).

A consumer handler runs inside the context of the event it handles, so the
events it sends become that event's children in the same trace::

    with bus_context(trace_id="trace-1", user_id="user-A", client_request_id="req-9"):
        bus.send("order.purchased", payload)   # traceId trace-1, initiator.userId user-A

Context variables follow the thread (and asyncio task) that set them.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar, Token
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


class bus_context(contextlib.AbstractContextManager):  # noqa: N801 (used as a function, as it was one)
    """Set context fields (``trace_id``, ``parent_event_id``, ``service``, ``operation``,
    ``user_id``, ``client_request_id``) for the block; the others are kept. ``with`` gives the context."""

    __slots__ = ("_values", "_token")

    def __init__(self, **values: str | None):
        unknown = values.keys() - _NAMES
        if unknown:
            raise TypeError(f"bus_context() got unknown fields {sorted(unknown)}; known: {sorted(_NAMES)}")
        self._values = values
        self._token: Token[BusContext | None] | None = None

    def __enter__(self) -> BusContext:
        current = _current.get()
        if current is None or current is _EMPTY:  # a consumer's handler: nothing to keep
            context = BusContext(**self._values)
        else:
            context = replace(current, **self._values)
        self._token = _current.set(context)
        return context

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

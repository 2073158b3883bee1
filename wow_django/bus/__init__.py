"""The integration-event bus (DESIGN part H; seeds 002 and 004).

Python API::

    from wow_django.bus import consumer, get_bus, send

    send("order.purchased", {"orderId": "o-1"})              # store PENDING, publish, SENT
    get_bus().repush(event_id, requested_by="alice")          # FAILED/PARTIAL/RETRYING or SENT too long
    get_bus().trace(trace_id)                                 # time line and parent → child tree

    @consumer("member-service", topics=["order.purchased"])
    def add_points(event, ctx): ...

The records live in the bus store that ``WOW['BUS_STORE']`` names (``None``:
``WOW['STORAGE']``): MongoDB (:mod:`wow_django.backends.mongo.bus_store`) or this
process's memory (:mod:`wow_django.backends.memory.bus_store`); both keep the contracts
of :mod:`wow_django.persistence.bus`.

This package's ``__init__`` is the bus's public facade: :func:`get_bus` and
:func:`send` use the process's bus, which the runtime
(:mod:`wow_django.application.runtime`) owns and installs through
:mod:`wow_django.bus.provider` when it is loaded (the apps' ``ready()`` load it).
Nothing in this package imports the application layer.

HTTP: include ``wow_django.http.bus_urls`` (e.g. at ``bus/``). Add
``"wow_django.bus"`` to ``INSTALLED_APPS`` for its permissions, its schema in
``wow_init_schema``, and the discovery of ``consumers``/``integration`` modules.
Importing this package talks to no server.
"""

from wow_django.bus.consumer import (
    ConsumerContext,
    ConsumerRegistry,
    ConsumerWorker,
    WorkerStats,
    consumer,
    run_in_thread,
)
from wow_django.bus.context import BusContext, bus_context, current_context
from wow_django.bus.envelope import Envelope, EventStatus, Initiator
from wow_django.bus.ordering import SequenceTracker, is_stale
from wow_django.bus.provider import current_bus
from wow_django.bus.service import EventBus, RelayReport, RepushResult, SendResult
from wow_django.exceptions import (
    BusError,
    ConsumerNotExpected,
    EnvelopeValidationError,
    EventNotFound,
    RepushRefused,
    TraceNotFound,
    TransportUnavailable,
)


def get_bus() -> EventBus:
    """The process's bus (``get_runtime().bus``), built from the ``WOW`` settings on first use."""
    return current_bus()


def send(topic: str, payload, **fields) -> SendResult:
    """Send an integration event through the process's bus (see :meth:`EventBus.send`)."""
    return get_bus().send(topic, payload, **fields)


__all__ = [
    "BusContext", "BusError", "ConsumerContext", "ConsumerRegistry", "ConsumerNotExpected", "ConsumerWorker",
    "EnvelopeValidationError", "Envelope", "EventBus", "EventNotFound", "EventStatus", "Initiator",
    "RelayReport", "RepushRefused", "RepushResult", "SendResult", "SequenceTracker", "TraceNotFound",
    "TransportUnavailable", "WorkerStats", "bus_context", "consumer", "current_context", "get_bus",
    "is_stale", "run_in_thread", "send",
]

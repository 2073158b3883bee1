"""Aggregates: command handlers over a state rebuilt from events.

::

    class OrderState(State):
        status: str = "NEW"
        amount: Decimal = Decimal(0)

        @sourcing(OrderPlaced)
        def _placed(self, event: OrderPlaced) -> None:
            self.status = "PLACED"
            self.amount = event.amount

    class Order(Aggregate, name="order", state=OrderState):
        @creates(PlaceOrder)
        def place(self, command: PlaceOrder) -> OrderPlaced:
            return OrderPlaced(amount=command.amount)

        @handles(PayOrder)
        def pay(self, command: PayOrder, ctx: CommandContext) -> OrderPaid:
            if self.state.status == "CANCELLED":
                raise DomainError("ORDER_CANCELLED", "A cancelled order cannot be paid.")
            return OrderPaid(amount=command.amount)

A handler returns one event or a list of events, or raises ``DomainError``.
It may take a second argument, the :class:`CommandContext`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from wow_django.domain import registry
from wow_django.domain.messages import (
    BUILTIN_COMMANDS,
    AggregateDeleted,
    AggregateRecovered,
    Command,
    Event,
    _origin,
)
from wow_django.exceptions import DeclarationError

_HANDLES = "_wow_handles"
_SOURCING = "_wow_sourcing"

#: A decorated method, returned as it is (marked) by the decorators.
_Method = TypeVar("_Method", bound=Callable[..., Any])


class State(BaseModel):
    """Base class of aggregate states: a mutable pydantic model.

    Methods decorated with :func:`sourcing` apply events; events without a
    handler leave the state unchanged.
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=False, arbitrary_types_allowed=False)
    sourcing_handlers: ClassVar[dict[str, str]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        handlers: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                for event_cls in getattr(value, _SOURCING, ()):
                    handlers[event_cls.event_name] = attr
        cls.sourcing_handlers = handlers

    def apply(self, event: Event) -> None:
        attr = self.sourcing_handlers.get(event.event_name)
        if attr is not None:
            getattr(self, attr)(event)


def sourcing(*events: type[Event]) -> Callable[[_Method], _Method]:
    """Mark a state method as the handler that applies ``events``."""
    for event in events:
        if not (isinstance(event, type) and issubclass(event, Event)):
            raise DeclarationError(f"@sourcing takes Event classes, got {event!r}")

    def decorate(fn: _Method) -> _Method:
        setattr(fn, _SOURCING, tuple(getattr(fn, _SOURCING, ())) + events)
        return fn

    return decorate


def _handler_decorator(command: type[Command], create: bool) -> Callable[[_Method], _Method]:
    if not (isinstance(command, type) and issubclass(command, Command)):
        raise DeclarationError(f"expected a Command class, got {command!r}")

    def decorate(fn: _Method) -> _Method:
        setattr(fn, _HANDLES, (command, create))
        return fn

    return decorate


def creates(command: type[Command]) -> Callable[[_Method], _Method]:
    """Mark the method that handles ``command`` by creating a new aggregate."""
    return _handler_decorator(command, True)


def handles(command: type[Command]) -> Callable[[_Method], _Method]:
    """Mark the method that handles ``command`` on an existing aggregate."""
    return _handler_decorator(command, False)


@dataclass(frozen=True)
class CommandHandler:
    command: type[Command]
    method: str
    create: bool
    takes_context: bool


@dataclass
class CommandContext:
    """What a handler may know about the command besides its body, and may ask for.

    ``prepare`` reserves a unique key (see PrepareKey) and releases it again if
    the command fails after the handler returned (conflict, store error).
    """

    command_id: str
    request_id: str
    aggregate_id: str
    tenant_id: str
    owner_id: str
    operator: str
    header: dict = field(default_factory=dict)
    #: ``prepare_keys(name)`` → the PrepareKey store of that name; the gateway provides it.
    prepare_keys: Callable[[str], Any] | None = field(default=None, repr=False)
    _compensations: list[Callable[[], Any]] = field(default_factory=list)

    def on_failure(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` if this command attempt ends without its events stored."""
        self._compensations.append(fn)

    def prepare(self, name: str, key: str, value: Any, ttl: timedelta | datetime | None = None) -> bool:
        """Reserve ``key`` for ``value``; ``False`` when another value holds it.

        A key this same value already holds (an earlier attempt of this
        command) counts as reserved; only a reservation made here is released
        on failure.
        """
        if self.prepare_keys is None:
            raise RuntimeError("this CommandContext has no prepare-key stores (it was not made by a gateway)")
        keys = self.prepare_keys(name)
        if keys.prepare(key, value, ttl):
            self.on_failure(lambda: keys.rollback(key, value))
            return True
        held = keys.get(key)
        return held is not None and held.value == value

    def compensate(self) -> None:
        while self._compensations:
            self._compensations.pop()()

    def take_compensations(self) -> list[Callable[[], Any]]:
        """Hand over the pending compensations (the caller runs them later, or never)."""
        taken, self._compensations = self._compensations, []
        return taken


class Aggregate:
    """Base class of aggregates. Subclass with ``name=`` and ``state=`` keywords."""

    aggregate_name: ClassVar[str] = ""
    state_class: ClassVar[type[State]]
    handlers: ClassVar[dict[str, CommandHandler]] = {}
    allow_delete: ClassVar[bool] = True
    # The HTTP API's policy for this aggregate (DRF classes or dotted paths); None: the settings' (wow_django.http).
    api_authentication_classes: ClassVar[list | None] = None
    api_permission_classes: ClassVar[list | None] = None

    def __init_subclass__(cls, name: str | None = None, state: type[State] | None = None,
                          abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        if name is None or state is None:
            raise DeclarationError(
                f"{_origin(cls)} must be declared as class {cls.__name__}(Aggregate, name='...', state=...)"
            )
        if not (isinstance(state, type) and issubclass(state, State)):
            raise DeclarationError(f"state of {_origin(cls)} must be a State subclass, got {state!r}")
        registry.check_name(name, "aggregate name")
        cls.aggregate_name = name
        cls.state_class = state
        handlers: dict[str, CommandHandler] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                marker = getattr(value, _HANDLES, None)
                if marker is None:
                    continue
                command, create = marker
                if command in BUILTIN_COMMANDS:
                    raise DeclarationError(f"{command.command_name!r} is built in; {_origin(cls)} cannot handle it")
                params = [p for p in inspect.signature(value).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                if len(params) not in (2, 3):
                    raise DeclarationError(
                        f"{_origin(cls)}.{attr} must take (self, command) or (self, command, ctx)"
                    )
                handlers[command.command_name] = CommandHandler(command, attr, create, len(params) == 3)
        if not any(h.create for h in handlers.values()):
            raise DeclarationError(f"{_origin(cls)} has no @creates handler: nothing can create it")
        cls.handlers = handlers
        registry.current().add_aggregate(cls)

    def __init__(self, id: str, tenant_id: str, owner_id: str = ""):
        self.id = id
        self.tenant_id = tenant_id
        self.owner_id = owner_id
        self.version = 0
        self.deleted = False
        self.state = self.state_class()
        self.event_id = ""
        self.first_operator = ""
        self.operator = ""
        self.first_event_time = 0
        self.event_time = 0
        # The snapshot this instance was loaded from (0 when replayed from events).
        self.snapshot_version = 0
        self.snapshot_time = 0

    @property
    def initialized(self) -> bool:
        return self.version > 0

    def apply(self, event: Event) -> None:
        if isinstance(event, AggregateDeleted):
            self.deleted = True
        elif isinstance(event, AggregateRecovered):
            self.deleted = False
        else:
            self.state.apply(event)


def aggregate_type(name: str) -> type[Aggregate] | None:
    """The aggregate class declared under ``name`` (current registry), or None."""
    found: type[Aggregate] | None = registry.current().aggregate_type(name)
    return found


def aggregate_for_command(command_name: str) -> type[Aggregate] | None:
    """The aggregate class that handles ``command_name``, or None."""
    found: type[Aggregate] | None = registry.current().aggregate_for_command(command_name)
    return found


def aggregates() -> dict[str, type[Aggregate]]:
    """``{name: class}`` of the declared aggregates."""
    return registry.current().aggregates()

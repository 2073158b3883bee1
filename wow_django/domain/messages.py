"""Typed commands and events (pydantic models) with stable names and revisions.

Declare them with class keywords::

    class PlaceOrder(Command, name="place_order"):
        customer_id: str
        amount: Decimal

    class OrderPlaced(Event, name="order_placed", revision=2):
        customer_id: str
        amount: Decimal

    @upcaster(OrderPlaced, from_revision=1)
    def _total_to_amount(body: dict) -> dict:
        body = dict(body)
        body["amount"] = body.pop("total")
        return body

Names are what is stored and what URLs use; renaming a class does not change
them. Two classes with one name is an error naming both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from wow_django.domain import registry
from wow_django.domain.registry import origin as _origin
from wow_django.exceptions import CommandValidationError, DeclarationError


def _default_name(cls: type) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


class JSONDecimal(Decimal):
    """A JSON number with a fraction or an exponent, as a command body's parser reads it.

    A ``Decimal`` field of the command takes it exactly as written; anywhere the
    model leaves untyped (``Any``, ``dict``, ``list``) it becomes a ``float``
    again once the command is validated, as the JSON number it was.
    """


def _untyped_numbers_as_floats(value: Any) -> Any:
    """``value`` with every :class:`JSONDecimal` the model left untyped turned into a float (in place)."""
    if isinstance(value, JSONDecimal):
        return float(value)
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            item = getattr(value, name, None)
            converted = _untyped_numbers_as_floats(item)
            if converted is not item:
                object.__setattr__(value, name, converted)  # frozen models too: it is the validated value
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _untyped_numbers_as_floats(item)
        return value
    if isinstance(value, list):
        value[:] = [_untyped_numbers_as_floats(item) for item in value]
        return value
    if isinstance(value, tuple):
        return tuple(_untyped_numbers_as_floats(item) for item in value)
    return value


class Command(BaseModel):
    """Base class of commands. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command_name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str | None = None, abstract: bool = False, **kwargs: Any) -> None:
        # The keywords are read in __pydantic_init_subclass__, once fields exist.
        super().__init_subclass__(**kwargs)

    @classmethod
    def __pydantic_init_subclass__(cls, name: str | None = None, abstract: bool = False, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if abstract:
            return
        cls.command_name = name or _default_name(cls)
        registry.current().add_command(cls, cls.command_name)

    @classmethod
    def from_json(cls, data: Any) -> Command:
        """Validate ``data`` into this command or raise ``CommandValidationError``."""
        if not isinstance(data, dict):
            raise CommandValidationError(
                f"The body of command {cls.command_name!r} must be a JSON object.",
                [{"name": "", "msg": f"expected an object, got {type(data).__name__}"}],
            )
        try:
            command = cls.model_validate(data)
        except ValidationError as exc:
            raise CommandValidationError.from_pydantic(cls.command_name, exc) from None
        # A model comes back as itself (its fields converted in place).
        return cast(Command, _untyped_numbers_as_floats(command))


class Event(BaseModel):
    """Base class of domain events. ``revision`` counts schema changes (1, 2, ...)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    event_name: ClassVar[str] = ""
    revision: ClassVar[int] = 1
    upcasters: ClassVar[dict[int, Callable[[dict], dict]]] = {}

    def __init_subclass__(cls, name: str | None = None, revision: int = 1, abstract: bool = False,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)

    @classmethod
    def __pydantic_init_subclass__(
        cls, name: str | None = None, revision: int = 1, abstract: bool = False, **kwargs: Any
    ) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if abstract:
            return
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
            raise DeclarationError(f"revision of {_origin(cls)} must be an integer ≥ 1, got {revision!r}")
        cls.event_name = name or _default_name(cls)
        cls.revision = revision
        cls.upcasters = {}
        registry.current().add_event(cls, cls.event_name)

    @classmethod
    def body_type(cls) -> str:
        return _origin(cls)

    @classmethod
    def from_stored(cls, revision: str | int, body: dict) -> Event:
        """Upcast a stored body from ``revision`` to the current one, then validate it."""
        try:
            stored = int(revision or 1)
        except (TypeError, ValueError):
            raise ValueError(f"event {cls.event_name!r} has a non-integer revision {revision!r}") from None
        if stored > cls.revision:
            raise ValueError(
                f"event {cls.event_name!r} was stored at revision {stored}, newer than this code's "
                f"{cls.revision}; deploy the newer code"
            )
        for current in range(stored, cls.revision):
            step = cls.upcasters.get(current)
            if step is None:
                raise ValueError(
                    f"event {cls.event_name!r}: no upcaster from revision {current} to {current + 1}; "
                    f"declare one with @upcaster({cls.__name__}, from_revision={current})"
                )
            body = step(body)
        return cls.model_validate(body)


def upcaster(event: type[Event], *, from_revision: int) -> Callable[[Callable[[dict], dict]], Callable[[dict], dict]]:
    """Register ``fn(body) -> body`` turning ``from_revision`` bodies into the next revision."""

    def decorate(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        if not 1 <= from_revision < event.revision:
            raise DeclarationError(
                f"upcaster {fn.__qualname__}: from_revision must be between 1 and {event.revision - 1} "
                f"for {event.__name__} (revision {event.revision})"
            )
        event.upcasters[from_revision] = fn
        return fn

    return decorate


def command_type(name: str) -> type[Command] | None:
    """The command class declared under ``name`` (current registry), or None."""
    return registry.current().command_type(name)


def event_type(name: str) -> type[Event] | None:
    """The event class declared under ``name`` (current registry), or None."""
    return registry.current().event_type(name)


# --- built-in commands and events: soft delete and recover ------------------------


class DeleteAggregate(Command, name="delete_aggregate"):
    """Soft-delete an aggregate: it stays in the store, commands to it are refused."""


class RecoverAggregate(Command, name="recover_aggregate"):
    """Undo a soft delete."""


class AggregateDeleted(Event, name="aggregate_deleted"):
    pass


class AggregateRecovered(Event, name="aggregate_recovered"):
    pass


BUILTIN_COMMANDS = (DeleteAggregate, RecoverAggregate)

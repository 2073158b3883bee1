"""What the process declared: commands, events, aggregates, prepare keys, projections and processors.

Declarations (``class PlaceOrder(Command, ...)``, ``class Order(Aggregate, ...)``,
``@projection``) go to the *current* :class:`Registry`. There is one per
process, filled as installed apps are imported; a test isolates its own
declarations with :func:`wow_django.testing.isolated_registry`, which swaps in
a copy and restores the original afterwards (nothing to unregister).

Pure Python: no Django, no storage.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from wow_django.exceptions import DeclarationError

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_MESSAGE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def origin(cls: Any) -> str:
    """``module.QualifiedName`` of a class or function: how errors name a declaration."""
    return f"{cls.__module__}.{cls.__qualname__}"


def check_name(name: str, what: str) -> str:
    """``name`` if it can name an aggregate or prepare key (a collection name part); else DeclarationError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise DeclarationError(
            f"{what} {name!r} must start with a letter and hold only letters, digits, '_' or '-' (≤ 63)"
        )
    return name


@dataclass(frozen=True)
class EventHandler:
    """A projection or event processor: ``fn(message)`` for some events of one aggregate type."""

    aggregate_name: str
    event_names: frozenset[str] | None  # None: every event
    fn: Callable[[Any], object]
    kind: str  # "projection" or "processor"
    #: The follower that runs it (DESIGN G): its checkpoint, lease and status go by this name.
    name: str = ""

    def matches(self, message: Any) -> bool:
        """Whether ``message`` (a DomainEventMessage) is one this handler takes."""
        return message.aggregate_id.aggregate_name == self.aggregate_name and (
            self.event_names is None or message.name in self.event_names
        )

    @property
    def label(self) -> str:
        return f"{self.kind} {origin(self.fn)}"


class Registry:
    """The declarations of one process (or of one isolated test). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._commands: dict[str, type] = {}
        self._events: dict[str, type] = {}
        # Aggregate classes (typed Any as add_aggregate's argument: the aggregate module imports this one).
        self._aggregates: dict[str, Any] = {}
        self._command_owner: dict[str, Any] = {}
        self._prepare_keys: set[str] = set()
        self._handlers: list[EventHandler] = []

    def copy(self) -> Registry:
        """A new registry holding what this one holds now; later declarations go to one of them only."""
        other = Registry()
        with self._lock:
            other._commands = dict(self._commands)
            other._events = dict(self._events)
            other._aggregates = dict(self._aggregates)
            other._command_owner = dict(self._command_owner)
            other._prepare_keys = set(self._prepare_keys)
            other._handlers = list(self._handlers)
        return other

    # --- commands and events ------------------------------------------------------------

    def _add_message(self, table: dict, kind: str, cls: type, name: str) -> None:
        if not isinstance(name, str) or not _MESSAGE_NAME.match(name):
            raise DeclarationError(
                f"{kind} name {name!r} of {origin(cls)} must be lower_snake_case letters, digits and '_' (≤ 63)"
            )
        with self._lock:
            previous = table.get(name)
            if previous is not None and origin(previous) != origin(cls):
                raise DeclarationError(
                    f"Two {kind}s are named {name!r}: {origin(previous)} and {origin(cls)}. "
                    f"Give one of them another name (class {cls.__name__}(..., name='...'))."
                )
            table[name] = cls

    def add_command(self, cls: type, name: str) -> None:
        self._add_message(self._commands, "command", cls, name)

    def add_event(self, cls: type, name: str) -> None:
        self._add_message(self._events, "event", cls, name)

    def command_type(self, name: str) -> type | None:
        return self._commands.get(name)

    def event_type(self, name: str) -> type | None:
        return self._events.get(name)

    # --- aggregates ----------------------------------------------------------------------

    def add_aggregate(self, cls: Any) -> None:
        """Declare an aggregate type and its commands; a name or command taken by another class is an error."""
        name = check_name(cls.aggregate_name, "aggregate name")
        with self._lock:
            previous = self._aggregates.get(name)
            if previous is not None and origin(previous) != origin(cls):
                raise DeclarationError(
                    f"Two aggregates are named {name!r}: {origin(previous)} and {origin(cls)}. Rename one."
                )
            for command_name in cls.handlers:
                owner = self._command_owner.get(command_name)
                if owner is not None and owner.aggregate_name != name:
                    raise DeclarationError(
                        f"Command {command_name!r} is handled by two aggregates: {origin(owner)} and {origin(cls)}."
                    )
            self._aggregates[name] = cls
            for command_name in cls.handlers:
                self._command_owner[command_name] = cls

    def aggregate_type(self, name: str) -> Any:
        return self._aggregates.get(name)

    def aggregate_for_command(self, command_name: str) -> Any:
        return self._command_owner.get(command_name)

    def aggregates(self) -> dict[str, Any]:
        """``{aggregate name: class}`` of every declared aggregate."""
        with self._lock:
            return dict(self._aggregates)

    def aggregate_names(self) -> list[str]:
        with self._lock:
            return sorted(self._aggregates)

    # --- prepare keys ----------------------------------------------------------------------

    def add_prepare_key(self, name: str) -> str:
        check_name(name, "prepare key name")
        with self._lock:
            self._prepare_keys.add(name)
        return name

    def prepare_key_names(self) -> list[str]:
        with self._lock:
            return sorted(self._prepare_keys)

    # --- projections and event processors -----------------------------------------------------

    def add_handler(self, handler: EventHandler) -> None:
        """Add a projection or processor; its follower name must be its own (``DeclarationError``)."""
        with self._lock:
            for other in self._handlers:
                if other.name == handler.name and other.fn is not handler.fn:
                    raise DeclarationError(
                        f"{handler.label} and {other.label} would both run as follower {handler.name!r}: "
                        "give one another name (name=...)")
            if any(other.name == handler.name for other in self._handlers):
                return  # the same function declared again (a module imported twice)
            self._handlers.append(handler)

    def discard_handler(self, name: str) -> bool:
        """Forget the projection or processor running as follower ``name`` (tests that cannot run it); True
        when there was one."""
        with self._lock:
            kept = [h for h in self._handlers if h.name != name]
            found = len(kept) != len(self._handlers)
            self._handlers = kept
            return found

    def handlers(self) -> list[EventHandler]:
        """Every projection and processor, in declaration order."""
        with self._lock:
            return list(self._handlers)

    def handlers_for(self, aggregate_name: str) -> list[EventHandler]:
        """The aggregate's projections and processors, in declaration order."""
        with self._lock:
            return [h for h in self._handlers if h.aggregate_name == aggregate_name]

    def has_handlers(self, aggregate_name: str) -> bool:
        return any(h.aggregate_name == aggregate_name for h in self._handlers)


class Current(Generic[T]):
    """A process-wide current value that a block can replace for its duration (tests isolate with it)."""

    def __init__(self, value: T) -> None:
        self._value = value
        self._lock = threading.Lock()

    def get(self) -> T:
        return self._value

    @contextmanager
    def use(self, value: T) -> Iterator[T]:
        """Make ``value`` current inside the block; the previous value comes back after it."""
        with self._lock:
            previous, self._value = self._value, value
        try:
            yield value
        finally:
            with self._lock:
                self._value = previous


_current: Current[Registry] = Current(Registry())


def current() -> Registry:
    """The registry declarations go to and the runtime reads."""
    return _current.get()


def use_registry(registry: Registry) -> AbstractContextManager[Registry]:
    """Make ``registry`` the current one inside a ``with`` block; the previous one comes back after it."""
    return _current.use(registry)


# Shortcuts to the current registry.
def aggregate_type(name: str) -> Any:
    return current().aggregate_type(name)


def aggregate_for_command(command_name: str) -> Any:
    return current().aggregate_for_command(command_name)


def aggregates() -> dict[str, Any]:
    return current().aggregates()


def command_type(name: str) -> Any:
    return current().command_type(name)


def event_type(name: str) -> Any:
    return current().event_type(name)


def declare_prepare_key(name: str) -> str:
    """Declare a PrepareKey name so ``wow_init_schema`` creates its collection; returns the name."""
    return current().add_prepare_key(name)

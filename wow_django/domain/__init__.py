"""The modeling API: commands, events, states and aggregates. No Django views, no pymongo."""

from wow_django.domain.aggregate import (
    Aggregate,
    CommandContext,
    State,
    aggregate_for_command,
    aggregate_type,
    aggregates,
    creates,
    handles,
    sourcing,
)
from wow_django.domain.ids import generate_id
from wow_django.domain.messages import (
    AggregateDeleted,
    AggregateRecovered,
    Command,
    DeleteAggregate,
    Event,
    RecoverAggregate,
    command_type,
    event_type,
    upcaster,
)
from wow_django.exceptions import DomainError
from wow_django.registry import register_prepare_key


def declare_prepare_key(name: str) -> str:
    """Declare a PrepareKey name so ``wow_init_schema`` creates its collection; returns the name."""
    register_prepare_key(name)
    return name


__all__ = [
    "Aggregate", "AggregateDeleted", "AggregateRecovered", "Command", "CommandContext", "DeleteAggregate",
    "DomainError", "Event", "RecoverAggregate", "State", "aggregate_for_command", "aggregate_type", "aggregates",
    "command_type", "creates", "declare_prepare_key", "event_type", "generate_id", "handles", "sourcing", "upcaster",
]

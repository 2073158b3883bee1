"""The modeling API: commands, events, states, aggregates, projections. Pure Python and pydantic.

::

    from wow_django.domain import Aggregate, Command, Event, State, creates, handles, sourcing, projection
"""

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
from wow_django.domain.projections import event_processor, projection
from wow_django.domain.registry import Registry, declare_prepare_key
from wow_django.exceptions import DeclarationError, DomainError

__all__ = [
    "Aggregate", "AggregateDeleted", "AggregateRecovered", "Command", "CommandContext", "DeclarationError",
    "DeleteAggregate", "DomainError", "Event", "RecoverAggregate", "Registry", "State", "aggregate_for_command",
    "aggregate_type", "aggregates", "command_type", "creates", "declare_prepare_key", "event_processor",
    "event_type", "generate_id", "handles", "projection", "sourcing", "upcaster",
]

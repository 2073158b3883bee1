"""Storage records: frozen dataclasses with no Django or pymongo dependency."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DEFAULT_TENANT_ID = "(0)"
MAX_VERSION = 2**31 - 1


def now_ms() -> int:
    """The current time as epoch milliseconds (the unit of every stored time)."""
    return time.time_ns() // 1_000_000


def _require_text(value: Any, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def _require_version(value: Any, name: str = "version") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        raise ValueError(f"{name} must be an integer between 1 and {MAX_VERSION}, got {value!r}")


@dataclass(frozen=True, slots=True)
class AggregateId:
    """Identity of one aggregate instance."""

    aggregate_name: str
    id: str
    context_name: str = "default"
    tenant_id: str = DEFAULT_TENANT_ID

    def __post_init__(self) -> None:
        _require_text(self.aggregate_name, "aggregate_name")
        _require_text(self.id, "aggregate id")
        _require_text(self.context_name, "context_name")
        _require_text(self.tenant_id, "tenant_id")


@dataclass(frozen=True, slots=True)
class DomainEventRecord:
    """One domain event inside a stream, in its serialized form."""

    id: str
    name: str
    revision: str
    body_type: str
    body: dict

    def __post_init__(self) -> None:
        _require_text(self.id, "event id")
        _require_text(self.name, "event name")
        if not isinstance(self.body, dict):
            raise ValueError(f"event body must be a dict, got {type(self.body).__name__}")


@dataclass(frozen=True, slots=True)
class EventStream:
    """The events one command produced for one aggregate at one version."""

    id: str
    aggregate_id: AggregateId
    version: int
    body: tuple[DomainEventRecord, ...]
    request_id: str
    command_id: str
    owner_id: str = ""
    header: dict = field(default_factory=dict)
    create_time: int = field(default_factory=now_ms)

    def __post_init__(self) -> None:
        _require_text(self.id, "event stream id")
        if not isinstance(self.aggregate_id, AggregateId):
            raise ValueError("aggregate_id must be an AggregateId")
        _require_version(self.version)
        _require_text(self.request_id, "request_id")
        _require_text(self.command_id, "command_id")
        if not isinstance(self.owner_id, str):
            raise ValueError("owner_id must be a string")
        if not isinstance(self.body, tuple):
            object.__setattr__(self, "body", tuple(self.body))
        if not self.body:
            raise ValueError("an event stream must hold at least one event")
        if not isinstance(self.create_time, int) or self.create_time < 0:
            raise ValueError(f"create_time must be epoch milliseconds, got {self.create_time!r}")

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def aggregate_name(self) -> str:
        return self.aggregate_id.aggregate_name


# --- records read back from a store ---------------------------------------------------------------
#
# What a store reads was checked when it was appended (the constructors above) and is held by the
# database's constraints since, so reads build their records without checking every field again: on a
# load of a few small streams the checks and the frozen dataclasses' ``__init__`` (one
# ``object.__setattr__`` per field) cost more than the database's answer. The slots' descriptors set the
# fields directly; the records are the same classes, equal to and hashed as ones built the usual way.

_new = object.__new__
_set_event = tuple(DomainEventRecord.__dict__[name].__set__ for name in ("id", "name", "revision", "body_type", "body"))
_set_stream = tuple(EventStream.__dict__[name].__set__ for name in (
    "id", "aggregate_id", "version", "body", "request_id", "command_id", "owner_id", "header", "create_time"))


def stored_events(documents: list[dict]) -> tuple[DomainEventRecord, ...]:
    """The events of a stored stream from their documents (``id``, ``name``, ``revision``, ``bodyType``, ``body``).

    Raises ``KeyError`` on a document without an id or a name key (a stored value is taken as it is, not
    checked again); an absent revision, body type or body reads as empty.
    """
    set_id, set_name, set_revision, set_body_type, set_body = _set_event
    events = []
    for document in documents:
        event = _new(DomainEventRecord)
        set_id(event, document["id"])
        set_name(event, document["name"])
        set_revision(event, document.get("revision") or "")
        set_body_type(event, document.get("bodyType") or "")
        set_body(event, document.get("body") or {})
        events.append(event)
    if not events:
        raise ValueError("a stored event stream holds no event")
    return tuple(events)


def stored_stream(stream_id: str, aggregate_id: AggregateId, version: int, events: tuple[DomainEventRecord, ...],
                  request_id: str, command_id: str, owner_id: str | None, header: dict | None,
                  create_time: int) -> EventStream:
    """An :class:`EventStream` read back from a store (see the note above): fields as stored, none checked again."""
    stream = _new(EventStream)
    set_id, set_aggregate_id, set_version, set_body, set_request_id, set_command_id, set_owner_id, set_header, \
        set_create_time = _set_stream
    set_id(stream, stream_id)
    set_aggregate_id(stream, aggregate_id)
    set_version(stream, version)
    set_body(stream, events)
    set_request_id(stream, request_id)
    set_command_id(stream, command_id)
    set_owner_id(stream, owner_id or "")
    set_header(stream, header or {})
    set_create_time(stream, create_time)
    return stream


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state of one aggregate at one version, as stored."""

    aggregate_id: AggregateId
    version: int
    state: dict
    event_id: str = ""
    owner_id: str = ""
    first_operator: str = ""
    operator: str = ""
    first_event_time: int = 0
    event_time: int = 0
    snapshot_time: int = field(default_factory=now_ms)
    deleted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.aggregate_id, AggregateId):
            raise ValueError("aggregate_id must be an AggregateId")
        _require_version(self.version)
        if not isinstance(self.state, dict):
            raise ValueError(f"snapshot state must be a dict, got {type(self.state).__name__}")


@dataclass(frozen=True, slots=True)
class PreparedValue:
    """A reserved value and the moment its reservation ends (UTC)."""

    value: Any
    ttl_at: datetime

    def expired(self, at: datetime | None = None) -> bool:
        return self.ttl_at <= (at or datetime.now(UTC))


FOREVER = datetime(9999, 12, 31, tzinfo=UTC)

"""Loading aggregates (snapshot plus later events) and encoding their events."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from wow_django.domain.aggregate import Aggregate
from wow_django.domain.ids import generate_id
from wow_django.domain.messages import Event, event_type
from wow_django.domain.values import stored
from wow_django.persistence.contracts import EventStore, SnapshotStore
from wow_django.persistence.records import AggregateId, DomainEventRecord, EventStream, Snapshot, now_ms

#: The event-stream header key of the command's operator, as Wow names it.
OPERATOR_HEADER = "command_operator"

logger = logging.getLogger("wow_django.application.repository")


@dataclass(frozen=True)
class DomainEventMessage:
    """One typed event as projections and processors receive it."""

    aggregate_id: AggregateId
    version: int
    sequence: int
    event: Event
    event_id: str
    name: str
    revision: int
    create_time: int
    owner_id: str
    request_id: str
    command_id: str
    header: dict
    is_last: bool


def encode_events(events: Sequence[Event]) -> tuple[DomainEventRecord, ...]:
    return tuple(
        DomainEventRecord(
            id=generate_id(),
            name=e.event_name,
            revision=str(e.revision),
            body_type=e.body_type(),
            body=stored(e),
        )
        for e in events
    )


def decode_event(record: DomainEventRecord) -> Event:
    cls = event_type(record.name)
    if cls is None:
        raise ValueError(f"stored event {record.name!r} has no Event class in this code (was it renamed?)")
    return cls.from_stored(record.revision, record.body)


def stream_messages(stream: EventStream) -> list[DomainEventMessage]:
    count = len(stream.body)
    return [
        DomainEventMessage(
            aggregate_id=stream.aggregate_id,
            version=stream.version,
            sequence=index + 1,
            event=decode_event(record),
            event_id=record.id,
            name=record.name,
            revision=int(record.revision or 1),
            create_time=stream.create_time,
            owner_id=stream.owner_id,
            request_id=stream.request_id,
            command_id=stream.command_id,
            header=stream.header,
            is_last=index + 1 == count,
        )
        for index, record in enumerate(stream.body)
    ]


def apply_stream(aggregate: Aggregate, stream: EventStream, events: Iterable[Event] | None = None) -> None:
    """Apply one stored stream to ``aggregate`` (decoding it unless ``events`` are given)."""
    if stream.version != aggregate.version + 1:
        raise ValueError(
            f"{aggregate.aggregate_name} {aggregate.id!r}: stream version {stream.version} does not follow "
            f"version {aggregate.version}"
        )
    for event in events if events is not None else (decode_event(r) for r in stream.body):
        aggregate.apply(event)
    # Wow's key; "operator" in streams an earlier wow_django wrote.
    operator = str(stream.header.get(OPERATOR_HEADER, stream.header.get("operator", "")))
    if aggregate.version == 0:
        aggregate.first_operator = operator
        aggregate.first_event_time = stream.create_time
        aggregate.tenant_id = stream.aggregate_id.tenant_id
        aggregate.owner_id = stream.owner_id
    aggregate.version = stream.version
    aggregate.operator = operator
    aggregate.event_time = stream.create_time
    aggregate.event_id = stream.body[-1].id


def snapshot_of(aggregate: Aggregate, context_name: str) -> Snapshot:
    return Snapshot(
        aggregate_id=AggregateId(aggregate.aggregate_name, aggregate.id, context_name, aggregate.tenant_id),
        version=aggregate.version,
        state=stored(aggregate.state),
        event_id=aggregate.event_id,
        owner_id=aggregate.owner_id,
        first_operator=aggregate.first_operator,
        operator=aggregate.operator,
        first_event_time=aggregate.first_event_time,
        event_time=aggregate.event_time,
        snapshot_time=now_ms(),
        deleted=aggregate.deleted,
    )


class AggregateRepository:
    def __init__(self, event_store: EventStore, snapshot_store: SnapshotStore | None, context_name: str):
        self.event_store = event_store
        self.snapshot_store = snapshot_store
        self.context_name = context_name

    def _from_snapshot(self, cls: type[Aggregate], snapshot: Snapshot) -> Aggregate | None:
        aggregate = cls(snapshot.aggregate_id.id, snapshot.aggregate_id.tenant_id, snapshot.owner_id)
        try:
            aggregate.state = cls.state_class.model_validate(snapshot.state)
        except ValidationError as exc:
            logger.warning("snapshot of %s %r no longer fits %s; replaying events instead: %s",
                           cls.aggregate_name, snapshot.aggregate_id.id, cls.state_class.__name__, exc)
            return None
        aggregate.version = aggregate.snapshot_version = snapshot.version
        aggregate.snapshot_time = snapshot.snapshot_time
        aggregate.deleted = snapshot.deleted
        aggregate.event_id = snapshot.event_id
        aggregate.first_operator = snapshot.first_operator
        aggregate.operator = snapshot.operator
        aggregate.first_event_time = snapshot.first_event_time
        aggregate.event_time = snapshot.event_time
        return aggregate

    def locate(self, cls: type[Aggregate], aggregate_id: str) -> AggregateId | None:
        """The full id (tenant included) an aggregate is stored under; ``None`` if it has no events.

        For code that serves every tenant (a snapshot task, the console, a script): request paths
        know the tenant and give it to ``load``.
        """
        return self.event_store.locate(cls.aggregate_name, aggregate_id)

    def load(self, cls: type[Aggregate], aggregate_id: str, *, tenant_id: str, use_snapshot: bool = True,
             tail_version: int | None = None) -> Aggregate | None:
        """The tenant's aggregate at its latest version (or ``tail_version``).

        ``None`` if it has no events, or is another tenant's: the stores filter on ``tenant_id``.
        Code that serves every tenant finds the tenant with ``locate`` first.
        """
        key = AggregateId(cls.aggregate_name, aggregate_id, self.context_name, tenant_id)
        aggregate = None
        streams = None
        if use_snapshot and self.snapshot_store is not None and tail_version is None:
            together = self.snapshot_store.load_with_tail(key, self.event_store)  # one round trip where it can
            snapshot, streams = together if together is not None else (self.snapshot_store.load(key), None)
            if snapshot is not None:
                aggregate = self._from_snapshot(cls, snapshot)
                if aggregate is None:  # a snapshot that no longer fits: every event, from the first
                    streams = None
        if aggregate is None:
            aggregate = cls(aggregate_id, key.tenant_id)
        if streams is None:  # not read with the snapshot
            if tail_version is None:
                streams = self.event_store.load(key, aggregate.version + 1)
            elif tail_version < 1:
                return None
            else:
                streams = self.event_store.load(key, 1, tail_version)
        for stream in streams:
            apply_stream(aggregate, stream)
        return aggregate if aggregate.version > 0 else None

    def load_at_time(self, cls: type[Aggregate], aggregate_id: str, *, tenant_id: str,
                     create_time: int) -> Aggregate | None:
        """The tenant's aggregate as it was at ``create_time`` (epoch ms): every stream created at or before it,
        replayed from the first; ``None`` when it had none yet."""
        key = AggregateId(cls.aggregate_name, aggregate_id, self.context_name, tenant_id)
        aggregate = cls(aggregate_id, key.tenant_id)
        for stream in self.event_store.load_by_time(key, 0, create_time):
            if stream.version != aggregate.version + 1:
                break  # a later version stamped earlier (clocks of two writers): the history stops before it
            apply_stream(aggregate, stream)
        return aggregate if aggregate.version > 0 else None

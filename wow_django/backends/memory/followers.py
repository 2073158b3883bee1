"""Followers on the in-memory backend: the event store read by position, and followers' state in a dict."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta

from wow_django.backends.memory.stores import InMemoryEventStore
from wow_django.exceptions import CheckpointFenced, LeaseLost, UnknownFollower
from wow_django.persistence.followers import (
    FollowerState,
    FollowerStore,
    Gap,
    PoisonEvent,
    PositionedStream,
    StreamFeed,
    check_position,
    check_read_args,
    poison_time,
)


class InMemoryStreamFeed(StreamFeed):
    """The streams of one context of an :class:`InMemoryEventStore`; positions are gapless (taken under its lock)."""

    gaps_are_final = True

    def __init__(self, store: InMemoryEventStore, context_name: str):
        self.store = store
        self.context_name = context_name
        self.notifier = store.append_notifier

    def read(self, after: int, limit: int) -> list[PositionedStream]:
        check_read_args(after, limit)
        return self.store.positioned(self.context_name, after, limit)

    def head(self) -> int:
        streams = self.store.positioned_all(self.context_name)
        return streams[-1].position if streams else 0

    def position_at(self, time: datetime) -> int:
        limit = time.timestamp() * 1000
        found = [s.position for s in self.store.positioned_all(self.context_name) if s.stream.create_time < limit]
        return max(found, default=0)

    def count_between(self, after: int, upto: int) -> int:
        return max(0, min(upto, self.head()) - max(after, 0))

    def position_of(self, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        return self.store.position_of(self.context_name, aggregate_name, aggregate_id, version)


class InMemoryFollowerStore(FollowerStore):
    """Followers' state in this process's memory, guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, FollowerState] = {}
        self._skipped: dict[str, list[dict]] = {}

    def get(self, name: str) -> FollowerState | None:
        with self._lock:
            return self._states.get(name)

    def all(self) -> list[FollowerState]:
        with self._lock:
            return [self._states[name] for name in sorted(self._states)]

    def _known(self, name: str) -> FollowerState:
        state = self._states.get(name)
        if state is None:
            raise UnknownFollower(name)
        return state

    def _held(self, name: str, owner: str, now: datetime) -> FollowerState:
        state = self._states.get(name)
        if state is None:
            raise LeaseLost(name, owner, None)
        if state.lease_owner != owner or state.lease_until is None or state.lease_until <= now:
            raise LeaseLost(name, owner, state.lease_owner)
        return state

    def acquire(self, name: str, owner: str, lease_s: float, *, now: datetime) -> bool:
        with self._lock:
            state = self._states.get(name)
            if state is None:
                state = FollowerState(name=name, position=0, updated_at=now)
            elif (state.lease_owner not in (None, owner) and state.lease_until is not None
                  and state.lease_until > now):
                return False
            self._states[name] = replace(state, lease_owner=owner, lease_until=now + timedelta(seconds=lease_s))
            return True

    def release(self, name: str, owner: str) -> None:
        with self._lock:
            state = self._states.get(name)
            if state is not None and state.lease_owner == owner:
                self._states[name] = replace(state, lease_owner=None, lease_until=None)

    @staticmethod
    def _fence(state: FollowerState, generation: int | None) -> None:
        if generation is not None and state.generation != generation:
            raise CheckpointFenced(state.name, generation, state.generation)

    def advance(self, name: str, owner: str, position: int, *, now: datetime, gaps: tuple[Gap, ...] = (),
                generation: int | None = None) -> None:
        check_position(position)
        with self._lock:
            state = self._held(name, owner, now)
            self._fence(state, generation)
            changes: dict = {}
            if position > state.position:
                changes.update(position=position, updated_at=now)
            if gaps:
                changes.update(gaps_skipped=state.gaps_skipped + sum(g.last - g.first + 1 for g in gaps),
                               last_gap=gaps[-1])
            if changes:
                self._states[name] = replace(state, **changes)

    def set_poison(self, name: str, owner: str, poison: PoisonEvent | None, *, now: datetime | None = None,
                   generation: int | None = None) -> None:
        now = poison_time(poison, now)
        with self._lock:
            state = self._held(name, owner, now)
            self._fence(state, generation)
            self._states[name] = replace(state, poison=poison)

    def set_paused(self, name: str, paused: bool) -> None:
        with self._lock:
            state = self._known(name)
            self._states[name] = replace(state, paused=paused, generation=state.generation + 1)

    def rewind(self, name: str, position: int, *, now: datetime) -> None:
        check_position(position)
        with self._lock:
            state = self._known(name)
            self._states[name] = replace(state, position=position, poison=None, updated_at=now,
                                         generation=state.generation + 1)

    def skip_poison(self, name: str, *, by: str, reason: str, now: datetime) -> PoisonEvent:
        with self._lock:
            state = self._known(name)
            poison = state.poison
            if poison is None:
                raise ValueError(f"follower {name!r} is not stopped on a poison event")
            self._states[name] = replace(state, position=max(state.position, poison.position), poison=None,
                                         updated_at=now, generation=state.generation + 1)
            self._skipped.setdefault(name, []).append({
                "position": poison.position, "streamId": poison.stream_id, "aggregate": poison.aggregate,
                "error": poison.error, "by": by, "reason": reason, "at": now,
            })
            return poison

    def skipped(self, name: str) -> list[dict]:
        with self._lock:
            return [dict(record) for record in self._skipped.get(name, [])]


__all__ = ["InMemoryFollowerStore", "InMemoryStreamFeed"]

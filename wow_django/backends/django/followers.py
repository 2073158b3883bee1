"""Followers on the Django ORM: ``wow_event_stream`` read by position, followers' state in ``wow_follower``.

Positions are commit-ordered per context (the event store serialises appends
to one context, see ``DjangoEventStore._locked``), so a feed's gaps are final.
They are the table's global ``position``: one context's positions are
increasing but not contiguous when several contexts share the table.

Every write of the follower store is one conditional statement (or a few in
one transaction), judged inside the database, so it is atomic across
processes: ``acquire`` is an upsert whose update only happens when the lease
is free, expired or the caller's; ``advance`` and ``set_poison`` update only
the caller's unexpired lease's row (no row changed: ``LeaseLost``). Times are
epoch microseconds against the caller's clock, never the server's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime

from django.db import transaction
from django.db.models import BigIntegerField, Case, F, Value, When

from wow_django.backends.django.connection import database, prepare_database, sqlite_writer
from wow_django.backends.django.errors import store_errors
from wow_django.backends.django.event_store import DjangoEventStore, decode_json_columns
from wow_django.backends.django.models import EventStreamRow, FollowerGapRow, FollowerRow, FollowerSkipRow
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
    from_micros,
    gap_from_json,
    gap_to_json,
    poison_from_json,
    poison_time,
    poison_to_json,
    to_micros,
)
from wow_django.persistence.records import AggregateId, stored_events, stored_stream

_COLUMNS = ("position", "stream_id", "aggregate_name", "aggregate_id", "tenant_id", "owner_id", "request_id",
            "command_id", "version", "header", "body", "create_time")


class DjangoStreamFeed(StreamFeed):
    """The streams of one context in ``wow_event_stream`` of the event store's database, by position."""

    gaps_are_final = True

    def __init__(self, store: DjangoEventStore, context_name: str):
        self.using = store.using
        self.context_name = context_name
        self.notifier = store.append_notifier
        connection = prepare_database(self.using)
        quote = connection.ops.quote_name
        self._table = quote(EventStreamRow._meta.db_table)
        self._names = {field.name: quote(field.column) for field in EventStreamRow._meta.concrete_fields}
        self._read_sql = (f"SELECT {', '.join(self._names[c] for c in _COLUMNS)} FROM {self._table} "
                          f"WHERE {self._names['context_name']} = %s AND {self._names['position']} > %s "
                          f"ORDER BY {self._names['position']} LIMIT %s")

    def _one(self, sql: str, params: tuple, action: str):
        connection = database(self.using)
        with store_errors(connection, action), connection.cursor() as cursor:
            cursor.execute(sql.format_map(self._names), (self.context_name, *params))
            return cursor.fetchone()[0]

    def read(self, after: int, limit: int) -> list[PositionedStream]:
        check_read_args(after, limit)
        connection = database(self.using)
        with store_errors(connection, f"reading the streams of {self.context_name!r} after {after}"):
            with connection.cursor() as cursor:
                cursor.execute(self._read_sql, (self.context_name, after, limit))
                found = cursor.fetchall()
        # decode_json_columns reads columns 7 and 8 of each row: header and body come after 7 others.
        decoded = decode_json_columns([row[2:] for row in found])
        items = []
        for index, (position, stream_id, name, aggregate_id, tenant_id, owner_id, request_id, command_id, version,
                    _, _, create_time) in enumerate(found):
            agg = AggregateId(aggregate_name=name, id=aggregate_id, context_name=self.context_name,
                              tenant_id=tenant_id)
            items.append(PositionedStream(position, stored_stream(
                stream_id, agg, version, stored_events(decoded[2 * index + 1]), request_id, command_id, owner_id,
                decoded[2 * index], create_time)))
        return items

    def head(self) -> int:
        sql = "SELECT MAX({position}) FROM " + self._table + " WHERE {context_name} = %s"
        return self._one(sql, (), f"reading the head of {self.context_name!r}") or 0

    def position_at(self, time: datetime) -> int:
        sql = "SELECT MAX({position}) FROM " + self._table + " WHERE {context_name} = %s AND {create_time} < %s"
        millis = to_micros(time) / 1000
        return self._one(sql, (millis,), f"reading the position of {self.context_name!r} at {time}") or 0

    def position_of(self, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        sql = ("SELECT {position} FROM " + self._table + " WHERE {context_name} = %s AND {aggregate_name} = %s "
               "AND {aggregate_id} = %s AND {version} = %s")
        connection = database(self.using)
        with store_errors(connection, f"reading the position of {aggregate_name} {aggregate_id!r} v{version}"):
            with connection.cursor() as cursor:
                cursor.execute(sql.format_map(self._names), (self.context_name, aggregate_name, aggregate_id, version))
                row = cursor.fetchone()
        return row[0] if row is not None else None

    def count_between(self, after: int, upto: int) -> int:
        sql = ("SELECT COUNT(*) FROM " + self._table
               + " WHERE {context_name} = %s AND {position} > %s AND {position} <= %s")
        return self._one(sql, (after, upto), f"counting the streams of {self.context_name!r}")


def _state(row: FollowerRow) -> FollowerState:
    gap = row.last_gap
    return FollowerState(
        name=row.name, position=row.position, updated_at=from_micros(row.updated_at), paused=row.paused,
        lease_owner=row.lease_owner,
        lease_until=from_micros(row.lease_until) if row.lease_until is not None else None,
        poison=poison_from_json(row.poison), gaps_skipped=row.gaps_skipped,
        last_gap=gap_from_json(gap),
        extra=row.extra or {}, generation=row.generation,
    )


class DjangoFollowerStore(FollowerStore):
    """Followers' state in ``wow_follower`` (with ``wow_follower_gap`` and ``wow_follower_skip``) of ``using``."""

    def __init__(self, using: str = "default"):
        connection = prepare_database(using)
        self.using = self.database_alias = using
        quote = connection.ops.quote_name
        table = quote(FollowerRow._meta.db_table)
        column = {field.name: quote(field.column) for field in FollowerRow._meta.concrete_fields}
        self._acquire_sql = (
            f"INSERT INTO {table} ({column['name']}, {column['position']}, {column['updated_at']}, "
            f"{column['paused']}, {column['lease_owner']}, {column['lease_until']}, {column['gaps_skipped']}, "
            f"{column['extra']}, {column['generation']}) VALUES (%s, 0, %s, %s, %s, %s, 0, %s, 0) "
            f"ON CONFLICT ({column['name']}) DO UPDATE SET {column['lease_owner']} = excluded.{column['lease_owner']}, "
            f"{column['lease_until']} = excluded.{column['lease_until']} "
            f"WHERE {table}.{column['lease_owner']} IS NULL OR {table}.{column['lease_owner']} = %s "
            f"OR {table}.{column['lease_until']} IS NULL OR {table}.{column['lease_until']} <= %s"
        )

    def _rows(self):
        return FollowerRow.objects.using(self.using)

    @contextlib.contextmanager
    def _write(self, action: str) -> Iterator[None]:
        """One write: errors mapped, and on SQLite outside a transaction the process's writer lock."""
        connection = database(self.using)
        with store_errors(connection, action), sqlite_writer(connection):
            yield

    def get(self, name: str) -> FollowerState | None:
        connection = database(self.using)
        with store_errors(connection, f"reading follower {name!r}"):
            row = self._rows().filter(name=name).first()
        return _state(row) if row is not None else None

    def all(self) -> list[FollowerState]:
        connection = database(self.using)
        with store_errors(connection, "reading the followers"):
            return [_state(row) for row in self._rows().order_by("name")]

    def acquire(self, name: str, owner: str, lease_s: float, *, now: datetime) -> bool:
        micros = to_micros(now)
        until = micros + round(lease_s * 1_000_000)
        connection = database(self.using)
        with self._write(f"acquiring the lease of follower {name!r}"), connection.cursor() as cursor:
            cursor.execute(self._acquire_sql, (name, micros, False, owner, until, "{}", owner, micros))
            return cursor.rowcount == 1

    def release(self, name: str, owner: str) -> None:
        with self._write(f"releasing the lease of follower {name!r}"):
            self._rows().filter(name=name, lease_owner=owner).update(lease_owner=None, lease_until=None)

    def _leased(self, name: str, owner: str, now: datetime, generation: int | None = None):
        rows = self._rows().filter(name=name, lease_owner=owner, lease_until__gt=to_micros(now))
        return rows if generation is None else rows.filter(generation=generation)

    def _refused(self, name: str, owner: str, now: datetime, generation: int | None) -> Exception:
        """Why a write under the lease changed no row: the generation moved, or the lease is not ``owner``'s."""
        row = self._rows().filter(name=name).values_list("lease_owner", "lease_until", "generation").first()
        if row is not None and generation is not None and row[2] != generation and row[0] == owner \
                and row[1] is not None and row[1] > to_micros(now):
            return CheckpointFenced(name, generation, row[2])
        return LeaseLost(name, owner, row[0] if row is not None else None)

    def advance(self, name: str, owner: str, position: int, *, now: datetime, gaps: tuple[Gap, ...] = (),
                generation: int | None = None) -> None:
        check_position(position)
        micros = to_micros(now)
        big: BigIntegerField[int, int] = BigIntegerField()
        changes: dict = {
            "position": Case(When(position__lt=position, then=Value(position, big)), default=F("position"),
                             output_field=big),
            "updated_at": Case(When(position__lt=position, then=Value(micros, big)), default=F("updated_at"),
                               output_field=big),
        }
        if gaps:
            changes["gaps_skipped"] = F("gaps_skipped") + Value(sum(g.last - g.first + 1 for g in gaps), big)
            changes["last_gap"] = gap_to_json(gaps[-1])
        with self._write(f"advancing follower {name!r} to {position}"):
            with transaction.atomic(using=self.using):
                if not self._leased(name, owner, now, generation).update(**changes):
                    raise self._refused(name, owner, now, generation)
                if gaps:
                    FollowerGapRow.objects.using(self.using).bulk_create([
                        FollowerGapRow(follower=name, first=g.first, last=g.last, seen_at=to_micros(g.seen_at),
                                       skipped_at=to_micros(g.skipped_at)) for g in gaps])

    def set_poison(self, name: str, owner: str, poison: PoisonEvent | None, *, now: datetime | None = None,
                   generation: int | None = None) -> None:
        now = poison_time(poison, now)
        with self._write(f"setting the poison event of follower {name!r}"):
            if not self._leased(name, owner, now, generation).update(
                    poison=poison_to_json(poison) if poison else None):
                raise self._refused(name, owner, now, generation)

    def set_paused(self, name: str, paused: bool) -> None:
        with self._write(f"pausing follower {name!r}"):
            if not self._rows().filter(name=name).update(paused=bool(paused), generation=F("generation") + 1):
                raise UnknownFollower(name)

    def rewind(self, name: str, position: int, *, now: datetime) -> None:
        check_position(position)
        with self._write(f"rewinding follower {name!r} to {position}"):
            if not self._rows().filter(name=name).update(position=position, poison=None, updated_at=to_micros(now),
                                                          generation=F("generation") + 1):
                raise UnknownFollower(name)

    def skip_poison(self, name: str, *, by: str, reason: str, now: datetime) -> PoisonEvent:
        with self._write(f"skipping the poison event of follower {name!r}"):
            with transaction.atomic(using=self.using):
                row = self._rows().select_for_update().filter(name=name).first()
                if row is None:
                    raise UnknownFollower(name)
                poison = poison_from_json(row.poison)
                if poison is None:
                    raise ValueError(f"follower {name!r} is not stopped on a poison event")
                self._rows().filter(name=name).update(position=max(row.position, poison.position), poison=None,
                                                      updated_at=to_micros(now), generation=F("generation") + 1)
                FollowerSkipRow.objects.using(self.using).create(
                    follower=name, position=poison.position, stream_id=poison.stream_id, aggregate=poison.aggregate,
                    error=poison.error, by=by, reason=reason, at=to_micros(now))
        return poison

    def skipped(self, name: str) -> list[dict]:
        connection = database(self.using)
        with store_errors(connection, f"reading the skipped poison events of follower {name!r}"):
            rows = list(FollowerSkipRow.objects.using(self.using).filter(follower=name).order_by("id"))
        return [{"position": r.position, "streamId": r.stream_id, "aggregate": r.aggregate, "error": r.error,
                 "by": r.by, "reason": r.reason, "at": from_micros(r.at)} for r in rows]

    def gaps(self, name: str) -> list[Gap]:
        """Every gap follower ``name`` skipped, oldest first."""
        rows = FollowerGapRow.objects.using(self.using).filter(follower=name).order_by("id")
        return [Gap(first=r.first, last=r.last, seen_at=from_micros(r.seen_at), skipped_at=from_micros(r.skipped_at))
                for r in rows]


__all__ = ["DjangoFollowerStore", "DjangoStreamFeed"]

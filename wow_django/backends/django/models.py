"""The tables of the django storage backend (app label ``wow_django``).

``wow_event_stream``, one row per stored event stream
    ``position`` is the primary key: a global, increasing number per row (the
    cursor of followers; ``wow_stream_ctx_position`` serves "the streams of one
    context after position p"). Optimistic concurrency is the unique
    constraint ``wow_stream_agg_version_uniq`` (aggregate name, id, version),
    idempotency the request-id constraints below, and ``wow_stream_id_uniq``
    keeps a stream id once. The stores map an ``IntegrityError`` by the name
    of the constraint it hit (``wow_django.backends.django.errors``).

    **Request-id uniqueness in both modes of ``WOW['REQUEST_ID_INDEX']``.**
    The mode is a setting, so the table carries both constraints and a column
    that says how far a row's request id reaches:

    * ``wow_stream_agg_request_uniq`` — unique (aggregate name, aggregate id,
      request id), always. It is the "aggregate" mode, and it holds in
      "global" mode too (unique per type implies unique per aggregate).
    * ``wow_stream_scope_request_uniq`` — unique (aggregate name,
      ``request_scope``, request id). The event store writes ``request_scope``
      = the aggregate id in "aggregate" mode, so this constraint adds nothing
      there, and ``''`` in "global" mode, so that every row of a type written
      in that mode shares one scope and a request id is unique per aggregate
      type. Its index serves the global lookup of a request id, and finds a
      row outside the global scope at once (the mode check below).

    Rows written in "aggregate" mode keep their own scope, so switching an
    existing type to "global" would leave their request ids outside the global
    check: the event store refuses that type with a ``SchemaConflictError``
    (the counterpart of the Mongo backend's "the other mode's index exists")
    until the rows are moved into the global scope, which fails exactly when
    request ids repeat across aggregates::

        UPDATE wow_event_stream SET request_scope = '' WHERE aggregate_name = 'order';

    Switching back from "global" to "aggregate" needs nothing.

``wow_snapshot``, one row per aggregate
    unique (aggregate name, aggregate id), ``wow_snapshot_agg_uniq``: the
    target of the version-guarded upsert.

``wow_prepare_key``, one row per reserved key
    unique (name, key), ``wow_prepare_key_uniq``. ``ttl_at`` is the end of the
    reservation in epoch *microseconds* (UTC): an integer compares the same on
    every engine whatever ``USE_TZ`` says, and gives back the exact datetime
    that was stored.

``wow_stream_context``, one row per context with streams
    the lock that makes positions commit-ordered per context
    (:class:`StreamContextRow`).

``wow_follower``, ``wow_follower_gap``, ``wow_follower_skip``
    followers' state (checkpoint, lease, pause, poison event, skipped-gap
    count), each gap a follower passed, and the audit of skipped poison
    events (``wow_django.backends.django.followers``).

Text columns compare and sort by code point on every engine, like MongoDB
strings (``"C"`` collation on PostgreSQL, SQLite's default ``BINARY``), so a
scan's lexicographic order does not depend on the database's locale.
JSON columns (``header``, ``body``, ``state``, ``value``) are written with
sorted keys and no spaces, so equal values are equal text on SQLite too.

The migrations refer to :class:`CodePointTextField` and
:class:`CanonicalJSONEncoder` and :class:`ExactJSONDecoder` by their import path: keep them here.
Decimals are JSON numbers with their exact digits, read back as ``Decimal``
(:mod:`wow_django.domain.values`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from decimal import Decimal

from django.db import models

from wow_django.domain.values import ExactJSONEncoder


class CanonicalJSONEncoder(ExactJSONEncoder):
    """JSON with sorted keys and compact separators: one text per value. Decimals keep their exact digits."""

    def __init__(self, *args, **kwargs):
        kwargs["sort_keys"] = True
        kwargs["separators"] = (",", ":")
        super().__init__(*args, **kwargs)


class ExactJSONDecoder(json.JSONDecoder):
    """JSON with every number that has a fraction or an exponent read as an exact ``Decimal``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parse_float", Decimal)
        super().__init__(*args, **kwargs)


class CodePointTextField(models.TextField):
    """Text compared and sorted by code point (``COLLATE "C"`` on PostgreSQL; SQLite's default already is)."""

    def db_parameters(self, connection):
        params = super().db_parameters(connection)
        if connection.vendor == "postgresql":
            params["collation"] = "C"
        return params


def _json(*, exact: bool = False, **options) -> models.JSONField:
    """A JSON column; ``exact`` ones (states, event bodies and headers) read fractions back as Decimal."""
    if exact:
        options["decoder"] = ExactJSONDecoder
    return models.JSONField(encoder=CanonicalJSONEncoder, **options)


_store_writes = threading.local()


class EventStreamWriteRefused(RuntimeError):
    """A write of ``wow_event_stream`` outside the event store (see :class:`EventStreamRow`)."""


@contextlib.contextmanager
def store_writes() -> Iterator[None]:
    """Lift :class:`EventStreamRow`'s write guard in this thread: for the event store's own code and tests of
    the table's constraints only. A row written here takes no context lock: followers may never see it."""
    depth = getattr(_store_writes, "depth", 0)
    _store_writes.depth = depth + 1
    try:
        yield
    finally:
        _store_writes.depth = depth


def _refuse_outside_the_store(what: str) -> None:
    if not getattr(_store_writes, "depth", 0):
        raise EventStreamWriteRefused(
            f"{what} of wow_event_stream through the ORM is refused: only the event store writes event streams "
            "(gateway.send, or get_runtime().event_store.append). Its appends lock their context so that "
            "positions follow commit order; a row written around it takes no lock, and a follower that already "
            "passed its position never sees it.")


class EventStreamQuerySet(models.QuerySet):
    """Reads as usual; every write refused outside :func:`store_writes`."""

    def create(self, **kwargs):
        _refuse_outside_the_store("create()")
        return super().create(**kwargs)

    def bulk_create(self, *args, **kwargs):
        _refuse_outside_the_store("bulk_create()")
        return super().bulk_create(*args, **kwargs)

    def bulk_update(self, *args, **kwargs):
        _refuse_outside_the_store("bulk_update()")
        return super().bulk_update(*args, **kwargs)

    def update(self, **kwargs):
        _refuse_outside_the_store("update()")
        return super().update(**kwargs)

    def delete(self):
        _refuse_outside_the_store("delete()")
        return super().delete()


class EventStreamRow(models.Model):
    """One event stream (the events one command produced for one aggregate at one version).

    Read-only through the ORM: ``save()``, ``delete()`` and the queryset's ``create``, ``bulk_create``,
    ``update``, ``bulk_update`` and ``delete`` raise :class:`EventStreamWriteRefused` — the event store
    (raw statements that lock the context first) is the only writer.
    """

    objects = EventStreamQuerySet.as_manager()

    position = models.BigAutoField(primary_key=True)
    stream_id = CodePointTextField()
    context_name = CodePointTextField()
    aggregate_name = CodePointTextField()
    aggregate_id = CodePointTextField()
    tenant_id = CodePointTextField()
    owner_id = CodePointTextField(blank=True, default="")
    request_id = CodePointTextField()
    # aggregate_id in "aggregate" request-id mode, '' in "global" mode (module docstring).
    request_scope = CodePointTextField(blank=True, default="")
    command_id = CodePointTextField()
    version = models.IntegerField()
    header = _json(exact=True, default=dict)
    body = _json(exact=True)  # [{id, name, revision, bodyType, body}, ...]
    size = models.IntegerField()
    create_time = models.BigIntegerField()  # epoch milliseconds

    def save(self, *args, **kwargs):
        _refuse_outside_the_store("save()")
        return super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        _refuse_outside_the_store("delete()")
        return super().delete(*args, **kwargs)

    class Meta:
        app_label = "wow_django"
        db_table = "wow_event_stream"
        verbose_name = "event stream"
        constraints = [
            models.UniqueConstraint(fields=["aggregate_name", "aggregate_id", "version"],
                                    name="wow_stream_agg_version_uniq"),
            models.UniqueConstraint(fields=["aggregate_name", "aggregate_id", "request_id"],
                                    name="wow_stream_agg_request_uniq"),
            models.UniqueConstraint(fields=["aggregate_name", "request_scope", "request_id"],
                                    name="wow_stream_scope_request_uniq"),
            models.UniqueConstraint(fields=["stream_id"], name="wow_stream_id_uniq"),
        ]
        indexes = [models.Index(fields=["context_name", "position"], name="wow_stream_ctx_position")]
        # Checked by wow_django.http.permissions.IsOwnerOrPermitted (any backend: the permission lives here
        # because Django's permissions belong to a model).
        permissions = [("act_for_any_owner", "Can send commands to aggregates another user owns")]

    def __str__(self) -> str:
        return f"{self.aggregate_name} {self.aggregate_id} v{self.version}"


class SnapshotRow(models.Model):
    """The latest stored state of one aggregate."""

    id = models.BigAutoField(primary_key=True)
    aggregate_name = CodePointTextField()
    aggregate_id = CodePointTextField()
    context_name = CodePointTextField()
    tenant_id = CodePointTextField()
    owner_id = CodePointTextField(blank=True, default="")
    version = models.IntegerField()
    event_id = CodePointTextField(blank=True, default="")
    first_operator = CodePointTextField(blank=True, default="")
    operator = CodePointTextField(blank=True, default="")
    first_event_time = models.BigIntegerField(default=0)  # epoch milliseconds
    event_time = models.BigIntegerField(default=0)
    snapshot_time = models.BigIntegerField(default=0)
    deleted = models.BooleanField(default=False)
    state = _json(exact=True, default=dict)

    class Meta:
        app_label = "wow_django"
        db_table = "wow_snapshot"
        verbose_name = "snapshot"
        constraints = [
            models.UniqueConstraint(fields=["aggregate_name", "aggregate_id"], name="wow_snapshot_agg_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.aggregate_name} {self.aggregate_id} v{self.version}"


class PrepareKeyRow(models.Model):
    """One reservation of a key in the PrepareKey store ``name``."""

    id = models.BigAutoField(primary_key=True)
    name = CodePointTextField()
    key = CodePointTextField()
    value = _json()  # any JSON value, null included (stored as JSON null)
    ttl_at = models.BigIntegerField()  # end of the reservation, epoch microseconds (UTC)

    class Meta:
        app_label = "wow_django"
        db_table = "wow_prepare_key"
        verbose_name = "prepared key"
        constraints = [models.UniqueConstraint(fields=["name", "key"], name="wow_prepare_key_uniq")]

    def __str__(self) -> str:
        return f"{self.name}: {self.key}"


class StreamContextRow(models.Model):
    """One row per context that has event streams: appends to a context lock its row first.

    On PostgreSQL the event store's insert takes this row's lock (an upsert in
    the same statement) before the row's ``position`` is drawn, and holds it
    until its transaction ends: appends to one context commit one after the
    other, in position order, so a position missing below a visible one is
    never going to appear (``StreamFeed.gaps_are_final``). SQLite serialises
    every write on the file, so it does not need the row. ``appends`` counts
    the appends that took the lock (committed or not).
    """

    context_name = CodePointTextField(primary_key=True)
    appends = models.BigIntegerField(default=0)

    class Meta:
        app_label = "wow_django"
        db_table = "wow_stream_context"
        verbose_name = "event stream context"

    def __str__(self) -> str:
        return self.context_name


class FollowerRow(models.Model):
    """A follower's state (``wow_django.persistence.followers.FollowerState``); times in epoch microseconds."""

    name = CodePointTextField(primary_key=True)
    position = models.BigIntegerField(default=0)
    updated_at = models.BigIntegerField()
    paused = models.BooleanField(default=False)
    lease_owner = CodePointTextField(null=True, blank=True)
    lease_until = models.BigIntegerField(null=True, blank=True)
    poison = _json(null=True, blank=True)  # {position, streamId, aggregate, error, at}
    gaps_skipped = models.BigIntegerField(default=0)
    last_gap = _json(null=True, blank=True)  # {first, last, seenAt, skippedAt}
    extra = _json(default=dict)
    # Bumped by rewind, pause, resume and skip; checkpoint writes must name it (FollowerStore.advance).
    generation = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        app_label = "wow_django"
        db_table = "wow_follower"
        verbose_name = "follower"

    def __str__(self) -> str:
        return f"{self.name} at {self.position}"


class FollowerGapRow(models.Model):
    """A range of positions a follower passed without seeing them (a gap it gave up waiting for)."""

    id = models.BigAutoField(primary_key=True)
    follower = CodePointTextField()
    first = models.BigIntegerField()
    last = models.BigIntegerField()
    seen_at = models.BigIntegerField()
    skipped_at = models.BigIntegerField()

    class Meta:
        app_label = "wow_django"
        db_table = "wow_follower_gap"
        verbose_name = "skipped gap"
        indexes = [models.Index(fields=["follower", "id"], name="wow_follower_gap_name")]


class FollowerSkipRow(models.Model):
    """The audit of one skipped poison event: who skipped what, why and when."""

    id = models.BigAutoField(primary_key=True)
    follower = CodePointTextField()
    position = models.BigIntegerField()
    stream_id = CodePointTextField()
    aggregate = CodePointTextField()
    error = models.TextField()
    by = CodePointTextField()
    reason = models.TextField()
    at = models.BigIntegerField()

    class Meta:
        app_label = "wow_django"
        db_table = "wow_follower_skip"
        verbose_name = "skipped poison event"
        indexes = [models.Index(fields=["follower", "id"], name="wow_follower_skip_name")]

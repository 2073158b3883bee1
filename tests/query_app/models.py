"""Snapshot and event-stream tables with the columns of the django backend's (app ``wow_django``) tables.

Column names and types follow ``wow_django.backends.django.models``
(``SnapshotRow``: ``wow_snapshot``; ``EventStreamRow``: ``wow_event_stream``):
text compared by code point (``COLLATE "C"`` on PostgreSQL), JSON written with
sorted keys, epoch-millisecond times as big integers.
"""

from __future__ import annotations

from django.db import models

from wow_django.backends.django.models import CodePointTextField, _json


class SnapshotTable(models.Model):
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
    first_event_time = models.BigIntegerField(default=0)
    event_time = models.BigIntegerField(default=0)
    snapshot_time = models.BigIntegerField(default=0)
    deleted = models.BooleanField(default=False)
    state = _json(default=dict)

    class Meta:
        app_label = "wow_query_tests"
        constraints = [models.UniqueConstraint(fields=["aggregate_name", "aggregate_id"],
                                               name="wow_query_tests_snapshot_uniq")]


class EventStreamTable(models.Model):
    position = models.BigAutoField(primary_key=True)
    stream_id = CodePointTextField(unique=True)
    context_name = CodePointTextField()
    aggregate_name = CodePointTextField()
    aggregate_id = CodePointTextField()
    tenant_id = CodePointTextField()
    owner_id = CodePointTextField(blank=True, default="")
    request_id = CodePointTextField()
    command_id = CodePointTextField()
    version = models.IntegerField()
    header = _json(default=dict)
    body = _json()
    size = models.IntegerField()
    create_time = models.BigIntegerField()

    class Meta:
        app_label = "wow_query_tests"

"""A store with what the django query services need (``using``, ``queryset()``) over the test tables."""

from __future__ import annotations

from django.db import models

from wow_django.backends.django.queries import (
    DjangoEventStreamQueryService,
    DjangoQueryService,
    DjangoSnapshotQueryService,
)
from wow_django.persistence.documents import snapshot_to_document, stream_to_document
from wow_django.persistence.records import EventStream, Snapshot

from .models import EventStreamTable, SnapshotTable

ALIASES = ("wow_sqlite", "wow_pg")


class TableStore:
    """Rows of ``model`` in database ``using``; writes documents in the columns the service describes."""

    def __init__(self, model: type[models.Model], service: type[DjangoQueryService], using: str,
                 max_time_ms: int | None = None):
        self.model = model
        self.service = service
        self.using = using
        if max_time_ms is not None:
            self.max_time_ms = max_time_ms

    def queryset(self, aggregate_name: str) -> models.QuerySet:
        return self.model.objects.using(self.using).filter(aggregate_name=aggregate_name)

    def put(self, document: dict) -> None:
        self.model.objects.using(self.using).create(
            **{column.name: document[field] for field, column in self.service.COLUMNS.items()}
        )

    def clear(self) -> None:
        self.model.objects.using(self.using).all().delete()


def snapshot_store(using: str, **options) -> TableStore:
    return TableStore(SnapshotTable, DjangoSnapshotQueryService, using, **options)


def event_store(using: str, **options) -> TableStore:
    return TableStore(EventStreamTable, DjangoEventStreamQueryService, using, **options)


def save_snapshot(store: TableStore, snapshot: Snapshot) -> None:
    store.put(snapshot_to_document(snapshot))


def append_stream(store: TableStore, stream: EventStream) -> None:
    store.put(stream_to_document(stream))

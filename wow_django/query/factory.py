"""The process's query services, over the stores built from the ``WOW`` settings.

::

    from wow_django.query.factory import snapshot_query_service
    page = snapshot_query_service("order").paged(query, tenant_id="t-1")

The backend follows the store: the in-memory stores get the evaluator, the
Mongo stores compiled filters. This module reads settings (through
``wow_django.stores``); the rest of the package does not.
"""

from __future__ import annotations

from wow_django import stores
from wow_django.conf import wow_settings
from wow_django.query.condition import Condition, ListQuery, PagedQuery, SingleQuery
from wow_django.query.condition import parse_count_query as _parse_count
from wow_django.query.condition import parse_list_query as _parse_list
from wow_django.query.condition import parse_paged_query as _parse_paged
from wow_django.query.condition import parse_single_query as _parse_single
from wow_django.query.service import QueryService
from wow_django.store.batching import BatchingEventStore
from wow_django.store.memory import InMemoryEventStore, InMemorySnapshotStore


def snapshot_query_service(aggregate_name: str) -> QueryService:
    """Snapshot (read model) queries for one aggregate type on the configured snapshot store."""
    store = stores.snapshot_store()
    if isinstance(store, InMemorySnapshotStore):
        from wow_django.query.memory_service import InMemorySnapshotQueryService

        return InMemorySnapshotQueryService(store, aggregate_name)
    from wow_django.mongo.snapshot_store import MongoSnapshotStore
    from wow_django.query.mongo_service import MongoSnapshotQueryService

    if isinstance(store, MongoSnapshotStore):
        return MongoSnapshotQueryService(store, aggregate_name)
    raise TypeError(f"no snapshot query service for {type(store).__name__}")


def event_stream_query_service(aggregate_name: str) -> QueryService:
    """Event stream queries for one aggregate type on the configured event store."""
    store = stores.event_store()
    if isinstance(store, BatchingEventStore):
        store = store.inner  # reads go straight to the wrapped store
    if isinstance(store, InMemoryEventStore):
        from wow_django.query.memory_service import InMemoryEventStreamQueryService

        return InMemoryEventStreamQueryService(store, aggregate_name)
    from wow_django.mongo.event_store import MongoEventStore
    from wow_django.query.mongo_service import MongoEventStreamQueryService

    if isinstance(store, MongoEventStore):
        return MongoEventStreamQueryService(store, aggregate_name)
    raise TypeError(f"no event stream query service for {type(store).__name__}")


# --- parsing with the limits of the settings ------------------------------------------


def _limits() -> dict:
    return {"allow_raw": wow_settings.QUERY_ALLOW_RAW, "max_depth": wow_settings.QUERY_MAX_DEPTH}


def parse_single_query(data) -> SingleQuery:
    """``parse_single_query`` with QUERY_ALLOW_RAW and QUERY_MAX_DEPTH."""
    return _parse_single(data, **_limits())


def parse_list_query(data) -> ListQuery:
    """``parse_list_query`` with QUERY_ALLOW_RAW, QUERY_MAX_DEPTH and QUERY_MAX_LIMIT."""
    return _parse_list(data, max_limit=wow_settings.QUERY_MAX_LIMIT, **_limits())


def parse_paged_query(data) -> PagedQuery:
    """``parse_paged_query`` with QUERY_ALLOW_RAW, QUERY_MAX_DEPTH and QUERY_MAX_PAGE_SIZE."""
    return _parse_paged(data, max_page_size=wow_settings.QUERY_MAX_PAGE_SIZE, **_limits())


def parse_count_query(data) -> Condition:
    """``parse_count_query`` (a bare condition) with QUERY_ALLOW_RAW and QUERY_MAX_DEPTH."""
    return _parse_count(data, **_limits())


__all__ = [
    "event_stream_query_service",
    "parse_count_query",
    "parse_list_query",
    "parse_paged_query",
    "parse_single_query",
    "snapshot_query_service",
]

"""Parsing query bodies with the limits of the ``WOW`` settings (raw filters, depth, page size, limit).

The services that answer them are the runtime's: ``get_runtime().snapshot_queries(name)``
and ``get_runtime().event_queries(name)``."""

from __future__ import annotations

from wow_django.conf import wow_settings
from wow_django.query.condition import Condition, ListQuery, PagedQuery, SingleQuery
from wow_django.query.condition import parse_count_query as _parse_count
from wow_django.query.condition import parse_list_query as _parse_list
from wow_django.query.condition import parse_paged_query as _parse_paged
from wow_django.query.condition import parse_single_query as _parse_single

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
    "parse_count_query",
    "parse_list_query",
    "parse_paged_query",
    "parse_single_query",
]

"""Aggregates in the console: per registered aggregate, its event streams and snapshots, and one aggregate's
streams with its state at a chosen version and after each stream. Read through the query services and the
repository, so every storage backend serves it."""

from __future__ import annotations

import base64
import json
from datetime import UTC

from django.contrib import messages
from django.http import Http404
from django.urls import reverse
from django.utils.http import urlencode

from wow_django.application.repository import apply_stream
from wow_django.application.runtime import get_runtime
from wow_django.bus.envelope import aggregate_keys, parse_time, search_key
from wow_django.conf import wow_settings
from wow_django.console.base import allowed, page, pretty, requires
from wow_django.domain import registry
from wow_django.persistence.documents import snapshot_to_document, stream_to_document
from wow_django.persistence.query import EVENT_STREAM, SNAPSHOT, present
from wow_django.persistence.records import MAX_VERSION, AggregateId
from wow_django.query import QueryValidationError
from wow_django.query.condition import parse_list_query, parse_paged_query

PAGE_SIZE = 25
MAX_STREAMS_SHOWN = 200  # the streams (and states after each) one aggregate's page shows


def _aggregate_or_404(name: str):
    cls = registry.aggregates().get(name)
    if cls is None:
        raise Http404(f"No aggregate {name!r} is registered.")
    return cls


@requires("view_aggregates")
def aggregate_list(request):
    """Every registered aggregate, with links to its streams and snapshots."""
    return page(request, "aggregates.html", "Aggregates", names=sorted(registry.aggregates()))


def _page_number(request) -> int:
    raw = request.GET.get("page", "1")
    if not raw.isdecimal() or not 1 <= int(raw) <= 100_000:
        if raw != "1":
            messages.error(request, "page: must be a whole number from 1 to 100000; showing the first page")
        return 1
    return int(raw)


def _version(request, key: str, problems: list[str]) -> int | None:
    raw = request.GET.get(key, "").strip()
    if not raw:
        return None
    if not raw.isdecimal() or not 1 <= int(raw) <= MAX_VERSION:
        problems.append(f"{key}: a version is a whole number from 1 to {MAX_VERSION}")
        return None
    return int(raw)


def _time_ms(request, key: str, problems: list[str]) -> int | None:
    raw = request.GET.get(key, "").strip()
    if not raw:
        return None
    try:
        return int(parse_time(raw).replace(tzinfo=UTC).timestamp() * 1000)
    except (ValueError, OverflowError) as exc:
        problems.append(f"{key}: {exc}")
        return None


def _run(request, service, conditions: list[dict], sort_fields: tuple[str, ...], index: int):
    """``(total, documents)`` of the page, or ``(0, [])`` with the query's error as a message."""
    body = {"condition": {"operator": "AND", "children": conditions} if conditions else {"operator": "ALL"},
            "sort": [{"field": field, "direction": "DESC"} for field in sort_fields], "pagination": {"index": index, "size": PAGE_SIZE}}
    try:
        result = service.paged(parse_paged_query(body, max_page_size=PAGE_SIZE))
    except QueryValidationError as exc:
        messages.error(request, str(exc))
        return 0, []
    return result.total, result.list


def _kept_filters(request, paging: tuple[str, ...] = ("page",)) -> str:
    """The request's filters as a query string for the page links (the paging parameters left out)."""
    return urlencode({key: value for key, value in request.GET.items() if key not in paging and value})


def _pages(total: int, index: int) -> dict:
    last = max(1, -(-total // PAGE_SIZE))
    return {"index": index, "last": last, "previous": index - 1 if index > 1 else None,
            "next": index + 1 if index < last else None}


TEXT_FILTERS = {"aggregate_id": "aggregateId", "tenant": "tenantId", "owner": "ownerId", "request_id": "requestId"}


@requires("view_aggregates")
def event_streams(request, name: str):
    """The aggregate's event streams, newest first: filters aggregate id, tenant, owner, request id, time,
    version range."""
    _aggregate_or_404(name)
    filters = {key: request.GET.get(key, "").strip() for key in
               (*TEXT_FILTERS, "since", "until", "version_from", "version_to")}
    problems: list[str] = []
    conditions = [{"field": field, "operator": "EQ", "value": filters[key]}
                  for key, field in TEXT_FILTERS.items() if filters[key]]
    low, high = _version(request, "version_from", problems), _version(request, "version_to", problems)
    since, until = _time_ms(request, "since", problems), _time_ms(request, "until", problems)
    for field, operator, value in (("version", "GTE", low), ("version", "LTE", high),
                                   ("createTime", "GTE", since), ("createTime", "LT", until)):
        if value is not None:
            conditions.append({"field": field, "operator": operator, "value": value})
    after, before = _stream_key(request, "cursor", problems), _stream_key(request, "before", problems)
    documents, next_key, previous_key = [], None, None
    if not problems:
        documents, next_key, previous_key = _stream_page(request, get_runtime().event_queries(name), conditions,
                                                         after=after, before=before)
    for problem in problems:
        messages.error(request, problem)
    kept = _kept_filters(request, ("cursor", "before", "page"))
    return page(request, "event_streams.html", f"{name}: event streams", name=name, filters=filters,
                streams=documents, first_url=f"?{kept}" if previous_key else None,
                previous_url=f"?{urlencode({'before': previous_key})}&{kept}" if previous_key else None,
                next_url=f"?{urlencode({'cursor': next_key})}&{kept}" if next_key else None)


def _stream_cursor(document: dict) -> str:
    """The page cursor of an event stream: its (createTime, id), URL-safe."""
    raw = json.dumps([document["createTime"], document["id"]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _stream_key(request, name: str, problems: list[str]) -> tuple[int, str] | None:
    raw = request.GET.get(name, "")
    if not raw:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if (isinstance(key, list) and len(key) == 2 and isinstance(key[0], int) and not isinstance(key[0], bool)
                and 0 <= key[0] < 2**63 and isinstance(key[1], str) and 0 < len(key[1]) <= 255
                and key[1].isprintable()):
            return key[0], key[1]
    except (ValueError, UnicodeDecodeError):
        pass
    problems.append(f"{name}: is not a page cursor of this list; start from the first page")
    return None


def _beyond(key: tuple[int, str], operator: str) -> dict:
    """The streams past ``key`` in the order (createTime, id), ``LT`` older or ``GT`` newer."""
    moment, stream_id = key
    return {"operator": "OR", "children": [
        {"field": "createTime", "operator": operator, "value": moment},
        {"operator": "AND", "children": [{"field": "createTime", "operator": "EQ", "value": moment},
                                         {"field": "id", "operator": operator, "value": stream_id}]}]}


def _stream_page(request, service, conditions: list[dict], *, after, before):
    """``(streams, next cursor, previous cursor)``: newest first by (createTime, id), keyset-paged both ways: a
    list query of one page and a look-ahead row (no count), so a deep page costs what the first does."""

    def read(extra: list[dict], direction: str) -> list[dict]:
        children = conditions + extra
        body = {"condition": {"operator": "AND", "children": children} if children else {"operator": "ALL"},
                "sort": [{"field": "createTime", "direction": direction}, {"field": "id", "direction": direction}],
                "limit": PAGE_SIZE + 1}
        try:
            return service.list(parse_list_query(body, max_limit=PAGE_SIZE + 1))
        except QueryValidationError as exc:
            messages.error(request, str(exc))
            return []

    if before is not None:
        newer = read([_beyond(before, "GT")], "ASC")
        documents = newer[:PAGE_SIZE][::-1]
        has_newer, has_older = len(newer) > PAGE_SIZE, True
        if not documents:  # nothing before it: the first page
            return _stream_page(request, service, conditions, after=None, before=None)
    else:
        older = read([_beyond(after, "LT")] if after is not None else [], "DESC")
        documents, has_older = older[:PAGE_SIZE], len(older) > PAGE_SIZE
        has_newer = after is not None and bool(documents)
    next_key = _stream_cursor(documents[-1]) if has_older and documents else None
    previous_key = _stream_cursor(documents[0]) if has_newer and documents else None
    return documents, next_key, previous_key


@requires("view_aggregates")
def snapshots(request, name: str):
    """The aggregate's snapshots, latest first: filters aggregate id, tenant, owner, deleted or not."""
    _aggregate_or_404(name)
    filters = {key: request.GET.get(key, "").strip() for key in ("aggregate_id", "tenant", "owner", "deleted")}
    conditions = [{"field": field, "operator": "EQ", "value": filters[key]}
                  for key, field in (("aggregate_id", "aggregateId"), ("tenant", "tenantId"), ("owner", "ownerId"))
                  if filters[key]]
    deleted = filters["deleted"].upper() or "ALL"
    if deleted not in ("ALL", "ACTIVE", "DELETED"):
        messages.error(request, "deleted: must be all, active or deleted")
        deleted = "ALL"
    conditions.append({"operator": "DELETED", "value": deleted})
    index = _page_number(request)
    total, documents = _run(request, get_runtime().snapshot_queries(name), conditions, ("snapshotTime", "version"), index)
    return page(request, "snapshots.html", f"{name}: snapshots", name=name, filters=filters, rows=documents,
                total=total, pages=_pages(total, index),
                query=_kept_filters(request))


@requires("view_aggregates")
def aggregate_detail(request, name: str, aggregate_id: str):
    """One aggregate: its snapshot, its streams with the state after each, and its state at ``?version=``."""
    cls = _aggregate_or_404(name)
    runtime = get_runtime()
    try:
        AggregateId(name, aggregate_id, wow_settings.CONTEXT_NAME)
    except ValueError:
        raise Http404(f"{aggregate_id!r} is not an aggregate id.")
    # The console serves every tenant: it reads the aggregate under the tenant it is stored under.
    key = runtime.event_store.locate(name, aggregate_id)
    streams = runtime.event_store.load(key, 1, MAX_STREAMS_SHOWN) if key is not None else []
    if key is None or not streams:
        raise Http404(f"{name} {aggregate_id!r} has no events.")
    repository = runtime.gateway.repository
    states = []
    aggregate = cls(aggregate_id, streams[0].aggregate_id.tenant_id)
    for stream in streams:
        apply_stream(aggregate, stream)
        states.append({"stream": present(EVENT_STREAM, stream_to_document(stream)),
                       "state": pretty(aggregate.state.model_dump(mode="json"))})
    last = runtime.event_store.last(key)
    head = last.version if last is not None else streams[-1].version
    at, state_at = None, None
    raw = request.GET.get("version", "").strip()
    if raw:
        if not raw.isdecimal() or not 1 <= int(raw) <= head:
            messages.error(request, f"version: must be a whole number from 1 to {head} (the aggregate's version)")
        else:
            at = int(raw)
            loaded = repository.load(cls, aggregate_id, tenant_id=key.tenant_id, tail_version=at)
            state_at = pretty(loaded.state.model_dump(mode="json")) if loaded is not None else None
    snapshot = runtime.snapshot_store.load(key)
    followers = []
    if allowed(request.user, "manage_followers"):
        try:
            followers = sorted(state.name for state in runtime.follower_store.all())
        except NotImplementedError:  # no followers on this runtime
            followers = []
    return page(request, "aggregate_detail.html", f"{name} {aggregate_id}", name=name, aggregate_id=aggregate_id,
                followers=followers,
                head=head, states=states, truncated=head > len(streams), at=at, state_at=state_at,
                snapshot=pretty(snapshot_document(snapshot)) if snapshot is not None else None,
                tenant=streams[0].aggregate_id.tenant_id,
                bus_events_url=reverse("wow_console:events") + "?" + urlencode({"q": search_key(
                    "aggregate", aggregate_keys(name, aggregate_id)["aggregate"])})
                if allowed(request.user, "view_bus_events") and allowed(request.user, "view_payloads") else None)


def snapshot_document(snapshot) -> dict:
    return present(SNAPSHOT, snapshot_to_document(snapshot))

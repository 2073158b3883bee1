"""Query services: one contract for snapshots (read models) and event streams.

A service answers parsed queries (:mod:`wow_django.query.condition`) for one
aggregate type::

    service.single(query, tenant_id="t-1")   # dict or None
    service.list(query, tenant_id="t-1")     # [dict, ...]
    service.paged(query, tenant_id="t-1")    # PagedList(total, list)
    service.count(condition, tenant_id="t-1")

What every backend guarantees, whatever the client's condition says:

* ``tenant_id`` (when not ``None``) is ANDed to the condition: nothing of
  another tenant is read or counted. Callers serving clients always pass it;
  ``None`` is for trusted server-side code that reads across tenants.
* ``scope`` (a Condition) is ANDed too: the hook for server-side rules such
  as "only my own aggregates".
* Snapshot queries see only live aggregates (``deleted == false``) unless the
  condition itself mentions deletion: a DELETED operator, a ``deleted``
  field, or a RAW filter naming ``deleted``.
* Values compared with a field the aggregate's model declares as ``Decimal``
  or ``datetime`` are brought to the stored type first (numeric text to a
  Decimal, ISO-8601 or epoch milliseconds to canonical time text, the date
  operators to time bounds): :mod:`wow_django.query.typed`.
* ``id`` and ``aggregateId`` name ``_id`` for snapshots; ``id`` names ``_id``
  for event streams.
* Results are JSON-ready dicts in Wow's shape: a snapshot carries
  ``aggregateId`` (its ``_id``), an event stream ``id``. Ties in the sort
  order are broken by ``_id``, so pages never overlap.

Backends: :mod:`wow_django.backends.memory.queries` (the in-memory stores, with
the Python evaluator) and :mod:`wow_django.backends.mongo.queries` (compiled
filters). This module is the contract and the rules every backend applies
before it compiles; it imports no backend and no compiler. No Django here.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from wow_django.domain.aggregate import aggregate_type
from wow_django.domain.messages import event_type
from wow_django.query.condition import (
    ALL_CONDITION,
    ALL_FIELDS,
    Condition,
    DeletionState,
    ListQuery,
    Operator,
    PagedQuery,
    Projection,
    SingleQuery,
    SortField,
    and_conditions,
    target_field,
)
from wow_django.query.errors import QueryValidationError
from wow_django.query.semantics import map_field
from wow_django.query.typed import Resolver, event_stream_resolver, snapshot_resolver, type_condition

SNAPSHOT = "snapshot"
EVENT_STREAM = "event_stream"
KINDS = (SNAPSHOT, EVENT_STREAM)

FIELD_MAPS: dict[str, dict[str, str]] = {
    SNAPSHOT: {"id": "_id", "aggregateId": "_id"},
    EVENT_STREAM: {"id": "_id"},
}
# The name ``_id`` takes in results.
ID_NAMES = {SNAPSHOT: "aggregateId", EVENT_STREAM: "id"}

TIE_BREAKER = SortField(field="_id")
DELETION_FIELD = "deleted"


@dataclass(frozen=True, slots=True)
class PagedList:
    """One page of results and the number of matches on every page."""

    total: int
    list: list[dict]

    def to_json(self) -> dict:
        return {"total": self.total, "list": self.list}


# --- scope -------------------------------------------------------------------------------


def _document_nodes(condition: Condition) -> Iterator[Condition]:
    """The nodes that name fields of the document itself (ELEM_MATCH children name element fields)."""
    yield condition
    if condition.operator in (Operator.AND, Operator.OR, Operator.NOR):
        for child in condition.children:
            yield from _document_nodes(child)


def _names_field(path: str, name: str) -> bool:
    return path == name or path.startswith(name + ".")


def _raw_names_field(value: Any, name: str) -> bool:
    if isinstance(value, dict):
        return any(
            (isinstance(key, str) and _names_field(key, name)) or _raw_names_field(item, name)
            for key, item in value.items()
        )
    if isinstance(value, list | tuple):
        return any(_raw_names_field(item, name) for item in value)
    return False


def mentions_deletion(condition: Condition) -> bool:
    """Whether ``condition`` says anything about the ``deleted`` flag (so the live-only guard stays off)."""
    for node in _document_nodes(condition):
        if node.operator is Operator.DELETED:
            return True
        if node.operator is Operator.RAW and _raw_names_field(node.value, DELETION_FIELD):
            return True
        if _names_field(target_field(node), DELETION_FIELD):
            return True
    return False


def tenant_condition(tenant_id: str) -> Condition:
    return Condition(operator=Operator.TENANT_ID, value=tenant_id)


LIVE_ONLY = Condition(operator=Operator.DELETED, value=DeletionState.ACTIVE)


def scoped_condition(
    kind: str, condition: Condition, *, tenant_id: str | None = None, scope: Condition | None = None
) -> Condition:
    """``condition`` AND the tenant AND ``scope`` AND (snapshots) the live-only guard.

    A top-level AND of the client is flattened into the result, so a MATCH
    the client put there stays at the top level of the filter.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    parts = list(condition.children) if condition.operator is Operator.AND else [condition]
    if tenant_id is not None:
        if not isinstance(tenant_id, str) or not tenant_id:
            raise ValueError(f"tenant_id must be a non-empty string or None, got {tenant_id!r}")
        parts.append(tenant_condition(tenant_id))
    if scope is not None:
        parts.append(scope)
    if kind == SNAPSHOT and not mentions_deletion(condition) and not (scope is not None and mentions_deletion(scope)):
        parts.append(LIVE_ONLY)
    return and_conditions(*parts)


def with_tie_breaker(sort: Iterable[SortField], field_map: dict[str, str]) -> tuple[SortField, ...]:
    """``sort`` ending with ``_id`` ascending unless it already sorts on ``_id``."""
    keys = tuple(sort)
    if any(map_field(item.field, field_map) == "_id" for item in keys):
        return keys
    return (*keys, TIE_BREAKER)


def split_text_search(condition: Condition) -> tuple[Condition, Condition | None]:
    """``(rest, match)``: the MATCH node of ``condition`` and the condition without it.

    The parser only lets MATCH stand at the top level or inside top-level
    ANDs, so ``condition`` is ``match AND rest``. ``match`` is ``None`` when
    there is no MATCH at those places.
    """
    if condition.operator is Operator.MATCH:
        return ALL_CONDITION, condition
    if condition.operator is Operator.AND:
        children = condition.children
        for index, child in enumerate(children):
            rest, found = split_text_search(child)
            if found is not None:
                kept = (*children[:index], rest, *children[index + 1 :])
                return and_conditions(*kept), found
    return condition, None


# --- results -----------------------------------------------------------------------------


#: Wow's fields a document carries that wow_django keeps constant: every aggregate is in its tenant's default
#: space (``spaceId`` "", of snapshots and event streams) and carries no ABAC tags (``tags``, of snapshots).
CONSTANT_FIELDS: dict[str, dict[str, object]] = {SNAPSHOT: {"spaceId": "", "tags": {}}, EVENT_STREAM: {"spaceId": ""}}


def present(kind: str, document: dict, projection: Projection = ALL_FIELDS) -> dict:
    """A stored document as the API returns it: ``_id`` renamed (and first), the rest in stored order, with
    Wow's :data:`CONSTANT_FIELDS` after ``ownerId`` when the projection lets them through."""
    result: dict = {}
    if "_id" in document:
        result[ID_NAMES[kind]] = document["_id"]
    constant = {name: copy.deepcopy(value) for name, value in CONSTANT_FIELDS[kind].items()
                if name not in document and _projected(projection, name)}
    for key, value in document.items():
        if key != "_id":
            result[key] = value
        if key == "ownerId":
            result.update(constant)
            constant = {}
    result.update(constant)
    return result


def _projected(projection: Projection, name: str) -> bool:
    """Whether ``projection`` returns the top-level field ``name``."""
    if projection.include:
        return name in projection.include
    return name not in projection.exclude


class QueryService(ABC):
    """Queries over one aggregate type's snapshots or event streams (see the module docstring)."""

    def __init__(self, aggregate_name: str, kind: str):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not isinstance(aggregate_name, str) or not aggregate_name:
            raise ValueError(f"aggregate_name must be a non-empty string, got {aggregate_name!r}")
        self.aggregate_name = aggregate_name
        self.kind = kind
        self.field_map = FIELD_MAPS[kind]

    # --- what a backend provides -------------------------------------------------------

    @abstractmethod
    def find_documents(
        self, condition: Condition, *, projection: Projection, sort: tuple[SortField, ...], skip: int, limit: int
    ) -> list[dict]:
        """Stored documents matching the already scoped ``condition`` (``limit`` 0 = all)."""

    @abstractmethod
    def count_documents(self, condition: Condition) -> int:
        """How many stored documents match the already scoped ``condition``."""

    # --- the operations ------------------------------------------------------------------

    def value_types(self) -> Resolver | None:
        """What the aggregate's model declares its fields to hold (its state; its events' bodies)."""
        cls = aggregate_type(self.aggregate_name)
        if cls is None:
            return None
        if self.kind == SNAPSHOT:
            return snapshot_resolver(cls.state_class)
        events = [event_type(name) for name in cls.state_class.sourcing_handlers]
        return event_stream_resolver([event for event in events if event is not None])

    def scope(self, condition: Condition, tenant_id: str | None, scope: Condition | None) -> Condition:
        """The client's ``condition`` with typed values (:mod:`wow_django.query.typed`), scoped."""
        typed = type_condition(condition, self.value_types())
        return scoped_condition(self.kind, typed, tenant_id=tenant_id, scope=scope)

    def _find(self, query: SingleQuery, tenant_id: str | None, scope: Condition | None, *, skip: int,
              limit: int) -> list[dict]:
        documents = self.find_documents(
            self.scope(query.condition, tenant_id, scope),
            projection=query.projection,
            sort=with_tie_breaker(query.sort, self.field_map),
            skip=skip,
            limit=limit,
        )
        return [present(self.kind, doc, query.projection) for doc in documents]

    def single(
        self, query: SingleQuery, *, tenant_id: str | None = None, scope: Condition | None = None
    ) -> dict | None:
        """The first match in sort order, or ``None``."""
        found = self._find(query, tenant_id, scope, skip=0, limit=1)
        return found[0] if found else None

    def list(self, query: ListQuery, *, tenant_id: str | None = None, scope: Condition | None = None) -> list[dict]:
        """At most ``query.limit`` matches in sort order."""
        return self._find(query, tenant_id, scope, skip=0, limit=query.limit)

    def paged(self, query: PagedQuery, *, tenant_id: str | None = None, scope: Condition | None = None) -> PagedList:
        """Page ``query.pagination`` of the matches, with the number of matches."""
        total = self.count_documents(self.scope(query.condition, tenant_id, scope))
        offset = query.pagination.offset
        if offset >= total:
            return PagedList(total=total, list=[])
        page = self._find(query, tenant_id, scope, skip=offset, limit=query.pagination.size)
        return PagedList(total=total, list=page)

    def count(self, condition: Condition, *, tenant_id: str | None = None, scope: Condition | None = None) -> int:
        """How many documents match."""
        return self.count_documents(self.scope(condition, tenant_id, scope))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.aggregate_name} {self.kind}>"


def refuse_misplaced_text_search() -> QueryValidationError:
    return QueryValidationError(
        "condition", "MATCH (full-text search) may only appear at the top level or inside top-level AND conditions"
    )

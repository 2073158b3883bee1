"""Compile parsed conditions, projections and sorts into MongoDB (pymongo) arguments.

Every client value is wrapped in an explicit operator (``{"$eq": value}``,
``{"$in": [...]}``) so that no value is ever read as an operator, and text
operators escape the client's text before building a ``$regex``. RAW filters
are copied through as the parser validated them.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from bson import Decimal128
from pymongo import ASCENDING, DESCENDING

from wow_django.query import dates
from wow_django.query.condition import (
    COMPARISON_OPERATORS,
    DATE_OPERATORS,
    Condition,
    DeletionState,
    Direction,
    Operator,
    Projection,
    SortField,
    and_conditions,
    target_field,
    uses_operator,
)
from wow_django.query.semantics import date_bounds, map_field, text_pattern

Op = Operator

_COMPARISON = {Op.GT: "$gt", Op.LT: "$lt", Op.GTE: "$gte", Op.LTE: "$lte"}


def _plain(value: Any) -> Any:
    """A deep copy with tuples turned into lists, as pymongo and mongomock expect."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


class _Compiler:
    def __init__(self, field_map: dict[str, str] | None, now: datetime):
        self.field_map = field_map or {}
        self.now = now

    def compile(self, condition: Condition, *, top_level: bool) -> dict:
        op = condition.operator
        field_map = self.field_map if top_level else None
        name = map_field(target_field(condition), field_map) if target_field(condition) else ""
        value = condition.value

        if op is Op.ALL:
            return {}
        if op is Op.AND:
            parts = [part for part in (self.compile(c, top_level=top_level) for c in condition.children) if part]
            if not parts:
                return {}
            return parts[0] if len(parts) == 1 else {"$and": parts}
        if op in (Op.OR, Op.NOR):
            return {"$" + op.value.lower(): [self.compile(c, top_level=top_level) for c in condition.children]}
        if op in (Op.ID, Op.AGGREGATE_ID, Op.TENANT_ID, Op.OWNER_ID):
            return {name: {"$eq": value}}
        if op in (Op.IDS, Op.AGGREGATE_IDS):
            return {name: {"$in": _plain(value)}}
        if op is Op.DELETED:
            if value == DeletionState.ALL:
                return {}
            return {name: {"$eq": value == DeletionState.DELETED}}
        if op in (Op.EQ, Op.NE):
            if condition.options.ignore_case and isinstance(value, str):
                clause: dict[str, Any] = {name: {"$regex": text_pattern(op, value), "$options": "i"}}
                # $nor of one clause is "not", and unlike $not it accepts $regex with $options everywhere.
                return clause if op is Op.EQ else {"$nor": [clause]}
            return {name: {"$eq" if op is Op.EQ else "$ne": _plain(value)}}
        if op in COMPARISON_OPERATORS:
            return {name: {_COMPARISON[op]: value}}
        if op in (Op.CONTAINS, Op.STARTS_WITH, Op.ENDS_WITH):
            regex: dict[str, Any] = {"$regex": text_pattern(op, value)}
            if condition.options.ignore_case:
                regex["$options"] = "i"
            return {name: regex}
        if op is Op.MATCH:
            return {"$text": {"$search": value}}
        if op is Op.IN:
            return {name: {"$in": _plain(value)}}
        if op is Op.NOT_IN:
            return {name: {"$nin": _plain(value)}}
        if op is Op.BETWEEN:
            low, high = value
            return {name: {"$gte": low, "$lte": high}}
        if op is Op.ALL_IN:
            return {name: {"$all": _plain(value)}}
        if op is Op.ELEM_MATCH:
            # Children name fields of the array element: no field map below this point.
            return {name: {"$elemMatch": self.compile(and_conditions(*condition.children), top_level=False)}}
        if op is Op.NULL:
            return {name: {"$eq": None}}
        if op is Op.NOT_NULL:
            return {name: {"$ne": None}}
        if op in (Op.TRUE, Op.FALSE):
            return {name: {"$eq": op is Op.TRUE}}
        if op is Op.EXISTS:
            return {name: {"$exists": bool(value)}}
        if op in DATE_OPERATORS:
            low, high = date_bounds(condition, self.now)
            bounds: dict[str, Any] = {}
            if low is not None:
                bounds["$gte"] = low
            bounds["$lt"] = high
            return {name: bounds}
        if op is Op.RAW:
            return _plain(value)
        raise ValueError(f"no MongoDB translation for operator {op}")


def compile_filter(
    condition: Condition, *, field_map: dict[str, str] | None = None, now: datetime | None = None
) -> dict:
    """The MongoDB filter for a parsed ``condition``.

    ``field_map`` renames the first segment of client field paths (snapshots:
    ``{"id": "_id", "aggregateId": "_id"}``; events: ``{"id": "_id"}``); it
    does not apply inside ELEM_MATCH, whose fields are relative to the array
    element. ID and IDS always use ``_id``. ``now`` (aware datetime, default
    the current time) anchors the date operators.
    """
    return _decimal128(_Compiler(field_map, dates.resolve_now(now)).compile(condition, top_level=True))


def _decimal128(value: Any) -> Any:
    """The filter with each Decimal value (a typed condition's) as ``Decimal128``, which compares numerically."""
    if isinstance(value, Decimal):
        return Decimal128(value)
    if isinstance(value, dict):
        return {key: _decimal128(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_decimal128(item) for item in value]
    return value


def compile_projection(projection: Projection, *, field_map: dict[str, str] | None = None) -> dict | None:
    """A pymongo projection (``{"a": 1}`` or ``{"a": 0}``), or ``None`` for every field.

    As in MongoDB, an include projection still returns ``_id``.
    """
    if projection.include:
        return {map_field(path, field_map): 1 for path in projection.include}
    if projection.exclude:
        return {map_field(path, field_map): 0 for path in projection.exclude}
    return None


def compile_sort(sort: tuple[SortField, ...] | list[SortField], *, field_map: dict[str, str] | None = None) -> list:
    """pymongo sort keys: ``[(field, ASCENDING | DESCENDING), ...]``; empty for no order."""
    keys: list[tuple[str, int]] = []
    seen: set[str] = set()
    for item in sort:
        name = map_field(item.field, field_map)
        if name in seen:  # "id" and "aggregateId" both become _id for snapshots
            continue
        seen.add(name)
        keys.append((name, DESCENDING if item.direction is Direction.DESC else ASCENDING))
    return keys


def needs_text_search(condition: Condition) -> bool:
    """Whether ``condition`` uses MATCH (``$text``), which needs a text index on the collection."""
    return uses_operator(condition, Operator.MATCH)

"""Evaluate parsed conditions, projections and sorts on plain Python documents.

The semantics are MongoDB's, so the in-memory stores answer queries the way
the Mongo backend does:

* a dotted path walks into sub-documents; through an array it walks into each
  element (and a numeric segment also indexes the array);
* a path "matches" EQ, IN, comparisons and text operators when the value
  found, or any element of it when it is an array, matches;
* comparisons only compare numbers with numbers and strings with strings
  (GT on a missing field or on a string against a number is false), and
  booleans are not numbers;
* EQ null (and NULL, IN with null) also matches a missing field; NE, NOT_IN
  and NOT_NULL are the exact negations of EQ, IN and NULL, so NE matches
  a missing field;
* bounds of BETWEEN and of the date operators are checked one by one, so
  on an array field different elements may satisfy the low and the high
  bound (as ``{"$gte": a, "$lte": b}`` does in MongoDB; use ELEM_MATCH to
  require one element).

MATCH approximates a wildcard text index: case-insensitive, a document
matches when any word of the search text is a word of any string in it
(no stemming, phrases or negation). RAW cannot be evaluated here.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from wow_django.query import dates
from wow_django.query.condition import (
    DATE_OPERATORS,
    Condition,
    DeletionState,
    Direction,
    Operator,
    Projection,
    SortField,
    target_field,
)
from wow_django.query.errors import QueryValidationError
from wow_django.query.semantics import date_bounds, map_field, search_terms, text_pattern, words

Op = Operator


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


# --- paths ---------------------------------------------------------------------------------


def reach(value: Any, segments: list[str] | tuple[str, ...]) -> list[Any]:
    """Every value ``segments`` leads to inside ``value``; MISSING marks a branch that ends early."""
    if not segments:
        return [value]
    head, rest = segments[0], segments[1:]
    if isinstance(value, dict):
        return reach(value[head], rest) if head in value else [MISSING]
    if isinstance(value, list):
        found: list[Any] = []
        if head.isdigit() and int(head) < len(value):
            found.extend(reach(value[int(head)], rest))
        for element in value:
            if isinstance(element, dict):
                found.extend(reach(element, segments))
        return found or [MISSING]
    return [MISSING]


def _candidates(leaves: Iterable[Any]) -> Iterable[Any]:
    """The values a query operator looks at: each leaf, and the elements of array leaves."""
    for leaf in leaves:
        if leaf is MISSING:
            continue
        yield leaf
        if isinstance(leaf, list):
            yield from leaf


# --- value semantics -------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def mongo_equal(left: Any, right: Any) -> bool:
    """Equality as MongoDB sees it: typed (true is not 1), numbers across int/float, ordered documents."""
    if _is_number(left) and _is_number(right):
        return left == right
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return len(left) == len(right) and all(
            lk == rk and mongo_equal(lv, rv) for (lk, lv), (rk, rv) in zip(left.items(), right.items(), strict=True)
        )
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(mongo_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict | list | tuple) or isinstance(right, dict | list | tuple):
        return False
    if _is_number(left) or _is_number(right):
        return False
    return type(left) is type(right) and left == right


def _comparable(candidate: Any, bound: Any) -> bool:
    """MongoDB compares within a type bracket: numbers with numbers, strings with strings."""
    if _is_number(bound):
        return _is_number(candidate)
    return isinstance(candidate, str) and isinstance(bound, str)


def _compare(leaves: list[Any], operator: str, bound: Any) -> bool:
    for candidate in _candidates(leaves):
        if not _comparable(candidate, bound):
            continue
        if operator == "gt" and candidate > bound:
            return True
        if operator == "gte" and candidate >= bound:
            return True
        if operator == "lt" and candidate < bound:
            return True
        if operator == "lte" and candidate <= bound:
            return True
    return False


def _equals(leaves: list[Any], value: Any) -> bool:
    if value is None:
        return any(leaf is MISSING for leaf in leaves) or any(c is None for c in _candidates(leaves))
    return any(mongo_equal(candidate, value) for candidate in _candidates(leaves))


def _regex(leaves: list[Any], pattern: str, ignore_case: bool) -> bool:
    compiled = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    return any(isinstance(c, str) and compiled.search(c) for c in _candidates(leaves))


def _words(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield from words(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _words(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _words(item)


_COMPARISON = {Op.GT: "gt", Op.LT: "lt", Op.GTE: "gte", Op.LTE: "lte"}


class _Evaluator:
    def __init__(self, field_map: dict[str, str] | None, now: datetime):
        self.field_map = field_map or {}
        self.now = now

    def leaves(self, condition: Condition, document: dict, top_level: bool) -> list[Any]:
        name = map_field(target_field(condition), self.field_map if top_level else None)
        return reach(document, name.split("."))

    def match(self, condition: Condition, document: dict, path: str, top_level: bool) -> bool:
        op = condition.operator
        value = condition.value

        if op is Op.ALL:
            return True
        if op in (Op.AND, Op.OR, Op.NOR):
            results = (
                self.match(child, document, f"{path}.children[{i}]", top_level)
                for i, child in enumerate(condition.children)
            )
            if op is Op.AND:
                return all(results)
            return any(results) if op is Op.OR else not any(results)
        if op is Op.MATCH:
            terms = search_terms(value)
            return bool(terms) and any(word in terms for word in _words(document))
        if op is Op.RAW:
            raise QueryValidationError(
                path, "RAW conditions need the Mongo backend; the Python evaluator cannot run MongoDB filters"
            )
        if op is Op.DELETED and value == DeletionState.ALL:
            return True

        leaves = self.leaves(condition, document, top_level)
        if op in (Op.ID, Op.AGGREGATE_ID, Op.TENANT_ID, Op.OWNER_ID):
            return _equals(leaves, value)
        if op in (Op.IDS, Op.AGGREGATE_IDS, Op.IN):
            return any(_equals(leaves, item) for item in value)
        if op is Op.NOT_IN:
            return not any(_equals(leaves, item) for item in value)
        if op is Op.DELETED:
            return _equals(leaves, value == DeletionState.DELETED)
        if op in (Op.EQ, Op.NE):
            if condition.options.ignore_case and isinstance(value, str):
                found = _regex(leaves, text_pattern(op, value), ignore_case=True)
            else:
                found = _equals(leaves, value)
            return found if op is Op.EQ else not found
        if op in _COMPARISON:
            return _compare(leaves, _COMPARISON[op], value)
        if op in (Op.CONTAINS, Op.STARTS_WITH, Op.ENDS_WITH):
            return _regex(leaves, text_pattern(op, value), condition.options.ignore_case)
        if op is Op.BETWEEN:
            low, high = value
            return _compare(leaves, "gte", low) and _compare(leaves, "lte", high)
        if op is Op.ALL_IN:
            return all(_equals(leaves, item) for item in value)
        if op is Op.ELEM_MATCH:
            return any(
                isinstance(element, dict)
                and all(
                    self.match(child, element, f"{path}.children[{i}]", top_level=False)
                    for i, child in enumerate(condition.children)
                )
                for leaf in leaves
                if isinstance(leaf, list)
                for element in leaf
            )
        if op is Op.NULL:
            return _equals(leaves, None)
        if op is Op.NOT_NULL:
            return not _equals(leaves, None)
        if op in (Op.TRUE, Op.FALSE):
            return _equals(leaves, op is Op.TRUE)
        if op is Op.EXISTS:
            return any(leaf is not MISSING for leaf in leaves) is bool(value)
        if op in DATE_OPERATORS:
            low, high = date_bounds(condition, self.now)
            return (low is None or _compare(leaves, "gte", low)) and _compare(leaves, "lt", high)
        raise ValueError(f"no evaluation for operator {op}")


def matches(
    condition: Condition, document: dict, *, field_map: dict[str, str] | None = None, now: datetime | None = None
) -> bool:
    """Whether ``document`` satisfies ``condition`` (see the module docstring for the rules).

    ``field_map`` and ``now`` mean what they mean for
    :func:`wow_django.backends.mongo.compiler.compile_filter`. Raises QueryValidationError
    for RAW conditions.
    """
    return _Evaluator(field_map, dates.resolve_now(now)).match(condition, document, "condition", top_level=True)


# --- projection ------------------------------------------------------------------------------

_LEAF: dict = {}


def _path_tree(paths: Iterable[str]) -> dict:
    tree: dict = {}
    for path in paths:
        node = tree
        segments = path.split(".")
        for segment in segments[:-1]:
            node = node.setdefault(segment, {})
        node[segments[-1]] = _LEAF
    return tree


def _include(value: Any, tree: dict) -> Any:
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():  # document order, as MongoDB returns it
            if key not in tree:
                continue
            if tree[key] is _LEAF:
                kept[key] = copy.deepcopy(item)
            else:
                projected = _include(item, tree[key])
                if projected is not MISSING:
                    kept[key] = projected
        return kept
    if isinstance(value, list):
        return [_include(item, tree) for item in value if isinstance(item, dict | list)]
    return MISSING


def _exclude(value: Any, tree: dict) -> None:
    if isinstance(value, dict):
        for key, sub in tree.items():
            if key not in value:
                continue
            if sub is _LEAF:
                del value[key]
            else:
                _exclude(value[key], sub)
    elif isinstance(value, list):
        for item in value:
            _exclude(item, tree)


def apply_projection(document: dict, projection: Projection, *, field_map: dict[str, str] | None = None) -> dict:
    """A copy of ``document`` with only the included fields (plus ``_id``) or without the excluded ones."""
    if projection.include:
        tree = _path_tree(map_field(path, field_map) for path in projection.include)
        tree.setdefault("_id", _LEAF)
        return _include(document, tree)
    result = copy.deepcopy(document)
    if projection.exclude:
        _exclude(result, _path_tree(map_field(path, field_map) for path in projection.exclude))
    return result


# --- sort --------------------------------------------------------------------------------------

# MongoDB's order of types when sorting (BSON comparison order).
_RANK_EMPTY_ARRAY, _RANK_NULL, _RANK_NUMBER, _RANK_STRING, _RANK_OBJECT, _RANK_ARRAY = range(6)
_RANK_BYTES, _RANK_OTHER, _RANK_BOOL, _RANK_DATE = range(6, 10)


def _sort_key(value: Any) -> tuple:
    if value is None or value is MISSING:
        return (_RANK_NULL,)
    if _is_number(value):
        return (_RANK_NUMBER, value)
    if isinstance(value, str):
        return (_RANK_STRING, value)
    if isinstance(value, dict):
        return (_RANK_OBJECT, tuple((key, _sort_key(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return (_RANK_ARRAY, tuple(_sort_key(item) for item in value))
    if isinstance(value, bytes):
        return (_RANK_BYTES, value)
    if isinstance(value, bool):
        return (_RANK_BOOL, value)
    if isinstance(value, datetime):
        return (_RANK_DATE, value.timestamp())
    return (_RANK_OTHER, str(value))


def _field_sort_key(document: dict, path: str, descending: bool) -> tuple:
    """An array sorts by its smallest element ascending and its largest descending; [] before null."""
    keys: list[tuple] = []
    for leaf in reach(document, path.split(".")):
        if isinstance(leaf, list):
            keys.extend(_sort_key(item) for item in leaf)
            if not leaf:
                keys.append((_RANK_EMPTY_ARRAY,))
        else:
            keys.append(_sort_key(leaf))
    return max(keys) if descending else min(keys)


def sort_documents(
    documents: Iterable[dict], sort: Iterable[SortField], *, field_map: dict[str, str] | None = None
) -> list[dict]:
    """``documents`` in ``sort`` order (MongoDB's type order; stable for ties)."""
    result = list(documents)
    for item in reversed(list(sort)):
        path = map_field(item.field, field_map)
        descending = item.direction is Direction.DESC
        result.sort(key=functools.partial(_field_sort_key, path=path, descending=descending), reverse=descending)
    return result


def evaluate(
    documents: Iterable[dict],
    condition: Condition,
    *,
    field_map: dict[str, str],
    projection: Projection,
    sort: Iterable[SortField],
    skip: int = 0,
    limit: int = 0,
    now: datetime | None = None,
) -> list[dict]:
    """The documents matching ``condition``, sorted, sliced and projected, with the Python evaluator.

    ``limit`` 0 means no limit. Documents are copied by the projection;
    the inputs are never changed.
    """
    moment = now or datetime.now(UTC)
    found = [doc for doc in documents if matches(condition, doc, field_map=field_map, now=moment)]
    found = sort_documents(found, sort, field_map=field_map)
    found = found[skip : skip + limit] if limit else found[skip:]
    return [apply_projection(doc, projection, field_map=field_map) for doc in found]


def count_matching(
    documents: Iterable[dict], condition: Condition, *, field_map: dict[str, str], now: datetime | None = None
) -> int:
    """How many of ``documents`` match ``condition`` (Python evaluator)."""
    moment = now or datetime.now(UTC)
    return sum(1 for doc in documents if matches(condition, doc, field_map=field_map, now=moment))

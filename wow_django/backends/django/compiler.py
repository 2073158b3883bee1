"""Compile parsed conditions and sorts for Django ORM querysets over a document table.

The django storage backend keeps one document per row: each top-level field of
the document is a column, and the fields holding JSON (a snapshot's ``state``,
a stream's ``header`` and ``body``) are ``JSONField`` columns. The caller
describes that table with ``columns``, a mapping from top-level document field
to :class:`Column` (model field name and kind), in document order::

    SNAPSHOT_COLUMNS = {"_id": Column("aggregate_id", Kind.STRING), ...,
                        "deleted": Column("deleted", Kind.BOOLEAN), "state": Column("state", Kind.JSON)}
    queryset.filter(compile_q(condition, columns=SNAPSHOT_COLUMNS, field_map={"id": "_id"}))
            .order_by(*compile_order_by(sort, columns=SNAPSHOT_COLUMNS, field_map={"id": "_id"}))

**One semantics: the evaluator's.** A condition selects exactly the rows whose
document :func:`wow_django.query.evaluator.matches` accepts, on SQLite and on
PostgreSQL: dotted paths walk into objects and, through an array, into each
element that is an object (a numeric segment also indexes the array); EQ, IN,
comparisons and text operators look at the value found and at the elements of
an array found; values are typed (``1`` is not ``"1"``, ``true`` is not
``1``, ``1`` is ``1.0``); GT and friends compare numbers with numbers and
strings with strings by code point; EQ null, NULL and IN with null also match
a missing field, and NE, NOT_IN, NOT_NULL are their exact negations; EXISTS
sees a field below any array element; BETWEEN and the date operators check
each bound on its own; ELEM_MATCH needs one array element (an object)
satisfying every child. ``ignoreCase`` compares case-insensitively, the date
operators use the bounds of :mod:`wow_django.query.dates` in ``zoneId`` (epoch
milliseconds, or text in ``datePattern``). MATCH is the evaluator's MATCH (no
text index on SQL): a row matches when one word (a run of letters, digits and
``_``, case-folded) of any string in the document, nested ones included, is a
word of the search text. RAW is refused (:class:`QueryValidationError` naming
the node): no SQL engine runs MongoDB filters.

How: columns holding scalars compile to plain lookups (``tenant_id = %s``,
``version > %s``, ``deleted = true``: indexes apply). Everything that reads a
JSON path compiles to a boolean expression rendered per engine
(``connection.vendor``); comparisons, text operators, null and type checks and
the logic between them are SQL on both engines:

* PostgreSQL walks paths in SQL: a run of non-numeric segments is one lax
  jsonpath member chain (``jsonb_path_query(state, 'lax $."a"."b"')``, which
  unwraps arrays one level and skips non-objects, as the evaluator walks), a
  numeric segment a lateral join (member, index, member of each object
  element); where a walk ends early (MISSING) is checked per prefix. Values
  compare as ``jsonb`` (typed; numerics), strings by code point
  (``COLLATE "C"``). Run these queries with ``jit = off``
  (:func:`wow_django.backends.django.queries.query_settings` does): the walks
  multiply the planner's row estimates and JIT compilation then costs seconds.
* SQLite's parser takes only about 14 nested subqueries (3.40), so the parts
  that nest are Python functions registered on the connection, built on the
  evaluator itself: the walk (``reach``, its values read back with
  ``json_each``), where it ends early, equality with an array or object, MATCH's
  words, and a whole ELEM_MATCH node. Text operators use the evaluator's
  regular expressions (:func:`wow_django.query.semantics.text_pattern`, input
  escaped by ``re.escape``) through Django's ``REGEXP`` function.

Client values only ever reach the database as bound parameters, path segments
included; on PostgreSQL text operators use ``strpos``/``starts_with``/``right``
or, for ``ignoreCase``, ``~*`` with every regex metacharacter escaped
(:func:`are_literal`).

**Limits** (SQL only; a :class:`QueryValidationError` before anything runs):
field paths of at most :data:`MAX_PATH_SEGMENTS` segments, and at most
:data:`MAX_QUERY_SIZE` for a condition or a sort (1 per node and value,
:data:`STEP_COST` per step through JSON): PostgreSQL plans a lateral join per
step, and unbounded paths exhausted a server's memory.

Where the engines cannot follow the evaluator (all documented in tests):

* **Sub-document equality ignores key order.** ``EQ {"a": 1, "b": 2}`` also
  matches ``{"b": 2, "a": 1}`` (MongoDB and the evaluator compare embedded
  documents field by field in order). PostgreSQL's ``jsonb`` does not keep key
  order, so no comparison can see it; SQLite does the same so that the django
  backend answers one way on both engines.
* **Case folding on PostgreSQL** (``ignoreCase``, MATCH) is the database's:
  ``~*`` under the database's default ``LC_CTYPE`` (Unicode-aware in a UTF-8
  database with a locale such as ``C.UTF-8`` or ``en_US.UTF-8``; ASCII-only
  when ``LC_CTYPE`` is ``C``). Python folds a few characters differently
  (``ß`` case-folds to ``ss`` for MATCH; the Kelvin sign, long s and similar
  have several case partners); SQLite runs Python's own rules.
* **Numbers on PostgreSQL compare as decimals** (``jsonb`` numerics), Python
  compares a float by its binary value: they differ only between an integer
  beyond 2**53 and a float next to it.
* **Sorting** follows the evaluator (MongoDB's type order: missing and null,
  numbers, strings, objects, arrays, booleans; an array sorts by its smallest
  element ascending and its largest descending, ``[]`` first) except that
  objects, and arrays inside arrays, sort by their type only, not by content:
  ties among them fall to the next sort key.

Only SQLite and PostgreSQL are supported; other engines raise
``NotSupportedError`` when the query is compiled to SQL.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time
from decimal import Decimal
from enum import StrEnum
from typing import Any

from django.db import NotSupportedError
from django.db.models import BooleanField, F, FloatField, IntegerField, Q, TextField
from django.db.models.expressions import Expression, OrderBy

from wow_django.domain.values import dumps as exact_json
from wow_django.query import dates
from wow_django.query.condition import (
    COMPARISON_OPERATORS,
    DATE_OPERATORS,
    NO_OPTIONS,
    TEXT_OPERATORS,
    Condition,
    DeletionState,
    Direction,
    Operator,
    Projection,
    SortField,
    parse_condition,
    target_field,
)
from wow_django.query.errors import QueryValidationError
from wow_django.query.evaluator import MISSING, matches, reach
from wow_django.query.semantics import date_bounds, map_field, search_terms, text_pattern, words

Op = Operator

RAW_REFUSAL = (
    "RAW conditions need the Mongo backend; SQL databases (the django backend) cannot run MongoDB filters"
)
INT64 = (-(2**63), 2**63 - 1)
# Resource limits (SQL only). MongoDB nests documents at most 100 levels deep, so no Wow document has a
# longer path. A query's size counts 1 per condition node and per value, and STEP_COST per step of each
# walk through JSON (one per run of non-numeric segments and one per numeric segment; a MISSING check
# walks every prefix of its path). PostgreSQL plans each step as a lateral join: measured, a size unit
# costs about 0.03 ms and 20 kB of server memory, so MAX_QUERY_SIZE keeps the largest query near 0.25 s
# and 200 MB (unbounded, a path of a thousand segments exhausted a server's memory).
MAX_PATH_SEGMENTS = 100
MAX_QUERY_SIZE = 8000
STEP_COST = 10
# An index segment beyond this cannot address an element (no engine holds arrays that long).
MAX_INDEX = 2**31 - 1


class Kind(StrEnum):
    """What a column holds."""

    STRING = "string"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class Column:
    """The model field holding one top-level document field."""

    name: str
    kind: Kind


Columns = Mapping[str, Column]


# --- the compiled form: a small tree, rendered to SQL per engine ------------------------------------


@dataclass(frozen=True, slots=True)
class _Const:
    value: bool


TRUE = _Const(True)
FALSE = _Const(False)


@dataclass(frozen=True, slots=True)
class _And:
    parts: tuple


@dataclass(frozen=True, slots=True)
class _Or:
    parts: tuple


@dataclass(frozen=True, slots=True)
class _Not:
    part: Any


@dataclass(frozen=True, slots=True)
class _Path:
    """``segments`` below a column (``column``) or below the current ELEM_MATCH element (``column`` None)."""

    column: Column | None
    segments: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Equals:
    values: tuple  # non-null JSON values; a candidate equal to any of them passes


@dataclass(frozen=True, slots=True)
class _IsNull:
    pass


@dataclass(frozen=True, slots=True)
class _Compare:
    op: str  # gt gte lt lte
    bound: int | float | str


@dataclass(frozen=True, slots=True)
class _Text:
    op: Operator  # CONTAINS STARTS_WITH ENDS_WITH, or EQ (whole string; with ignore_case only)
    text: str
    ignore_case: bool


@dataclass(frozen=True, slots=True)
class _Any:
    """Some candidate (a value the path leads to, or an element of an array it leads to) passes ``test``."""

    path: _Path
    test: Any


@dataclass(frozen=True, slots=True)
class _Missing:
    """The path ends early somewhere (the evaluator's MISSING among the leaves)."""

    path: _Path


@dataclass(frozen=True, slots=True)
class _Exists:
    """The path leads to at least one value."""

    path: _Path


@dataclass(frozen=True, slots=True)
class _ElemMatch:
    """A value the path leads to is an array with an object element satisfying ``child``.

    ``source`` is the condition as the client sent it (with the path relative to the column) and ``now``
    the moment its date operators use: SQLite runs that with the evaluator (see :class:`_SQLite`).
    """

    path: _Path
    child: Any
    source: str
    now: str


@dataclass(frozen=True, slots=True)
class _Words:
    """Some string of the document has a word among ``terms`` (MATCH)."""

    terms: tuple[str, ...]


def _and(parts: Iterable) -> Any:
    kept: list = []
    for part in parts:
        if part == FALSE:
            return FALSE
        if part == TRUE:
            continue
        kept.extend(part.parts if isinstance(part, _And) else [part])
    if not kept:
        return TRUE
    return kept[0] if len(kept) == 1 else _And(tuple(kept))


def _or(parts: Iterable) -> Any:
    kept: list = []
    for part in parts:
        if part == TRUE:
            return TRUE
        if part == FALSE:
            continue
        kept.extend(part.parts if isinstance(part, _Or) else [part])
    if not kept:
        return FALSE
    return kept[0] if len(kept) == 1 else _Or(tuple(kept))


def _not(part: Any) -> Any:
    if isinstance(part, _Const):
        return FALSE if part.value else TRUE
    if isinstance(part, _Not):
        return part.part
    return _Not(part)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _scalar_column(path: _Path) -> Column | None:
    """The column of ``path`` when it is a scalar one (not JSON), else None."""
    column = path.column
    return column if column is not None and column.kind is not Kind.JSON else None


def _always_missing(path: _Path) -> bool:
    """Whether nothing can be found there: a path below a scalar column (no such document field has no path)."""
    return _scalar_column(path) is not None and bool(path.segments)


def _as_integer(value: Any) -> int | None:
    """``value`` as an integer column holds it, or None when no integer equals it."""
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    return value if INT64[0] <= value <= INT64[1] else None


def _column_test(column: Column, test: Any) -> Any:
    """``test`` narrowed to what a scalar column can hold, or FALSE when nothing there can pass it."""
    kind = column.kind
    if isinstance(test, _IsNull):
        return test
    if isinstance(test, _Equals):
        kept: tuple[str | bool | int, ...]
        if kind is Kind.STRING:
            kept = tuple(dict.fromkeys(v for v in test.values if isinstance(v, str)))
        elif kind is Kind.BOOLEAN:
            kept = tuple(dict.fromkeys(v for v in test.values if isinstance(v, bool)))
        else:
            integers = (_as_integer(v) for v in test.values if _is_number(v))
            kept = tuple(dict.fromkeys(v for v in integers if v is not None))
        return _Equals(kept) if kept else FALSE
    if isinstance(test, _Compare):
        if kind is Kind.INTEGER and _is_number(test.bound) or kind is Kind.STRING and isinstance(test.bound, str):
            return test
        return FALSE
    if isinstance(test, _Text):
        return test if kind is Kind.STRING else FALSE
    raise TypeError(f"unknown test {test!r}")


def _any(path: _Path | None, test: Any) -> Any:
    if path is None or _always_missing(path):
        return FALSE
    column = _scalar_column(path)
    if column is not None:
        test = _column_test(column, test)
        if test == FALSE:
            return FALSE
    return _Any(path, test)


def _missing(path: _Path | None) -> Any:
    if path is None or _always_missing(path):
        return TRUE
    return _Missing(path) if path.segments else FALSE  # a column is always there


def _exists(path: _Path | None) -> Any:
    if path is None or _always_missing(path):
        return FALSE
    return _Exists(path) if path.segments else TRUE


def _elem_match(path: _Path | None, child: Any, condition: Condition, now: datetime) -> Any:
    if path is None or _always_missing(path) or _scalar_column(path) or child == FALSE:
        return FALSE
    relative = Condition(operator=Op.ELEM_MATCH, field=".".join(("r", *path.segments)),
                         children=condition.children)
    return _ElemMatch(path, child, exact_json(condition_data(relative)), now.isoformat())


_COMPARISON = {Op.GT: "gt", Op.LT: "lt", Op.GTE: "gte", Op.LTE: "lte"}


def check_path_length(path: str, where: str) -> None:
    if path.count(".") >= MAX_PATH_SEGMENTS:
        raise QueryValidationError(
            where, f"field paths have at most {MAX_PATH_SEGMENTS} segments on SQL databases "
                   f"(got {path.count('.') + 1}; documents nest at most {MAX_PATH_SEGMENTS} levels)")


def _walk_steps(segments: tuple[str, ...]) -> int:
    return len(_runs(segments))


def _missing_steps(segments: tuple[str, ...]) -> int:
    return sum(1 + _walk_steps(segments[:depth]) for depth in range(len(segments)))


def query_size(ir: Any) -> int:
    """What :data:`MAX_QUERY_SIZE` bounds (see there)."""
    if isinstance(ir, _And | _Or):
        return 1 + sum(query_size(part) for part in ir.parts)
    if isinstance(ir, _Not):
        return 1 + query_size(ir.part)
    if isinstance(ir, _Missing):
        return 1 + STEP_COST * _missing_steps(ir.path.segments)
    if isinstance(ir, _Any | _Exists | _ElemMatch):
        size = 1 + STEP_COST * _walk_steps(ir.path.segments)
        if isinstance(ir, _Any) and isinstance(ir.test, _Equals):
            size += len(ir.test.values)
        if isinstance(ir, _ElemMatch):
            size += query_size(ir.child)
        return size
    if isinstance(ir, _Words):
        return 1 + len(ir.terms)
    return 1


def check_query_size(size: int, where: str, what: str) -> None:
    if size > MAX_QUERY_SIZE:
        raise QueryValidationError(
            where, f"the {what} is too large for an SQL database: size {size}, at most {MAX_QUERY_SIZE} "
                   f"(each condition and value counts 1, each step through JSON {STEP_COST}; long field paths "
                   "and their numeric segments take the most steps)")


def _lite_number(value: Any) -> Any:
    """A number as SQLite binds it: its JSON numbers with a fraction are REALs, so a Decimal compares as a float."""
    return float(value) if isinstance(value, Decimal) else value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, time):  # BEFORE_TODAY's time of day, as Wow's text form
        return value.isoformat()
    return value


def condition_data(condition: Condition) -> dict:
    """``condition`` back in the client's JSON form (what :func:`parse_condition` reads)."""
    data: dict[str, Any] = {"operator": condition.operator.value}
    if condition.field:
        data["field"] = condition.field
    if condition.value is not None:
        data["value"] = _plain(condition.value)
    if condition.children:
        data["children"] = [condition_data(child) for child in condition.children]
    options = {"ignoreCase": condition.options.ignore_case or None,
               "zoneId": None if condition.options.zone_id == NO_OPTIONS.zone_id else condition.options.zone_id,
               "datePattern": condition.options.date_pattern}
    options = {key: value for key, value in options.items() if value is not None}
    if options:
        data["options"] = options
    return data


class _Compiler:
    """Condition -> the tree above, node by node as the evaluator decides."""

    def __init__(self, columns: Columns, field_map: dict[str, str] | None, now: datetime):
        self.columns = columns
        self.field_map = field_map or {}
        self.now = now

    def path(self, condition: Condition, in_element: bool, node: str) -> _Path | None:
        name = target_field(condition)
        check_path_length(name, f"{node}.field")
        if in_element:
            return _Path(None, tuple(name.split(".")))
        head, *rest = map_field(name, self.field_map).split(".")
        column = self.columns.get(head)
        return None if column is None else _Path(column, tuple(rest))

    def equals(self, path: _Path | None, value: Any) -> Any:
        if value is None:
            return _or([_missing(path), _any(path, _IsNull())])
        return _any(path, _Equals((value,)))

    def equals_any(self, path: _Path | None, values: Iterable[Any]) -> Any:
        values = list(values)
        parts = []
        present = tuple(v for v in values if v is not None)
        if present:
            parts.append(_any(path, _Equals(present)))
        if len(present) < len(values):
            parts.append(self.equals(path, None))
        return _or(parts)

    def compile(self, condition: Condition, node: str, in_element: bool) -> Any:
        op = condition.operator
        value = condition.value

        if op is Op.ALL:
            return TRUE
        if op in (Op.AND, Op.OR, Op.NOR):
            parts = [self.compile(child, f"{node}.children[{i}]", in_element)
                     for i, child in enumerate(condition.children)]
            if op is Op.AND:
                return _and(parts)
            return _or(parts) if op is Op.OR else _not(_or(parts))
        if op is Op.MATCH:
            if in_element:  # the parser refuses it; never compile it against an element
                raise QueryValidationError(node, "MATCH cannot be used inside ELEM_MATCH")
            terms = search_terms(value)
            return _Words(tuple(sorted(terms))) if terms else FALSE
        if op is Op.RAW:
            raise QueryValidationError(node, RAW_REFUSAL)
        if op is Op.DELETED and value == DeletionState.ALL:
            return TRUE

        path = self.path(condition, in_element, node)
        if op in (Op.ID, Op.AGGREGATE_ID, Op.TENANT_ID, Op.OWNER_ID):
            return self.equals(path, value)
        if op in (Op.IDS, Op.AGGREGATE_IDS, Op.IN):
            return self.equals_any(path, value)
        if op is Op.NOT_IN:
            return _not(self.equals_any(path, value))
        if op is Op.DELETED:
            return self.equals(path, value == DeletionState.DELETED)
        if op in (Op.EQ, Op.NE):
            if condition.options.ignore_case and isinstance(value, str):
                found = _any(path, _Text(Op.EQ, value, ignore_case=True))
            else:
                found = self.equals(path, value)
            return found if op is Op.EQ else _not(found)
        if op in COMPARISON_OPERATORS:
            return _any(path, _Compare(_COMPARISON[op], value))
        if op in TEXT_OPERATORS:
            return _any(path, _Text(op, value, condition.options.ignore_case))
        if op is Op.BETWEEN:
            low, high = value
            return _and([_any(path, _Compare("gte", low)), _any(path, _Compare("lte", high))])
        if op is Op.ALL_IN:
            return _and([self.equals(path, item) for item in value])
        if op is Op.ELEM_MATCH:
            child = _and(self.compile(c, f"{node}.children[{i}]", True) for i, c in enumerate(condition.children))
            return _elem_match(path, child, condition, self.now)
        if op is Op.NULL:
            return self.equals(path, None)
        if op is Op.NOT_NULL:
            return _not(self.equals(path, None))
        if op in (Op.TRUE, Op.FALSE):
            return self.equals(path, op is Op.TRUE)
        if op is Op.EXISTS:
            found = _exists(path)
            return found if value else _not(found)
        if op in DATE_OPERATORS:
            low, high = date_bounds(condition, self.now)
            parts = [] if low is None else [_any(path, _Compare("gte", low))]
            parts.append(_any(path, _Compare("lt", high)))
            return _and(parts)
        raise ValueError(f"no ORM translation for operator {op}")


# --- SQL text with parameters -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _P:
    """A bound parameter."""

    value: Any


def _sql(*parts: Any) -> tuple[str, list]:
    """Join literal SQL (str), parameters (_P) and fragments ((text, params)) in text order."""
    text: list[str] = []
    params: list = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
        elif isinstance(part, _P):
            text.append("%s")
            params.append(part.value)
        else:
            text.append(part[0])
            params.extend(part[1])
    return "".join(text), params


def _join(separator: str, fragments: list[tuple[str, list]]) -> tuple[str, list]:
    parts: list = []
    for i, fragment in enumerate(fragments):
        if i:
            parts.append(separator)
        parts.append(fragment)
    return _sql(*parts)


def _runs(segments: tuple[str, ...]) -> list:
    """``segments`` as runs of non-numeric segments (tuples) and single numeric segments (str)."""
    runs: list = []
    for segment in segments:
        if segment.isdigit():
            runs.append(segment)
        elif runs and isinstance(runs[-1], tuple):
            runs[-1] = (*runs[-1], segment)
        else:
            runs.append((segment,))
    return runs


def _index(segment: str) -> int | None:
    """The array index a path segment also names, if any (as the evaluator: ``segment.isdigit()``)."""
    if segment.isdigit() and int(segment) <= MAX_INDEX:
        return int(segment)
    return None


# Regular-expression metacharacters of PostgreSQL's advanced regular expressions. A backslash before
# any other non-alphanumeric character also means the character itself, but letters must stay bare.
_ARE_SPECIAL = frozenset("\\^$.[]|()?*+{}")


def are_literal(text: str) -> str:
    """``text`` as a PostgreSQL (ARE) regular expression matching exactly that text."""
    return "".join("\\" + char if char in _ARE_SPECIAL else char for char in text)


def are_text_pattern(operator: Operator, text: str) -> str:
    """The PostgreSQL counterpart of :func:`wow_django.query.semantics.text_pattern`."""
    escaped = are_literal(text)
    if operator is Op.CONTAINS:
        return escaped
    if operator is Op.STARTS_WITH:
        return "^" + escaped
    if operator is Op.ENDS_WITH:
        return escaped + "$"
    if operator in (Op.EQ, Op.NE):
        return "^" + escaped + "$"
    raise ValueError(f"{operator} is not a text operator")


def are_words_pattern(terms: Iterable[str]) -> str:
    """A PostgreSQL regular expression finding any of ``terms`` as a whole word."""
    alternatives = "|".join(are_literal(term) for term in terms)
    return f"(^|[^[:alnum:]_])({alternatives})($|[^[:alnum:]_])"


SQLITE_WORDS_FUNCTION = "wow_query_words_match"
SQLITE_JSON_EQUALS_FUNCTION = "wow_query_json_equals"
SQLITE_REACH_FUNCTION = "wow_query_reach"
SQLITE_MISSING_FUNCTION = "wow_query_missing"
SQLITE_ELEM_MATCH_FUNCTION = "wow_query_elem_match"


@dataclass(frozen=True, slots=True)
class _LiteNode:
    """A JSON value on SQLite: its ``json_type``, its SQL value, and (objects and arrays) its JSON text."""

    t: str
    v: str
    j: str | None = None


@dataclass(frozen=True, slots=True)
class _PgNode:
    """A JSON value on PostgreSQL: a ``jsonb`` expression."""

    j: str


class _SQLite:
    """SQLite: paths are walked by the evaluator's own ``reach`` (a registered function returning the values
    found as a JSON array, read back with ``json_each``), so the SQL stays flat whatever the nesting."""

    vendor = "sqlite"
    NUMBER_TYPES = "('integer','real')"

    def column_node(self, sql: str, kind: Kind) -> _LiteNode:
        if kind is Kind.JSON:
            return _LiteNode(f"COALESCE(json_type({sql}), 'null')", f"json_extract({sql}, '$')", sql)
        if kind is Kind.BOOLEAN:
            return _LiteNode(f"(CASE WHEN {sql} IS NULL THEN 'null' WHEN {sql} THEN 'true' ELSE 'false' END)", sql)
        name = "text" if kind is Kind.STRING else "integer"
        return _LiteNode(f"(CASE WHEN {sql} IS NULL THEN 'null' ELSE '{name}' END)", sql)

    def element_node(self, alias: str) -> _LiteNode:
        return _LiteNode(f"{alias}.type", f"{alias}.value", f"{alias}.value")

    def walk(self, root: _LiteNode, segments: tuple[str, ...], mode: str, alias: str) -> tuple[str, list]:
        """A FROM item: rows (``type``, ``value``) for the leaves (or candidates) ``segments`` lead to."""
        return _sql(f"json_each({SQLITE_REACH_FUNCTION}({root.j}, ", _P(json.dumps(segments)), ", ", _P(mode),
                    f")) AS {alias}")

    def exists_over(self, root: _LiteNode, segments: tuple[str, ...], mode: str, body, fresh) -> tuple[str, list]:
        alias = fresh("l")
        return _sql("EXISTS (SELECT 1 FROM ", self.walk(root, segments, mode, alias), " WHERE ",
                    body(self.element_node(alias)), ")")

    def missing(self, root: _LiteNode, segments: tuple[str, ...], fresh) -> tuple[str, list]:
        return _sql(f"COALESCE({SQLITE_MISSING_FUNCTION}({root.j}, ", _P(json.dumps(segments)), "), TRUE)")

    def elem_match(self, root: _LiteNode, source: str, now: str) -> tuple[str, list]:
        # Nested subqueries per ELEM_MATCH level would overflow SQLite's parser stack (about 14 nested
        # subqueries in SQLite 3.40): the evaluator decides the node, in one flat call.
        return _sql(f"COALESCE({SQLITE_ELEM_MATCH_FUNCTION}({root.j}, ", _P(source), ", ", _P(now), "), FALSE)")

    def elements(self, n: _LiteNode, alias: str) -> str:
        return f"json_each(CASE WHEN {n.t} = 'array' THEN {n.v} END) AS {alias}"

    def equals(self, n: _LiteNode, values: tuple, fresh) -> tuple[str, list]:
        parts: list[tuple[str, list]] = []
        numbers = [v for v in values if _is_number(v)]
        strings = [v for v in values if isinstance(v, str)]
        if numbers:
            parts.append(_sql(f"({n.t} IN {self.NUMBER_TYPES} AND {n.v} IN (", _join(", ", [_sql(_P(_lite_number(v))) for v in numbers]),
                              "))"))
        if strings:
            parts.append(_sql(f"({n.t} = 'text' AND {n.v} COLLATE BINARY IN (",
                              _join(", ", [_sql(_P(v)) for v in strings]), "))"))
        for flag in (True, False):
            if any(v is flag for v in values):
                parts.append(_sql(f"({n.t} = '{'true' if flag else 'false'}')"))
        for value in values:
            if isinstance(value, list | tuple | dict):
                # Arrays and objects compare in Python (one flat call, whatever the nesting): see _json_equal.
                parts.append(_sql(f"({n.t} IN ('array','object') AND {SQLITE_JSON_EQUALS_FUNCTION}({n.v}, ",
                                  _P(exact_json(value)), "))"))
        return _sql("(", _join(" OR ", parts), ")") if parts else ("FALSE", [])

    def is_null(self, n: _LiteNode) -> tuple[str, list]:
        return _sql(f"({n.t} = 'null')")

    def compare(self, n: _LiteNode, op: str, bound: Any) -> tuple[str, list]:
        symbol = _SYMBOLS[op]
        if isinstance(bound, str):
            return _sql(f"({n.t} = 'text' AND {n.v} COLLATE BINARY {symbol} ", _P(bound), ")")
        return _sql(f"({n.t} IN {self.NUMBER_TYPES} AND {n.v} {symbol} ", _P(_lite_number(bound)), ")")

    def text(self, n: _LiteNode, test: _Text) -> tuple[str, list]:
        # Django registers REGEXP (Python's re.search) on every SQLite connection: the evaluator's own
        # pattern, escaped by re.escape, runs with the evaluator's own rules.
        pattern = text_pattern(test.op, test.text)
        if test.ignore_case:
            pattern = "(?i)" + pattern
        return _sql(f"({n.t} = 'text' AND {n.v} REGEXP ", _P(pattern), ")")

    def words(self, strings: list[str], documents: list[str], terms: tuple[str, ...], fresh) -> tuple[str, list]:
        encoded = json.dumps(list(terms))
        parts = [_sql(f"COALESCE({SQLITE_WORDS_FUNCTION}({sql}, ", _P(encoded), "), FALSE)") for sql in strings]
        for sql in documents:
            w = fresh("w")
            parts.append(_sql(f"EXISTS (SELECT 1 FROM json_tree({sql}) AS {w} WHERE {w}.type = 'text' AND "
                              f"{SQLITE_WORDS_FUNCTION}({w}.atom, ", _P(encoded), "))"))
        return _sql("(", _join(" OR ", parts), ")") if parts else ("FALSE", [])

    # --- sort keys ---
    def leaves_select(self, root: _LiteNode, segments: tuple[str, ...], fresh) -> tuple[str, list]:
        if not segments:
            return _sql(f"SELECT {root.t} AS t, {root.v} AS v")
        alias = fresh("l")
        return _sql(f"SELECT {alias}.type AS t, {alias}.value AS v FROM ", self.walk(root, segments, "leaves", alias))

    def sort_keys(self, root, segments: tuple[str, ...], missing: tuple[str, list] | None, fresh) -> tuple[str, list]:
        """SELECT r, num, str, b: the sort keys of every leaf (array leaves: of each element; [] ranks 0)."""
        leaf, e = fresh("l"), fresh("e")
        kt = f"(CASE WHEN {leaf}.t = 'array' THEN COALESCE({e}.type, 'empty') ELSE {leaf}.t END)"
        kv = f"(CASE WHEN {leaf}.t = 'array' THEN {e}.value ELSE {leaf}.v END)"
        rank = (f"(CASE {kt} WHEN 'empty' THEN 0 WHEN 'null' THEN 1 WHEN 'integer' THEN 2 WHEN 'real' THEN 2 "
                f"WHEN 'text' THEN 3 WHEN 'object' THEN 4 WHEN 'array' THEN 5 ELSE 8 END)")
        select = _sql(
            f"SELECT {rank} AS r, (CASE WHEN {kt} IN {self.NUMBER_TYPES} THEN {kv} END) AS num, "
            f"(CASE WHEN {kt} = 'text' THEN {kv} END) AS str, "
            f"(CASE {kt} WHEN 'true' THEN 1 WHEN 'false' THEN 0 END) AS b "
            f"FROM (", self.leaves_select(root, segments, fresh), f") AS {leaf} "
            f"LEFT JOIN json_each(CASE WHEN {leaf}.t = 'array' THEN {leaf}.v END) AS {e}",
        )
        if missing is None:
            return select
        return _sql(select, " UNION ALL SELECT 1, NULL, NULL, NULL WHERE ", missing)

    def sort_aggregate(self, part: str, descending: bool, k: str) -> str:
        pick = "max" if descending else "min"
        rank = f"{pick}({k}.r)"
        if part == "rank":
            return rank
        column, wanted = {"number": ("num", 2), "string": ("str", 3), "boolean": ("b", 8)}[part]
        value = f"{pick}({k}.{column})" if part != "string" else f"{pick}({k}.str COLLATE BINARY)"
        return f"CASE WHEN {rank} = {wanted} THEN {value} END"


class _Postgres:
    vendor = "postgresql"

    def column_node(self, sql: str, kind: Kind) -> _PgNode:
        if kind is Kind.JSON:
            return _PgNode(f"COALESCE({sql}, 'null'::jsonb)")
        return _PgNode(f"COALESCE(to_jsonb({sql}), 'null'::jsonb)")

    def alias_node(self, alias: str) -> _PgNode:
        return _PgNode(f"{alias}.v")

    element_node = alias_node

    def leaves(self, root: _PgNode, segments: tuple[str, ...], fresh) -> tuple[str, list]:
        """SELECT v: every value ``segments`` lead to from ``root`` (the evaluator's ``reach``).

        A run of non-numeric segments is one lax jsonpath member chain (``lax $."a"."b"``): lax member
        access takes the member of an object and, of an array, the member of each element that is an
        object, which is the evaluator's walk. A numeric segment is a lateral step of its own: the member
        of an object; of an array, the element at that index and the member of each object element.
        """
        start = fresh("a")
        sources: list = [f"(SELECT {root.j} AS v) AS {start}"]
        previous = start
        for run in _runs(segments):
            step = fresh("a")
            prev = f"{previous}.v"
            if isinstance(run, tuple):
                path = "lax $" + "".join(f'."{segment}"' for segment in run)  # segments are [A-Za-z0-9_]
                sources += [f" CROSS JOIN LATERAL jsonb_path_query({prev}, ", _P(path), f"::jsonpath) AS {step}(v)"]
            else:
                found, element = fresh("x"), fresh("e")
                branches = [_sql(f"SELECT {prev} -> ", _P(run), "::text AS v")]
                index = _index(run)
                if index is not None:
                    # jsonb keeps a top-level scalar as a one-element array: only index real arrays.
                    branches.append(_sql(f"SELECT CASE WHEN jsonb_typeof({prev}) = 'array' THEN {prev} -> ",
                                         _P(index), "::int END AS v"))
                branches += [
                    _sql(f"SELECT {element}.v -> ", _P(run), "::text AS v FROM jsonb_array_elements("
                         f"CASE WHEN jsonb_typeof({prev}) = 'array' THEN {prev} END) AS {element}(v)"),
                ]
                sources += [f" CROSS JOIN LATERAL (SELECT {found}.v AS v FROM (", _join(" UNION ALL ", branches),
                            f") AS {found} WHERE {found}.v IS NOT NULL) AS {step}"]
            previous = step
        return _sql(f"SELECT {previous}.v AS v FROM ", *sources)

    @staticmethod
    def array_elements(n: _PgNode, alias: str) -> str:
        return f"jsonb_array_elements(CASE WHEN jsonb_typeof({n.j}) = 'array' THEN {n.j} END) AS {alias}(v)"

    def step_missing(self, n: _PgNode, segment: str, fresh) -> tuple[str, list]:
        c1, c2 = fresh("c"), fresh("c")
        index = _index(segment)
        no_hit = [] if index is None else [f" AND ({n.j} -> ", _P(index), "::int) IS NULL"]
        return _sql(
            f"(CASE jsonb_typeof({n.j}) WHEN 'object' THEN ({n.j} -> ", _P(segment), "::text) IS NULL",
            f" WHEN 'array' THEN ((NOT EXISTS (SELECT 1 FROM {self.array_elements(n, c1)} "
            f"WHERE jsonb_typeof({c1}.v) = 'object')", *no_hit, ")",
            f" OR EXISTS (SELECT 1 FROM {self.array_elements(n, c2)} WHERE jsonb_typeof({c2}.v) = 'object' "
            f"AND ({c2}.v -> ", _P(segment), "::text) IS NULL))",
            " ELSE TRUE END)",
        )

    def elements(self, n: _PgNode, alias: str) -> str:
        return self.array_elements(n, alias)

    def exists_over(self, root: _PgNode, segments: tuple[str, ...], mode: str, body, fresh) -> tuple[str, list]:
        alias = fresh("l")
        node = self.alias_node(alias)
        test = body(node)
        if mode == "candidates":
            e = fresh("e")
            test = _sql("(", test, " OR EXISTS (SELECT 1 FROM ", self.elements(node, e), " WHERE ",
                        body(self.element_node(e)), "))")
        return _sql("EXISTS (SELECT 1 FROM (", self.leaves(root, segments, fresh), f") AS {alias} WHERE ", test, ")")

    def missing(self, root: _PgNode, segments: tuple[str, ...], fresh) -> tuple[str, list]:
        """Whether walking ``segments`` ends early somewhere: a value reached after some segments has no
        next step (the evaluator's MISSING among the leaves)."""
        parts = []
        for depth, segment in enumerate(segments):
            if depth == 0:
                parts.append(self.step_missing(root, segment, fresh))
                continue
            alias = fresh("l")
            step = self.step_missing(self.alias_node(alias), segment, fresh)
            parts.append(_sql("EXISTS (SELECT 1 FROM (", self.leaves(root, segments[:depth], fresh), f") AS {alias} "
                              "WHERE ", step, ")"))
        return _sql("(", _join(" OR ", parts), ")") if parts else ("FALSE", [])

    def is_type(self, n: _PgNode, kind: str) -> str:
        return f"(jsonb_typeof({n.j}) = '{kind}')"

    def equals(self, n: _PgNode, values: tuple, fresh) -> tuple[str, list]:
        # jsonb equality: typed, numbers as numerics, arrays in order, objects in any key order.
        params = [_sql(_P(exact_json(value)), "::jsonb") for value in values]
        return _sql(f"({n.j} IN (", _join(", ", params), "))")

    def is_null(self, n: _PgNode) -> tuple[str, list]:
        return _sql(f"(jsonb_typeof({n.j}) = 'null')")

    def compare(self, n: _PgNode, op: str, bound: Any) -> tuple[str, list]:
        symbol = _SYMBOLS[op]
        if isinstance(bound, str):
            return _sql(f"(jsonb_typeof({n.j}) = 'string' AND ({n.j} #>> '{{}}') COLLATE \"C\" {symbol} ",
                        _P(bound), ")")
        return _sql(f"(jsonb_typeof({n.j}) = 'number' AND {n.j} {symbol} ", _P(exact_json(bound)), "::jsonb)")

    def text(self, n: _PgNode, test: _Text) -> tuple[str, list]:
        value = f"({n.j} #>> '{{}}')"
        if test.ignore_case:
            # The database's case rules (LC_CTYPE); "default" undoes a column's "C" collation.
            check = _sql(f"{value} COLLATE \"default\" ~* ", _P(are_text_pattern(test.op, test.text)))
        elif not test.text:
            check = ("TRUE", [])
        elif test.op is Op.CONTAINS:
            check = _sql(f"strpos({value}, ", _P(test.text), ") > 0")
        elif test.op is Op.STARTS_WITH:
            check = _sql(f"starts_with({value}, ", _P(test.text), ")")
        else:
            check = _sql(f"right({value}, ", _P(len(test.text)), ") = ", _P(test.text))
        return _sql(f"(jsonb_typeof({n.j}) = 'string' AND ", check, ")")

    def words(self, strings: list[str], documents: list[str], terms: tuple[str, ...], fresh) -> tuple[str, list]:
        pattern = are_words_pattern(terms)
        parts = [_sql(f"COALESCE({sql} COLLATE \"default\" ~* ", _P(pattern), ", FALSE)") for sql in strings]
        for sql in documents:
            w = fresh("w")
            parts.append(_sql(f"EXISTS (SELECT 1 FROM jsonb_path_query({sql}, 'strict $.**') AS {w}(v) WHERE "
                              f"jsonb_typeof({w}.v) = 'string' AND ({w}.v #>> '{{}}') ~* ", _P(pattern), ")"))
        return _sql("(", _join(" OR ", parts), ")") if parts else ("FALSE", [])

    def sort_keys(self, root, segments: tuple[str, ...], missing: tuple[str, list] | None, fresh) -> tuple[str, list]:
        """SELECT r, num, str, b: the sort keys of every leaf (array leaves: of each element; [] ranks 0)."""
        leaves = self.leaves(root, segments, fresh)
        leaf, e = fresh("l"), fresh("e")
        kt = (f"(CASE WHEN jsonb_typeof({leaf}.v) = 'array' THEN COALESCE(jsonb_typeof({e}.v), 'empty') "
              f"ELSE jsonb_typeof({leaf}.v) END)")
        kv = f"(CASE WHEN jsonb_typeof({leaf}.v) = 'array' THEN {e}.v ELSE {leaf}.v END)"
        rank = (f"(CASE {kt} WHEN 'empty' THEN 0 WHEN 'null' THEN 1 WHEN 'number' THEN 2 WHEN 'string' THEN 3 "
                f"WHEN 'object' THEN 4 WHEN 'array' THEN 5 ELSE 8 END)")
        select = _sql(
            f"SELECT {rank} AS r, (CASE WHEN {kt} = 'number' THEN ({kv})::numeric END) AS num, "
            f"(CASE WHEN {kt} = 'string' THEN ({kv} #>> '{{}}') END) AS str, "
            f"(CASE WHEN {kt} = 'boolean' THEN ({kv})::boolean END) AS b "
            f"FROM (", leaves, f") AS {leaf} LEFT JOIN LATERAL jsonb_array_elements(CASE WHEN "
            f"jsonb_typeof({leaf}.v) = 'array' THEN {leaf}.v END) AS {e}(v) ON TRUE",
        )
        if missing is None:
            return select
        return _sql(select, " UNION ALL SELECT 1, NULL, NULL, NULL WHERE ", missing)

    def sort_aggregate(self, part: str, descending: bool, k: str) -> str:
        pick = "max" if descending else "min"
        rank = f"{pick}({k}.r)"
        if part == "rank":
            return rank
        if part == "number":
            return f"CASE WHEN {rank} = 2 THEN {pick}({k}.num) END"
        if part == "string":
            return f"CASE WHEN {rank} = 3 THEN {pick}({k}.str COLLATE \"C\") END"
        return f"CASE WHEN {rank} = 8 THEN {'bool_or' if descending else 'bool_and'}({k}.b) END"


_SYMBOLS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_DIALECTS = {"sqlite": _SQLite(), "postgresql": _Postgres()}


def _dialect(connection):
    try:
        return _DIALECTS[connection.vendor]
    except KeyError:
        raise NotSupportedError(
            f"wow_django compiles queries for SQLite and PostgreSQL only, not for {connection.vendor}"
        ) from None


def _sqlite_words_match(text: Any, terms_json: Any) -> int | None:
    if not isinstance(text, str) or not isinstance(terms_json, str):
        return None
    terms = _decoded_terms(terms_json)
    return int(any(word in terms for word in words(text)))


_TERMS_CACHE: dict[str, frozenset[str]] = {}


def _decoded_terms(terms_json: str) -> frozenset[str]:
    terms = _TERMS_CACHE.get(terms_json)
    if terms is None:
        if len(_TERMS_CACHE) > 256:
            _TERMS_CACHE.clear()
        terms = _TERMS_CACHE[terms_json] = frozenset(json.loads(terms_json))
    return terms


def _json_equal(left: Any, right: Any) -> bool:
    """JSON equality as the ORM compiler defines it: typed, numbers across int/float, objects in any key order."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if _is_number(left) and _is_number(right):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right, strict=True))
    return type(left) is type(right) and left == right


def _sqlite_json_equals(stored: Any, expected_json: Any) -> int | None:
    if not isinstance(stored, str) or not isinstance(expected_json, str):
        return None
    try:
        value = json.loads(stored)
    except ValueError:
        return 0
    return int(_json_equal(value, json.loads(expected_json)))


@functools.lru_cache(maxsize=512)
def _segments(segments_json: str) -> tuple[str, ...]:
    return tuple(json.loads(segments_json))


def _loaded(document_json: Any) -> Any:
    return None if document_json is None else json.loads(document_json)


def _sqlite_reach(document_json: Any, segments_json: Any, mode: Any) -> str | None:
    """The values ``segments`` lead to in the JSON document (the evaluator's ``reach``, MISSING left out)
    as a JSON array; mode "candidates" adds the elements of arrays found."""
    if segments_json is None:
        return None
    found: list = []
    for leaf in reach(_loaded(document_json), _segments(segments_json)):
        if leaf is MISSING:
            continue
        found.append(leaf)
        if mode == "candidates" and isinstance(leaf, list):
            found.extend(leaf)
    return json.dumps(found)


def _sqlite_missing(document_json: Any, segments_json: Any) -> int | None:
    if segments_json is None:
        return None
    return int(any(leaf is MISSING for leaf in reach(_loaded(document_json), _segments(segments_json))))


@functools.lru_cache(maxsize=256)
def _parsed(condition_json: str) -> Condition:
    return parse_condition(json.loads(condition_json), max_depth=10_000)


def _sqlite_elem_match(document_json: Any, condition_json: Any, now: Any) -> int | None:
    """The ELEM_MATCH condition (its field relative to ``r``, the column) on the column's JSON document."""
    if not isinstance(condition_json, str) or not isinstance(now, str):
        return None
    return int(matches(_parsed(condition_json), {"r": _loaded(document_json)}, now=datetime.fromisoformat(now)))


def _ensure_sqlite_functions(connection) -> None:
    """Register the compiler's functions on this SQLite connection (once per underlying connection).

    Django registers its own (REGEXP among them) when it opens a connection;
    these are added the first time a condition is compiled for it.
    """
    connection.ensure_connection()
    raw = connection.connection
    if getattr(connection, "_wow_query_functions", None) is not raw:
        raw.create_function(SQLITE_WORDS_FUNCTION, 2, _sqlite_words_match, deterministic=True)
        raw.create_function(SQLITE_JSON_EQUALS_FUNCTION, 2, _sqlite_json_equals, deterministic=True)
        raw.create_function(SQLITE_REACH_FUNCTION, 3, _sqlite_reach, deterministic=True)
        raw.create_function(SQLITE_MISSING_FUNCTION, 2, _sqlite_missing, deterministic=True)
        raw.create_function(SQLITE_ELEM_MATCH_FUNCTION, 3, _sqlite_elem_match, deterministic=True)
        connection._wow_query_functions = raw


# --- rendering ---------------------------------------------------------------------------------------


class _Renderer:
    """Renders compiled conditions and sort keys for one connection; column SQL from the query compiler."""

    def __init__(self, connection, column_sql: dict[str, str], columns: Columns):
        self.d = _dialect(connection)
        self.connection = connection
        self.column_sql = column_sql
        self.columns = columns
        self.counter = 0
        self.elements: list = []

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"wq{prefix}{self.counter}"

    def root(self, path: _Path):
        if path.column is None:
            return self.elements[-1]
        return self.d.column_node(self.column_sql[path.column.name], path.column.kind)

    def over(self, path: _Path, mode: str, body: Callable[[Any], tuple[str, list]]) -> tuple[str, list]:
        """``body`` holds for some leaf (``mode`` "leaves") or candidate ("candidates": a leaf, or an element
        of an array leaf) of ``path``."""
        root = self.root(path)
        if path.segments:
            return self.d.exists_over(root, path.segments, mode, body, self.fresh)
        if mode == "leaves" or _scalar_column(path):
            return body(root)
        alias = self.fresh("e")
        return _sql("(", body(root), " OR EXISTS (SELECT 1 FROM ", self.d.elements(root, alias), " WHERE ",
                    body(self.d.element_node(alias)), "))")

    def test(self, node, test: Any) -> tuple[str, list]:
        if isinstance(test, _Equals):
            return self.d.equals(node, test.values, self.fresh)
        if isinstance(test, _IsNull):
            return self.d.is_null(node)
        if isinstance(test, _Compare):
            return self.d.compare(node, test.op, test.bound)
        if isinstance(test, _Text):
            return self.d.text(node, test)
        raise TypeError(f"unknown test {test!r}")

    def condition(self, ir: Any) -> tuple[str, list]:
        if isinstance(ir, _Const):
            return ("TRUE", []) if ir.value else ("FALSE", [])
        if isinstance(ir, _And | _Or):
            word = " AND " if isinstance(ir, _And) else " OR "
            return _sql("(", _join(word, [self.condition(part) for part in ir.parts]), ")")
        if isinstance(ir, _Not):
            return _sql("NOT (", self.condition(ir.part), ")")
        if isinstance(ir, _Any):
            return self.over(ir.path, "candidates", lambda node: self.test(node, ir.test))
        if isinstance(ir, _Exists):
            return self.over(ir.path, "leaves", lambda node: ("TRUE", []))
        if isinstance(ir, _Missing):
            return self.d.missing(self.root(ir.path), ir.path.segments, self.fresh)
        if isinstance(ir, _ElemMatch):
            if self.d.vendor == "sqlite":
                return self.d.elem_match(self.root(ir.path), ir.source, ir.now)
            return self.over(ir.path, "leaves", lambda node: self.elem_match(node, ir.child))
        if isinstance(ir, _Words):
            strings = [self.column_sql[c.name] for c in self.columns.values() if c.kind is Kind.STRING]
            documents = [self.column_sql[c.name] for c in self.columns.values() if c.kind is Kind.JSON]
            return self.d.words(strings, documents, ir.terms, self.fresh)
        raise TypeError(f"unknown condition {ir!r}")

    def elem_match(self, node, child: Any) -> tuple[str, list]:
        alias = self.fresh("m")
        element = self.d.element_node(alias)
        self.elements.append(element)
        try:
            inner = self.condition(child)
        finally:
            self.elements.pop()
        return _sql(self.d.is_type(node, "array"), " AND EXISTS (SELECT 1 FROM ", self.d.elements(node, alias),
                    " WHERE ", self.d.is_type(element, "object"), " AND ", inner, ")")


def _column_names(ir: Any, columns: Columns) -> list[str]:
    found: dict[str, None] = {}

    def visit(node: Any) -> None:
        if isinstance(node, _And | _Or):
            for part in node.parts:
                visit(part)
        elif isinstance(node, _Not):
            visit(node.part)
        elif isinstance(node, _Any | _Missing | _Exists | _ElemMatch):
            if node.path.column is not None:
                found[node.path.column.name] = None
            if isinstance(node, _ElemMatch):
                visit(node.child)
        elif isinstance(node, _Words):
            for column in columns.values():
                if column.kind in (Kind.STRING, Kind.JSON):
                    found[column.name] = None

    visit(ir)
    return list(found)


class _ColumnsExpression(Expression, ABC):
    """An expression over some columns of the document table, rendered by ``render(renderer)``."""

    def __init__(self, columns: Columns, names: list[str], output_field):
        super().__init__(output_field=output_field)
        self.document_columns = columns
        self.names = list(names)
        self.refs = [F(name) for name in names]

    def get_source_expressions(self):
        return self.refs

    def set_source_expressions(self, exprs):
        self.refs = list(exprs)

    @abstractmethod
    def render(self, renderer: _Renderer) -> tuple[str, list]:
        """``(sql, params)`` of this expression for the renderer's engine."""

    def as_sql(self, compiler, connection):
        column_sql: dict[str, str] = {}
        for name, ref in zip(self.names, self.refs, strict=True):
            text, params = compiler.compile(ref)
            if params:  # a column reference never has parameters
                raise NotSupportedError(f"column {name} compiled with parameters")
            column_sql[name] = text
        return self.render(_Renderer(connection, column_sql, self.document_columns))

    @property
    def identity(self):
        return (type(self), self.key(), tuple(self.names))

    @abstractmethod
    def key(self) -> str:
        """What tells two expressions of one class apart (with the column names)."""

    def __eq__(self, other):
        return isinstance(other, _ColumnsExpression) and self.identity == other.identity

    def __hash__(self):
        return hash(self.identity)


class ConditionExpression(_ColumnsExpression):
    """A compiled condition (or part of one) as a boolean SQL expression; never NULL."""

    conditional = True

    def __init__(self, ir: Any, columns: Columns):
        super().__init__(columns, _column_names(ir, columns), BooleanField())
        self.ir = ir

    def render(self, renderer: _Renderer) -> tuple[str, list]:
        if renderer.d.vendor == "sqlite":
            _ensure_sqlite_functions(renderer.connection)
        return _sql("COALESCE(", renderer.condition(self.ir), ", FALSE)")

    def key(self) -> str:
        return repr(self.ir)


class SortKeyExpression(_ColumnsExpression):
    """One part of the sort key of a JSON path: the type rank, or the number, string or boolean within it."""

    FIELDS = {"rank": IntegerField, "number": FloatField, "string": TextField, "boolean": BooleanField}

    def __init__(self, path: _Path, part: str, descending: bool, columns: Columns):
        if path.column is None:
            raise ValueError(f"a sort key's path starts at a column, got {path!r}")
        super().__init__(columns, [path.column.name], self.FIELDS[part]())
        self.path = path
        self.part = part
        self.descending = descending

    def render(self, renderer: _Renderer) -> tuple[str, list]:
        d = renderer.d
        if d.vendor == "sqlite":
            _ensure_sqlite_functions(renderer.connection)
        root = renderer.root(self.path)
        segments = self.path.segments
        missing = d.missing(root, segments, renderer.fresh) if segments else None
        keys = d.sort_keys(root, segments, missing, renderer.fresh)
        k = renderer.fresh("k")
        return _sql(f"(SELECT {d.sort_aggregate(self.part, self.descending, k)} FROM (", keys, f") AS {k})")

    def key(self) -> str:
        return repr((self.path, self.part, self.descending))


class CodePointOrder(_ColumnsExpression):
    """A text column compared by code point (``COLLATE "C"`` on PostgreSQL; SQLite's BINARY already is)."""

    def __init__(self, column: Column, columns: Columns):
        super().__init__(columns, [column.name], TextField())

    def render(self, renderer: _Renderer) -> tuple[str, list]:
        sql = renderer.column_sql[self.names[0]]
        return (f'{sql} COLLATE "C"', []) if renderer.d.vendor == "postgresql" else (sql, [])

    def key(self) -> str:
        return "code point"


def _column_lookup(ir: Any) -> Q | None:
    """A plain ORM lookup for a test on a scalar column itself, when there is one."""
    if not isinstance(ir, _Any) or ir.path.segments:
        return None
    column = _scalar_column(ir.path)
    if column is None:
        return None
    name, test = column.name, ir.test
    if isinstance(test, _Equals):  # narrowed to the column's type by _column_test
        values = list(test.values)
        return Q(**{name: values[0]}) if len(values) == 1 else Q(**{f"{name}__in": values})
    if isinstance(test, _IsNull):
        return Q(**{f"{name}__isnull": True})
    if isinstance(test, _Compare) and column.kind is Kind.INTEGER and isinstance(test.bound, int):
        if INT64[0] <= test.bound <= INT64[1]:
            return Q(**{f"{name}__{test.op}": test.bound})
    return None


#: What :func:`compile_q` gives for a condition no row can match (Django then runs no query).
NOTHING = Q(pk__in=[])


def _to_q(ir: Any, columns: Columns) -> Q:
    if isinstance(ir, _Const):
        return Q() if ir.value else NOTHING
    if isinstance(ir, _And):
        result = Q()
        for part in ir.parts:
            result &= _to_q(part, columns)
        return result
    if isinstance(ir, _Or):
        result = _to_q(ir.parts[0], columns)
        for part in ir.parts[1:]:
            result |= _to_q(part, columns)
        return result
    if isinstance(ir, _Not):
        return ~_to_q(ir.part, columns)
    lookup = _column_lookup(ir)
    return lookup if lookup is not None else Q(ConditionExpression(ir, columns))


# --- the API --------------------------------------------------------------------------------------------


def compile_condition(
    condition: Condition, *, columns: Columns, field_map: dict[str, str] | None = None, now: datetime | None = None,
    path: str = "condition",
) -> Any:
    """The engine-neutral compiled form of ``condition`` (what :func:`compile_q` turns into a ``Q``).

    Raises :class:`QueryValidationError` for RAW, for a field path longer than
    :data:`MAX_PATH_SEGMENTS` and for a condition larger than :data:`MAX_QUERY_SIZE`.
    """
    compiled = _Compiler(columns, field_map, dates.resolve_now(now)).compile(condition, path, in_element=False)
    check_query_size(query_size(compiled), path, "condition")
    return compiled


def compile_q(
    condition: Condition, *, columns: Columns, field_map: dict[str, str] | None = None, now: datetime | None = None,
    path: str = "condition",
) -> Q:
    """A ``Q`` selecting the rows whose document matches ``condition`` (see the module docstring).

    ``columns`` maps top-level document fields to columns; ``field_map``
    renames the first segment of client paths (``{"id": "_id"}``) outside
    ELEM_MATCH, as for :func:`wow_django.backends.mongo.compiler.compile_filter`; ``now``
    anchors the date operators. A condition that can match nothing gives
    ``Q(pk__in=[])`` (Django then skips the query), one that matches all ``Q()``.
    Raises :class:`QueryValidationError` for RAW (``path`` names the root).
    """
    return _to_q(compile_condition(condition, columns=columns, field_map=field_map, now=now, path=path), columns)


def compile_order_by(
    sort: Iterable[SortField], *, columns: Columns, field_map: dict[str, str] | None = None
) -> list[OrderBy]:
    """``order_by()`` terms for ``sort``, in the evaluator's order (see the module docstring).

    A field that is the same column as an earlier one (``id`` and
    ``aggregateId`` of snapshots) and a field that is missing everywhere are
    left out: they cannot change the order.
    """
    terms: list[OrderBy] = []
    seen: set[str] = set()
    size = 0
    for index, item in enumerate(sort):
        check_path_length(item.field, f"sort[{index}].field")
        below = tuple(map_field(item.field, field_map).split(".")[1:])
        # four sort keys, each walking the path and checking where it ends early
        size += 4 * STEP_COST * (_walk_steps(below) + _missing_steps(below))
        check_query_size(size, "sort", "sort")
        name = map_field(item.field, field_map)
        if name in seen:
            continue
        seen.add(name)
        descending = item.direction is Direction.DESC
        head, *rest = name.split(".")
        column = columns.get(head)
        if column is None or (column.kind is not Kind.JSON and rest):
            continue
        if column.kind is not Kind.JSON:
            expression = CodePointOrder(column, columns) if column.kind is Kind.STRING else F(column.name)
            # null sorts first ascending, last descending, on both engines
            terms.append(OrderBy(expression, descending=descending, nulls_first=not descending or None,
                                 nulls_last=descending or None))
            continue
        path = _Path(column, tuple(rest))
        for part in ("rank", "number", "string", "boolean"):
            terms.append(OrderBy(SortKeyExpression(path, part, descending, columns), descending=descending))
    return terms


def projection_fields(projection: Projection, *, columns: Columns, field_map: dict[str, str] | None = None) -> list[str]:
    """The document fields (keys of ``columns``, in order) to read for ``projection``.

    The projection itself is then applied to the documents with
    :func:`wow_django.query.evaluator.apply_projection` (paths inside JSON
    columns included); this only spares reading columns it drops whole.
    """
    if projection.include:
        wanted = {map_field(path, field_map).split(".")[0] for path in projection.include} | {"_id"}
        return [name for name in columns if name in wanted]
    dropped = {map_field(path, field_map) for path in projection.exclude}
    return [name for name in columns if name not in dropped]


def uses_raw(condition: Condition) -> bool:
    return any(node.operator is Op.RAW for node in condition.walk())


__all__ = [
    "Column",
    "Columns",
    "CodePointOrder",
    "ConditionExpression",
    "Kind",
    "NOTHING",
    "RAW_REFUSAL",
    "SortKeyExpression",
    "are_literal",
    "are_text_pattern",
    "compile_condition",
    "compile_order_by",
    "compile_q",
    "projection_fields",
    "uses_raw",
]

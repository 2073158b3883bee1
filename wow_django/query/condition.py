"""The query condition DSL: the model (frozen dataclasses) and its parser.

A condition arrives as JSON::

    {"field": "state.name", "operator": "EQ", "value": "Alice", "children": [], "options": {}}

:func:`parse_condition` turns it into a :class:`Condition` or raises
:class:`~wow_django.query.errors.QueryValidationError` naming the offending
node (``condition.children[1].value``) and the rule it breaks. The query
parsers (:func:`parse_single_query`, :func:`parse_list_query`,
:func:`parse_paged_query`, :func:`parse_count_query`) add projection, sort,
limit and pagination. Backends (``wow_django.backends.mongo.compiler``,
``wow_django.query.evaluator``) only ever see parsed, valid conditions.

No Django and no pymongo here.
"""

from __future__ import annotations

import copy
import decimal
import difflib
import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from wow_django.query import dates
from wow_django.query.errors import QueryValidationError


class Operator(StrEnum):
    """Every operator of the condition DSL (the names of the Wow framework)."""

    AND = "AND"
    OR = "OR"
    NOR = "NOR"
    ID = "ID"
    IDS = "IDS"
    AGGREGATE_ID = "AGGREGATE_ID"
    AGGREGATE_IDS = "AGGREGATE_IDS"
    TENANT_ID = "TENANT_ID"
    OWNER_ID = "OWNER_ID"
    SPACE_ID = "SPACE_ID"
    DELETED = "DELETED"
    ALL = "ALL"
    EQ = "EQ"
    NE = "NE"
    GT = "GT"
    LT = "LT"
    GTE = "GTE"
    LTE = "LTE"
    CONTAINS = "CONTAINS"
    STARTS_WITH = "STARTS_WITH"
    ENDS_WITH = "ENDS_WITH"
    MATCH = "MATCH"
    IN = "IN"
    NOT_IN = "NOT_IN"
    BETWEEN = "BETWEEN"
    ALL_IN = "ALL_IN"
    ELEM_MATCH = "ELEM_MATCH"
    NULL = "NULL"
    NOT_NULL = "NOT_NULL"
    TRUE = "TRUE"
    FALSE = "FALSE"
    EXISTS = "EXISTS"
    TODAY = "TODAY"
    BEFORE_TODAY = "BEFORE_TODAY"
    TOMORROW = "TOMORROW"
    THIS_WEEK = "THIS_WEEK"
    NEXT_WEEK = "NEXT_WEEK"
    LAST_WEEK = "LAST_WEEK"
    THIS_MONTH = "THIS_MONTH"
    LAST_MONTH = "LAST_MONTH"
    RECENT_DAYS = "RECENT_DAYS"
    EARLIER_DAYS = "EARLIER_DAYS"
    RAW = "RAW"


class DeletionState(StrEnum):
    """The value of a DELETED condition."""

    ACTIVE = "ACTIVE"
    DELETED = "DELETED"
    ALL = "ALL"


class Direction(StrEnum):
    ASC = "ASC"
    DESC = "DESC"


Op = Operator
LOGICAL_OPERATORS = frozenset({Op.AND, Op.OR, Op.NOR})
DATE_OPERATORS = frozenset(Operator(name) for name in dates.DATE_OPERATORS)
TEXT_OPERATORS = frozenset({Op.CONTAINS, Op.STARTS_WITH, Op.ENDS_WITH})
COMPARISON_OPERATORS = frozenset({Op.GT, Op.LT, Op.GTE, Op.LTE})

# Operators that always apply to one stored field, whatever the client sends as ``field``.
FIXED_FIELDS: dict[Operator, str] = {
    Op.ID: "_id",
    Op.IDS: "_id",
    Op.AGGREGATE_ID: "aggregateId",
    Op.AGGREGATE_IDS: "aggregateId",
    Op.TENANT_ID: "tenantId",
    Op.OWNER_ID: "ownerId",
    Op.DELETED: "deleted",
}
# Operators that read the client's ``field``; it is required and validated.
FIELD_OPERATORS = (
    frozenset({Op.EQ, Op.NE, Op.IN, Op.NOT_IN, Op.BETWEEN, Op.ALL_IN, Op.ELEM_MATCH})
    | frozenset({Op.NULL, Op.NOT_NULL, Op.TRUE, Op.FALSE, Op.EXISTS})
    | COMPARISON_OPERATORS
    | TEXT_OPERATORS
    | DATE_OPERATORS
)
CHILD_OPERATORS = frozenset({*LOGICAL_OPERATORS, Op.ELEM_MATCH})
# Operators about the whole stored document, meaningless on an array element.
DOCUMENT_OPERATORS = frozenset({*FIXED_FIELDS, Op.MATCH, Op.RAW, Op.SPACE_ID})
#: Wow's space of an aggregate within its tenant (``spaceId``): wow_django keeps every aggregate in the default
#: space, so a SPACE_ID condition naming a space (a non-empty id, as the HTTP API takes it) matches no document;
#: built in Python, SPACE_ID "" matches every one.
DEFAULT_SPACE_ID = ""

OPTION_KEYS = ("ignoreCase", "zoneId", "datePattern")
#: Keys of a query body, never of a condition.
QUERY_KEYS = ("condition", "sort", "projection", "pagination", "limit")
IGNORE_CASE_OPERATORS = frozenset({Op.EQ, Op.NE, *TEXT_OPERATORS})

FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
FIELD_PATH_RULE = (
    "field paths are names of letters, digits and '_' joined by '.', the first not starting with a digit "
    "(no '$', no empty segments)"
)
# MongoDB nests documents at most 100 levels deep, so a longer path can never match; past it the
# backends (and mongomock, the ORM's key transforms) would recurse once per segment.
MAX_FIELD_SEGMENTS = 100
MAX_FIELD_PATH_LENGTH = 1024
# Text that becomes a regular expression (CONTAINS, STARTS_WITH, ENDS_WITH, EQ/NE with ignoreCase,
# a RAW $regex) or a full-text search (MATCH). Escaped, 4096 characters stay well under MongoDB's
# 32764-byte pattern limit; each distinct pattern costs a compilation (and a cache entry) per backend.
MAX_TEXT_LENGTH = 4096
# All the text of one query's text conditions together (CONTAINS, STARTS_WITH, ENDS_WITH, MATCH, and the text
# of EQ/NE, which ignoreCase turns into a pattern): each character is matched against every candidate
# document's field, so the query's cost grows with it. Four texts at the longest each.
MAX_QUERY_TEXT = 4 * MAX_TEXT_LENGTH
MAX_OPTION_LENGTH = 64  # zoneId, datePattern
MAX_LIST_SIZE = 1000
MAX_SORT_FIELDS = 32  # MongoDB sorts on at most 32 keys.
DEFAULT_LIMIT = 10
DEFAULT_PAGE_SIZE = 10
MAX_SKIP = 2**31 - 1

# Plain query operators a RAW filter may use. Anything else starting with '$'
# (server-side code such as $where, $function, $accumulator, $expr, or
# $jsonSchema, geo and text operators) is refused.
RAW_ALLOWED_OPERATORS = frozenset(
    "$and $or $nor $not $eq $ne $gt $gte $lt $lte $in $nin $exists $type $size $all $elemMatch $mod $regex "
    "$options".split()
)
RAW_CODE_OPERATORS = frozenset({"$where", "$function", "$accumulator", "$expr", "$jsonSchema"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ConditionOptions:
    """``options`` of a condition: ``ignoreCase``, ``zoneId`` (IANA) and ``datePattern`` (Java style)."""

    ignore_case: bool = False
    zone_id: str = "UTC"
    date_pattern: str | None = None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.zone_id)

    @property
    def parsed_date_pattern(self) -> dates.DatePattern | None:
        return dates.parse_date_pattern(self.date_pattern) if self.date_pattern else None


NO_OPTIONS = ConditionOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """One node of a condition tree.

    ``field`` is the client's field path ("" for operators that ignore it);
    :func:`target_field` gives the stored field an operator applies to. List
    values (IDS, IN, NOT_IN, ALL_IN, BETWEEN) are tuples; other values are
    the JSON values as sent.
    """

    operator: Operator
    field: str = ""
    value: Any = None
    children: tuple[Condition, ...] = ()
    options: ConditionOptions = NO_OPTIONS

    def __post_init__(self) -> None:
        # Accept plain strings and lists from code that builds conditions by hand.
        if not isinstance(self.operator, Operator):
            object.__setattr__(self, "operator", Operator(self.operator))
        if not isinstance(self.children, tuple):
            object.__setattr__(self, "children", tuple(self.children))

    def walk(self) -> Iterator[Condition]:
        """This node and every node below it (ELEM_MATCH children included), depth first."""
        yield self
        for child in self.children:
            yield from child.walk()


ALL_CONDITION = Condition(operator=Operator.ALL)


def space_condition(space_id: str) -> Condition:
    """What SPACE_ID ``space_id`` means here: every aggregate is in the default space (:data:`DEFAULT_SPACE_ID`),
    so every document for it, none for another (IDS of no id, which every backend answers with nothing)."""
    if space_id == DEFAULT_SPACE_ID:
        return ALL_CONDITION
    return Condition(operator=Operator.IDS, value=())


def target_field(condition: Condition) -> str:
    """The stored field ``condition`` applies to, before any field map."""
    return FIXED_FIELDS.get(condition.operator, condition.field)


def and_conditions(*conditions: Condition) -> Condition:
    """All of ``conditions`` as one condition (ALL dropped; a single one returned as is).

    Use it to add server-side scope (tenant, deletion state) to a client's
    condition: a MATCH at the client's top level stays at the top level.
    """
    kept = tuple(c for c in conditions if c.operator is not Operator.ALL)
    if not kept:
        return ALL_CONDITION
    if len(kept) == 1:
        return kept[0]
    return Condition(operator=Operator.AND, children=kept)


def uses_operator(condition: Condition, *operators: Operator) -> bool:
    """Whether any node of ``condition`` uses one of ``operators``."""
    wanted = set(operators)
    return any(node.operator in wanted for node in condition.walk())


# --- query parts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Projection:
    """Fields to return: ``include`` only these, or everything but ``exclude`` (never both)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.include and not self.exclude


ALL_FIELDS = Projection()


@dataclass(frozen=True, slots=True, kw_only=True)
class SortField:
    field: str
    direction: Direction = Direction.ASC

    def __post_init__(self) -> None:
        if not isinstance(self.direction, Direction):
            object.__setattr__(self, "direction", Direction(self.direction))


@dataclass(frozen=True, slots=True, kw_only=True)
class Pagination:
    """Page ``index`` (from 1) of ``size`` items."""

    index: int = 1
    size: int = DEFAULT_PAGE_SIZE

    @property
    def offset(self) -> int:
        """How many items come before this page."""
        return (self.index - 1) * self.size


@dataclass(frozen=True, slots=True, kw_only=True)
class SingleQuery:
    """The first document matching ``condition`` in ``sort`` order."""

    condition: Condition = ALL_CONDITION
    projection: Projection = ALL_FIELDS
    sort: tuple[SortField, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ListQuery(SingleQuery):
    """At most ``limit`` matching documents."""

    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class PagedQuery(SingleQuery):
    """One page of matching documents (answered with ``{total, list}``)."""

    pagination: Pagination = field(default_factory=Pagination)


# --- parsing ------------------------------------------------------------------------------


def _fail(path: str, rule: str) -> QueryValidationError:
    return QueryValidationError(path, rule)


#: What people write for an operator, and the operator they mean (spelling suggestions miss these:
#: GREATER is closer to AGGREGATE_ID than to GT).
OPERATOR_SYNONYMS = {
    "GREATER": "GT", "GREATER_THAN": "GT", "GT_E": "GTE", "GE": "GTE", "GREATER_OR_EQUAL": "GTE",
    "GREATER_THAN_OR_EQUAL": "GTE", "LESS": "LT", "LESS_THAN": "LT", "LE": "LTE", "LESS_OR_EQUAL": "LTE",
    "LESS_THAN_OR_EQUAL": "LTE", "EQUAL": "EQ", "EQUALS": "EQ", "EQUAL_TO": "EQ", "IS": "EQ", "NOT_EQUAL": "NE",
    "NOT_EQUALS": "NE", "NEQ": "NE", "LIKE": "CONTAINS", "INCLUDES": "CONTAINS", "STARTSWITH": "STARTS_WITH",
    "PREFIX": "STARTS_WITH", "ENDSWITH": "ENDS_WITH", "SUFFIX": "ENDS_WITH", "NIN": "NOT_IN", "NOTIN": "NOT_IN",
    "RANGE": "BETWEEN", "ISNULL": "NULL", "IS_NULL": "NULL", "NOTNULL": "NOT_NULL", "IS_NOT_NULL": "NOT_NULL",
    "NOT": "NOR", "REGEX": "MATCH",
}


def _suggest(name: str, candidates) -> str:
    if len(name) > MAX_OPTION_LENGTH:  # no name is that long; spare difflib a client's megabyte
        return ""
    close = difflib.get_close_matches(name.upper() if name.upper() in candidates else name, list(candidates), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


DESCRIBE_LENGTH = 60


def _describe(value: Any) -> str:
    """A short preview of a client's value for an error message, however large or deeply nested."""
    if isinstance(value, str):
        text = repr(value[: DESCRIBE_LENGTH + 1])
    else:
        text = _preview(value, DESCRIBE_LENGTH + 1)
    return text if len(text) <= DESCRIBE_LENGTH else text[: DESCRIBE_LENGTH - 3] + "..."


class _Text(str):
    """Text already written as JSON (a bracket, a separator, a key)."""


def _preview(value: Any, budget: int) -> str:
    """The start (at least ``budget`` characters when there are that many) of ``value`` as JSON.

    Iterative, and stops once ``budget`` characters are written: a list nested a thousand deep
    or a megabyte of keys costs no more than the preview shows (``json.dumps`` would recurse).
    """
    out: list[str] = []
    size = 0
    pending: list[Any] = [value]  # a stack: the next piece to write is last
    while pending and size < budget:
        item = pending.pop()
        if isinstance(item, _Text):
            text = str(item)
        elif isinstance(item, dict | list | tuple):
            is_dict = isinstance(item, dict)
            entries = list(itertools.islice(item.items() if isinstance(item, dict) else item, budget))
            pieces: list[Any] = []
            for i, entry in enumerate(entries):
                if i:
                    pieces.append(_Text(", "))
                if is_dict:
                    pieces += [_Text(json.dumps(str(entry[0])[:budget]) + ": "), entry[1]]
                else:
                    pieces.append(entry)
            pieces.append(_Text("}" if is_dict else "]"))
            pending.extend(reversed(pieces))
            text = "{" if is_dict else "["
        elif isinstance(item, str):
            text = json.dumps(item[:budget])
        elif isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 256:
            text = "(a large integer)"
        elif item is None or isinstance(item, bool | int | float):
            text = json.dumps(item)
        else:
            text = repr(item)[:budget]
        out.append(text)
        size += len(text)
    return "".join(out)


def _check_keys(data: dict, allowed: tuple[str, ...], path: str) -> None:
    for key in data:
        if key not in allowed:
            hint = _suggest(str(key), allowed)
            raise _fail(_key_path(path, str(key)), f"unknown key; allowed keys are {', '.join(allowed)}.{hint}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _key_path(path: str, key: str) -> str:
    """``path.key`` for a client's object key, the key shortened when it is longer than a field path may be."""
    return _join(path, key if len(key) <= MAX_FIELD_PATH_LENGTH else key[:MAX_FIELD_PATH_LENGTH] + "...")


# Decimal128's limits (IEEE 754-2008 decimal128, what MongoDB stores a Decimal as): 34 significant digits,
# exponents -6143 to 6144. Every backend refuses a condition's Decimal beyond them, so that one condition
# means the same everywhere (no stored Decimal can be beyond them on MongoDB).
_DECIMAL128 = decimal.Context(prec=34, Emin=-6143, Emax=6144, clamp=1, rounding=decimal.ROUND_HALF_EVEN,
                              traps=[decimal.InvalidOperation, decimal.Overflow, decimal.Inexact])
DECIMAL_DIGITS = 34


def decimal_problem(number: Decimal) -> str | None:
    """Why the finite ``number`` cannot be a condition's value exactly (more significant digits, or a larger
    or smaller exponent, than MongoDB's Decimal128 holds), or None. Trailing zeros beyond 34 digits are
    fine: they change no value."""
    try:
        _DECIMAL128.create_decimal(number)
    except (decimal.Inexact, decimal.Overflow, decimal.InvalidOperation):
        return (f"{shorten_number(number)} has more significant digits ({DECIMAL_DIGITS} at most) or a larger "
                "exponent (-6143 to 6144) than a Decimal can be compared with exactly")
    return None


def shorten_number(number: Decimal, limit: int = 60) -> str:
    text = str(number)
    return text if len(text) <= limit else text[:limit] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _is_blank(value: Any) -> bool:
    """Absent, null or "" (Wow clients send "" as the empty value)."""
    return value is None or value == ""


def validate_field_path(path_value: Any, path: str) -> str:
    """``path_value`` if it is a valid field path, else a QueryValidationError at ``path``."""
    if not isinstance(path_value, str) or not path_value:
        raise _fail(path, f"a field path is required (got {_describe(path_value)})")
    _check_field_path(path_value, path)
    return path_value


def _check_field_path(path_value: str, path: str) -> None:
    segments = path_value.count(".") + 1
    if segments > MAX_FIELD_SEGMENTS:
        raise _fail(
            path,
            f"{_describe(path_value)} is too deep: a field path has at most {MAX_FIELD_SEGMENTS} segments "
            f"(got {segments})",
        )
    if len(path_value) > MAX_FIELD_PATH_LENGTH:
        raise _fail(
            path,
            f"{_describe(path_value)} is too long: a field path has at most {MAX_FIELD_PATH_LENGTH} characters "
            f"(got {len(path_value)})",
        )
    if not FIELD_PATH.fullmatch(path_value):
        raise _fail(path, f"{_describe(path_value)} is not a valid field path: {FIELD_PATH_RULE}")


def _check_text_length(text: str, path: str, what: str, limit: int = MAX_TEXT_LENGTH) -> str:
    if len(text) > limit:
        raise _fail(path, f"{what} takes at most {limit} characters (got {len(text)})")
    return text


class _ConditionParser:
    """Validates one condition tree; ``parse`` returns the root."""

    KEYS = ("field", "operator", "value", "children", "options")

    def __init__(self, *, allow_raw: bool, max_depth: int):
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an integer >= 1, got {max_depth!r}")
        self.allow_raw = allow_raw
        self.max_depth = max_depth
        self.text_searches = 0
        #: The text of the text conditions parsed so far (bounded by MAX_QUERY_TEXT).
        self.query_text = 0

    def parse(self, data: Any, path: str, *, depth: int, in_element: bool, text_allowed: bool) -> Condition:
        if depth > self.max_depth:
            raise _fail(path, f"conditions are nested deeper than {self.max_depth} levels")
        if not isinstance(data, dict):
            raise _fail(path, f"a condition must be a JSON object with an operator (got {_describe(data)})")
        _check_keys(data, self.KEYS, path)
        operator = self._operator(data.get("operator"), _join(path, "operator"))
        if in_element and operator in DOCUMENT_OPERATORS:
            raise _fail(
                _join(path, "operator"),
                f"{operator} applies to the whole document and cannot be used inside ELEM_MATCH",
            )
        field_path = self._field(operator, data.get("field"), _join(path, "field"))
        options = self._options(operator, data.get("options"), _join(path, "options"))
        children = self._children(operator, data.get("children"), path, depth, in_element, text_allowed)
        value = self._value(operator, data.get("value"), _join(path, "value"), path, text_allowed)
        if operator is Op.SPACE_ID:
            return space_condition(value)
        if operator in (Op.EQ, Op.NE) and options.ignore_case and isinstance(value, str):
            _check_text_length(value, _join(path, "value"), f"{operator} with ignoreCase")
        return Condition(operator=operator, field=field_path, value=value, children=children, options=options)

    # --- parts -------------------------------------------------------------------------

    def _operator(self, raw: Any, path: str) -> Operator:
        if raw is None or raw == "":
            raise _fail(path, "an operator is required")
        if not isinstance(raw, str):
            raise _fail(path, f"the operator must be a string (got {_describe(raw)})")
        try:
            return Operator(raw)
        except ValueError:
            meant = OPERATOR_SYNONYMS.get(raw.upper().replace("-", "_").replace(" ", "_")) if len(raw) < 64 else None
            hint = f" Did you mean {meant!r}?" if meant else _suggest(raw, [o.value for o in Operator])
            raise _fail(path, f"unknown operator {_describe(raw)}.{hint}") from None

    def _field(self, operator: Operator, raw: Any, path: str) -> str:
        if operator in FIELD_OPERATORS:
            if _is_blank(raw):
                raise _fail(path, f"{operator} needs a field")
            return validate_field_path(raw, path)
        if raw is not None and not isinstance(raw, str):
            raise _fail(path, f"the field must be a string (got {_describe(raw)})")
        return ""  # ignored by this operator: see FIXED_FIELDS

    def _options(self, operator: Operator, raw: Any, path: str) -> ConditionOptions:
        if raw is None:
            return NO_OPTIONS
        if not isinstance(raw, dict):
            raise _fail(path, f"options must be a JSON object (got {_describe(raw)})")
        for key in raw:
            if key not in OPTION_KEYS:
                raise _fail(
                    _key_path(path, str(key)),
                    f"unknown option; known options are {', '.join(OPTION_KEYS)}.{_suggest(str(key), OPTION_KEYS)}",
                )
        raw = {key: value for key, value in raw.items() if value is not None}  # null means "not given"
        values: dict[str, Any] = {}
        if "ignoreCase" in raw:
            key_path = _join(path, "ignoreCase")
            if operator not in IGNORE_CASE_OPERATORS:
                raise _fail(key_path, f"ignoreCase applies only to {_names(IGNORE_CASE_OPERATORS)}, not {operator}")
            if not isinstance(raw["ignoreCase"], bool):
                raise _fail(key_path, f"ignoreCase must be true or false (got {_describe(raw['ignoreCase'])})")
            values["ignore_case"] = raw["ignoreCase"]
        for key in ("zoneId", "datePattern"):
            if key in raw and operator not in DATE_OPERATORS:
                raise _fail(_join(path, key), f"{key} applies only to date operators ({_names(DATE_OPERATORS)})")
        if "zoneId" in raw:
            values["zone_id"] = self._zone_id(raw["zoneId"], _join(path, "zoneId"))
        if "datePattern" in raw:
            pattern = raw["datePattern"]
            if not isinstance(pattern, str):
                raise _fail(_join(path, "datePattern"), f"datePattern must be a string (got {_describe(pattern)})")
            _check_text_length(pattern, _join(path, "datePattern"), "datePattern", MAX_OPTION_LENGTH)
            try:
                dates.parse_date_pattern(pattern)
            except ValueError as exc:
                raise _fail(_join(path, "datePattern"), f"invalid date pattern: {exc}") from None
            values["date_pattern"] = pattern
        return ConditionOptions(**values)

    @staticmethod
    def _zone_id(raw: Any, path: str) -> str:
        if not isinstance(raw, str) or not raw:
            raise _fail(path, f"zoneId must be an IANA time zone name such as 'Asia/Shanghai' (got {_describe(raw)})")
        _check_text_length(raw, path, "zoneId", MAX_OPTION_LENGTH)
        try:
            ZoneInfo(raw)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise _fail(path, f"unknown time zone {_describe(raw)}; use an IANA name such as 'Asia/Shanghai' or 'UTC'") from None
        return raw

    def _children(
        self, operator: Operator, raw: Any, path: str, depth: int, in_element: bool, text_allowed: bool
    ) -> tuple[Condition, ...]:
        children_path = _join(path, "children")
        if raw is None:
            raw = []
        if not isinstance(raw, list):
            raise _fail(children_path, f"children must be a list of conditions (got {_describe(raw)})")
        if operator not in CHILD_OPERATORS:
            if raw:
                raise _fail(children_path, f"{operator} takes no children")
            return ()
        if len(raw) > MAX_LIST_SIZE:
            raise _fail(children_path, f"at most {MAX_LIST_SIZE} children are allowed (got {len(raw)})")
        if not raw and operator in (Op.OR, Op.NOR, Op.ELEM_MATCH):
            raise _fail(children_path, f"{operator} needs at least one child condition")
        # $text must sit at the top level of a MongoDB filter or inside top-level $and.
        child_text = text_allowed and operator is Op.AND
        child_element = in_element or operator is Op.ELEM_MATCH
        return tuple(
            self.parse(
                child, f"{children_path}[{i}]", depth=depth + 1, in_element=child_element, text_allowed=child_text
            )
            for i, child in enumerate(raw)
        )

    # --- values -------------------------------------------------------------------------

    def _charge(self, text: str, path: str) -> str:
        """Count ``text`` against :data:`MAX_QUERY_TEXT`; refuse the query at the value that passes it."""
        self.query_text += len(text)
        if self.query_text > MAX_QUERY_TEXT:
            raise _fail(path, f"the text of a query's conditions (CONTAINS, STARTS_WITH, ENDS_WITH, MATCH, EQ, NE) "
                              f"takes at most {MAX_QUERY_TEXT} characters in all (this one brings it to "
                              f"{self.query_text})")
        return text

    def _value(self, operator: Operator, raw: Any, path: str, node_path: str, text_allowed: bool) -> Any:
        if operator in (Op.ID, Op.AGGREGATE_ID, Op.TENANT_ID, Op.OWNER_ID, Op.SPACE_ID):
            # A client finds the aggregates without an owner with EQ on ownerId "" (Wow's OWNER_ID "" is left
            # out: the OpenAPI grammar keeps one rule for every id operator, see wow_django.http.contract).
            return self._text(raw, path, operator, allow_empty=False)
        if operator in (Op.IDS, Op.AGGREGATE_IDS):
            items = self._list(raw, path, operator)
            for i, item in enumerate(items):
                self._text(item, f"{path}[{i}]", operator, allow_empty=False)
            return tuple(items)
        if operator is Op.DELETED:
            allowed = [s.value for s in DeletionState]
            if raw not in allowed:
                hint = _suggest(raw, allowed) if isinstance(raw, str) else ""
                raise _fail(path, f"DELETED takes one of {', '.join(allowed)} (got {_describe(raw)}).{hint}")
            return DeletionState(raw)
        if operator in (Op.EQ, Op.NE):
            self._json(raw, path, depth=1)
            if isinstance(raw, str):
                self._charge(raw, path)
            return copy.deepcopy(raw)
        if operator in COMPARISON_OPERATORS:
            return self._comparable(raw, path, operator)
        if operator in TEXT_OPERATORS:
            return self._charge(_check_text_length(self._text(raw, path, operator, allow_empty=True), path,
                                                   operator), path)
        if operator is Op.MATCH:
            if not text_allowed:
                raise _fail(
                    _join(node_path, "operator"),
                    "MATCH (full-text search) may only appear at the top level or inside top-level AND conditions",
                )
            self.text_searches += 1
            if self.text_searches > 1:
                raise _fail(_join(node_path, "operator"), "only one MATCH (full-text search) is allowed per query")
            text = self._charge(_check_text_length(self._text(raw, path, operator, allow_empty=False), path,
                                                   operator), path)
            if not text.strip():
                raise _fail(path, "MATCH needs at least one word to search for")
            return text
        if operator in (Op.IN, Op.NOT_IN, Op.ALL_IN):
            items = self._list(raw, path, operator)
            if operator is Op.ALL_IN and not items:
                raise _fail(path, "ALL_IN needs at least one value")
            self._json(items, path, depth=1)
            return tuple(copy.deepcopy(items))
        if operator is Op.BETWEEN:
            items = self._list(raw, path, operator)
            if len(items) != 2:
                raise _fail(path, f"BETWEEN takes a list of two values [low, high] (got {len(items)})")
            low = self._comparable(items[0], f"{path}[0]", operator)
            high = self._comparable(items[1], f"{path}[1]", operator)
            if _is_number(low) != _is_number(high):
                raise _fail(path, "BETWEEN bounds must both be numbers or both be strings")
            return (low, high)
        if operator is Op.EXISTS:
            if _is_blank(raw):
                return True
            if not isinstance(raw, bool):
                raise _fail(path, f"EXISTS takes true or false (got {_describe(raw)})")
            return raw
        if operator is Op.BEFORE_TODAY:
            if _is_blank(raw):
                return None
            try:
                return dates.parse_time_of_day(raw)
            except ValueError:
                raise _fail(path, f"BEFORE_TODAY takes {dates.TIME_OF_DAY_RULE} (got {_describe(raw)})") from None
        if operator in (Op.RECENT_DAYS, Op.EARLIER_DAYS):
            if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= dates.MAX_DAYS:
                raise _fail(
                    path, f"{operator} takes a whole number of days from 1 to {dates.MAX_DAYS} (got {_describe(raw)})"
                )
            return raw
        if operator is Op.RAW:
            return self._raw(raw, path, node_path)
        # AND OR NOR ALL ELEM_MATCH NULL NOT_NULL TRUE FALSE and the argument-free date operators.
        if not _is_blank(raw):
            raise _fail(path, f"{operator} takes no value (got {_describe(raw)})")
        return None

    @staticmethod
    def _text(raw: Any, path: str, operator: Operator, *, allow_empty: bool) -> str:
        if not isinstance(raw, str) or (not raw and not allow_empty):
            kind = "a string" if allow_empty else "a non-empty string"
            raise _fail(path, f"{operator} takes {kind} (got {_describe(raw)})")
        if "\x00" in raw:
            raise _fail(path, "text must not contain the NUL character")
        return raw

    @staticmethod
    def _list(raw: Any, path: str, operator: Operator) -> list:
        if not isinstance(raw, list | tuple):
            raise _fail(path, f"{operator} takes a list (got {_describe(raw)})")
        if len(raw) > MAX_LIST_SIZE:
            raise _fail(path, f"lists hold at most {MAX_LIST_SIZE} values (got {len(raw)})")
        return list(raw)

    @staticmethod
    def _comparable(raw: Any, path: str, operator: Operator) -> int | float | str | datetime:
        if isinstance(raw, str | datetime):  # a datetime (from Python code) compares as canonical time text
            return raw
        if _is_number(raw) and math.isfinite(raw):
            return raw
        raise _fail(path, f"{operator} compares with a finite number or a string (got {_describe(raw)})")

    def _json(self, value: Any, path: str, *, depth: int) -> None:
        """Check a JSON value: no '$' keys (operator injection), finite numbers, bounded size and depth."""
        if depth > self.max_depth:
            raise _fail(path, f"values are nested deeper than {self.max_depth} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _fail(path, f"object keys must be strings (got {_describe(key)})")
                if key.startswith("$"):
                    raise _fail(
                        path,
                        f"key {_describe(key)}: keys starting with '$' are not allowed inside values (they would act as "
                        "MongoDB operators); use the condition's operator instead",
                    )
                if "\x00" in key:
                    raise _fail(path, f"key {_describe(key)}: keys may not contain the NUL character")
                self._json(item, _key_path(path, key), depth=depth + 1)
        elif isinstance(value, list | tuple):
            if len(value) > MAX_LIST_SIZE:
                raise _fail(path, f"lists hold at most {MAX_LIST_SIZE} values (got {len(value)})")
            for i, item in enumerate(value):
                self._json(item, f"{path}[{i}]", depth=depth + 1)
        elif isinstance(value, float | Decimal):
            if not math.isfinite(value):
                raise _fail(path, "numbers must be finite (no NaN or Infinity)")
            if isinstance(value, Decimal) and (problem := decimal_problem(value)) is not None:
                raise _fail(path, problem)
        elif isinstance(value, int) and not isinstance(value, bool):
            if not -(2**63) <= value < 2**63:
                raise _fail(path, "integers must fit in 64 bits")
        elif value is not None and not isinstance(value, str | bool | datetime):
            raise _fail(path, f"values must be JSON (got {type(value).__name__})")

    def _raw(self, raw: Any, path: str, node_path: str) -> dict:
        if not self.allow_raw:
            raise _fail(
                _join(node_path, "operator"),
                "RAW conditions are disabled; the server must allow them (setting QUERY_ALLOW_RAW)",
            )
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise _fail(path, f"RAW takes a MongoDB filter object or its JSON text ({exc})") from None
        if not isinstance(raw, dict):
            raise _fail(path, f"RAW takes a MongoDB filter object (got {_describe(raw)})")
        self._raw_check(raw, path, depth=1)
        return copy.deepcopy(raw)

    def _raw_check(self, value: Any, path: str, *, depth: int) -> None:
        if depth > self.max_depth:
            raise _fail(path, f"the RAW filter is nested deeper than {self.max_depth} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _fail(path, f"filter keys must be strings (got {_describe(key)})")
                key_path = _key_path(path, key)
                if key in RAW_CODE_OPERATORS:
                    raise _fail(key_path, f"{key} is refused: RAW filters may not run server-side code or schemas")
                if key.startswith("$"):
                    if key not in RAW_ALLOWED_OPERATORS:
                        raise _fail(
                            key_path,
                            f"{key} is not an allowed RAW operator; allowed: {', '.join(sorted(RAW_ALLOWED_OPERATORS))}",
                        )
                else:
                    _check_field_path(key, key_path)
                if key == "$regex" and isinstance(item, str):
                    _check_text_length(item, key_path, "$regex")
                self._raw_check(item, key_path, depth=depth + 1)
        elif isinstance(value, list | tuple):
            if len(value) > MAX_LIST_SIZE:
                raise _fail(path, f"lists hold at most {MAX_LIST_SIZE} values (got {len(value)})")
            for i, item in enumerate(value):
                self._raw_check(item, f"{path}[{i}]", depth=depth + 1)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _fail(path, "numbers must be finite (no NaN or Infinity)")
        elif value is not None and not isinstance(value, str | int | float | bool):
            raise _fail(path, f"values must be JSON (got {type(value).__name__})")


def _names(operators) -> str:
    order = list(Operator)
    return ", ".join(sorted((o.value for o in operators), key=lambda name: order.index(Operator(name))))


def parse_condition(data: Any, *, allow_raw: bool = False, max_depth: int = 16, path: str = "condition") -> Condition:
    """Parse one condition tree, or raise QueryValidationError pointing into ``data``.

    ``allow_raw`` lets RAW through (still without server-side code); the
    caller feeds it from the QUERY_ALLOW_RAW setting. ``max_depth`` caps the
    nesting of conditions (the root is depth 1) and of values. ``path``
    names the root in error paths.
    """
    parser = _ConditionParser(allow_raw=allow_raw, max_depth=max_depth)
    return parser.parse(data, path, depth=1, in_element=False, text_allowed=True)


def parse_projection(data: Any, path: str = "projection") -> Projection:
    """``{"include": [...]}`` or ``{"exclude": [...]}``; null or empty means every field."""
    if data is None:
        return ALL_FIELDS
    if not isinstance(data, dict):
        raise _fail(path, f"projection must be a JSON object with include or exclude (got {_describe(data)})")
    _check_keys(data, ("include", "exclude"), path)
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("include", "exclude"):
        raw = data.get(key)
        key_path = _join(path, key)
        if raw is None:
            raw = []
        if not isinstance(raw, list):
            raise _fail(key_path, f"{key} must be a list of field paths (got {_describe(raw)})")
        if len(raw) > MAX_LIST_SIZE:
            raise _fail(key_path, f"at most {MAX_LIST_SIZE} fields are allowed (got {len(raw)})")
        paths = tuple(validate_field_path(item, f"{key_path}[{i}]") for i, item in enumerate(raw))
        for i, one in enumerate(paths):
            for other in paths[:i]:
                if one == other or one.startswith(other + ".") or other.startswith(one + "."):
                    raise _fail(
                        f"{key_path}[{i}]",
                        f"{one!r} overlaps {other!r}; list a field or its parent, not both",
                    )
        lists[key] = paths
    if lists["include"] and lists["exclude"]:
        raise _fail(path, "use include or exclude, not both")
    return Projection(include=lists["include"], exclude=lists["exclude"])


def parse_sort(data: Any, path: str = "sort") -> tuple[SortField, ...]:
    """``[{"field": ..., "direction": "ASC" | "DESC"}]`` (direction defaults to ASC); null means no order."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise _fail(path, f"sort must be a list of {{field, direction}} objects (got {_describe(data)})")
    if len(data) > MAX_SORT_FIELDS:
        raise _fail(path, f"at most {MAX_SORT_FIELDS} sort fields are allowed (got {len(data)})")
    result: list[SortField] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        item_path = f"{path}[{i}]"
        if not isinstance(item, dict):
            raise _fail(item_path, f"a sort entry must be an object with field and direction (got {_describe(item)})")
        _check_keys(item, ("field", "direction"), item_path)
        field_path = validate_field_path(item.get("field"), _join(item_path, "field"))
        if field_path in seen:
            raise _fail(_join(item_path, "field"), f"{field_path!r} is already sorted on")
        seen.add(field_path)
        raw_direction = item.get("direction")
        if raw_direction is None:
            direction = Direction.ASC
        elif raw_direction in (Direction.ASC.value, Direction.DESC.value):
            direction = Direction(raw_direction)
        else:
            hint = _suggest(raw_direction, ("ASC", "DESC")) if isinstance(raw_direction, str) else ""
            raise _fail(
                _join(item_path, "direction"), f"direction must be ASC or DESC (got {_describe(raw_direction)}).{hint}"
            )
        result.append(SortField(field=field_path, direction=direction))
    return tuple(result)


def _bounded_int(raw: Any, path: str, low: int, high: int, name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _fail(path, f"{name} must be a whole number (got {_describe(raw)})")
    if raw < low:
        raise _fail(path, f"{name} must be at least {low} (got {raw})")
    if raw > high:
        raise _fail(path, f"{name} must be at most {high} (got {raw})")
    return raw


def parse_limit(data: Any, *, max_limit: int, path: str = "limit") -> int:
    """An integer in 1..max_limit; null means min(DEFAULT_LIMIT, max_limit)."""
    if data is None:
        return min(DEFAULT_LIMIT, max_limit)
    return _bounded_int(data, path, 1, max_limit, "limit")


def parse_pagination(data: Any, *, max_page_size: int, path: str = "pagination") -> Pagination:
    """``{"index": >= 1, "size": 1..max_page_size}``; missing parts default to page 1 of DEFAULT_PAGE_SIZE."""
    default_size = min(DEFAULT_PAGE_SIZE, max_page_size)
    if data is None:
        return Pagination(index=1, size=default_size)
    if not isinstance(data, dict):
        raise _fail(path, f"pagination must be a JSON object with index and size (got {_describe(data)})")
    _check_keys(data, ("index", "size"), path)
    size = data.get("size")
    size = default_size if size is None else _bounded_int(size, _join(path, "size"), 1, max_page_size, "size")
    index = data.get("index")
    # The offset must fit a 32-bit skip; deeper pages are refused rather than sent to the server.
    max_index = MAX_SKIP // size + 1
    index = 1 if index is None else _bounded_int(index, _join(path, "index"), 1, max_index, "index")
    return Pagination(index=index, size=size)


def _query_body(data: Any, allowed: tuple[str, ...]) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _fail("body", f"the query must be a JSON object (got {_describe(data)})")
    _check_keys(data, allowed, "")
    return data


def _optional_condition(data: Any, *, allow_raw: bool, max_depth: int) -> Condition:
    if data is None:
        return ALL_CONDITION
    return parse_condition(data, allow_raw=allow_raw, max_depth=max_depth)


def parse_single_query(data: Any, *, allow_raw: bool = False, max_depth: int = 16) -> SingleQuery:
    """``{condition, projection, sort}``; a missing condition means ALL."""
    body = _query_body(data, ("condition", "projection", "sort"))
    return SingleQuery(
        condition=_optional_condition(body.get("condition"), allow_raw=allow_raw, max_depth=max_depth),
        projection=parse_projection(body.get("projection")),
        sort=parse_sort(body.get("sort")),
    )


def parse_list_query(data: Any, *, allow_raw: bool = False, max_depth: int = 16, max_limit: int = 1000) -> ListQuery:
    """``{condition, projection, sort, limit}``; limit is 1..max_limit (default 10)."""
    body = _query_body(data, ("condition", "projection", "sort", "limit"))
    return ListQuery(
        condition=_optional_condition(body.get("condition"), allow_raw=allow_raw, max_depth=max_depth),
        projection=parse_projection(body.get("projection")),
        sort=parse_sort(body.get("sort")),
        limit=parse_limit(body.get("limit"), max_limit=max_limit),
    )


def parse_paged_query(
    data: Any, *, allow_raw: bool = False, max_depth: int = 16, max_page_size: int = 200
) -> PagedQuery:
    """``{condition, projection, sort, pagination: {index, size}}``; size is 1..max_page_size."""
    body = _query_body(data, ("condition", "projection", "sort", "pagination"))
    return PagedQuery(
        condition=_optional_condition(body.get("condition"), allow_raw=allow_raw, max_depth=max_depth),
        projection=parse_projection(body.get("projection")),
        sort=parse_sort(body.get("sort")),
        pagination=parse_pagination(body.get("pagination"), max_page_size=max_page_size),
    )


def parse_count_query(data: Any, *, allow_raw: bool = False, max_depth: int = 16) -> Condition:
    """The count body is a bare condition (error paths still start at ``condition``); null or {} means ALL."""
    if data is None or data == {}:
        return ALL_CONDITION
    if isinstance(data, dict):
        wrapped = next((key for key in data if key in QUERY_KEYS), None)
        if wrapped is not None:  # a list/paged query's body sent to count
            raise _fail(_key_path("condition", wrapped),
                        f"count takes a bare condition (the body is the condition itself, as Wow's count), not a "
                        f"query: send {{\"operator\": …}} without {wrapped!r}")
    return parse_condition(data, allow_raw=allow_raw, max_depth=max_depth)

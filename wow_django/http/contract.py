"""The JSON Schema of what the API takes and answers, and the check that holds requests to it.

The OpenAPI document (:mod:`wow_django.http.schema`) is built from these
schemas, and the views hold every JSON body to the same schemas after their
own, more talkative validation (pydantic for commands, the condition parser for
queries, the bus's envelope rules): :func:`check` refuses what the schema
refuses and those let through (pydantic's lax coercions such as ``"5"`` or
``true`` for an integer, ``" 1.5"`` or ``"1_0"`` for a Decimal; an offset that
is no time zone the schema lists; ...). So a client generated from the schema
is never refused for what the schema allows, and never accepted for what it
forbids.

What JSON Schema can say, it says: ids, patterns and lengths; Decimals as a
number on their decimal grid or as a string of digits
(:class:`WowJsonSchema`); integers within 64 bits; the condition grammar per
operator (which take a field, which a value of which shape, which children,
which options). What it cannot say (relations between parts of a request:
two sort entries on one field, overlapping projection paths, nesting deeper
than ``QUERY_MAX_DEPTH``, an ``expireAt`` after ``occurredAt``, a page cursor
that only the server can issue) is said in the descriptions and refused by
the server with a 400 naming the part.

Patterns are written for every regular-expression dialect that reads them —
ECMAScript (OpenAPI's), Python and Rust — with explicit character classes and
``\\u`` escapes of four hex digits only (no ``\\d``, ``\\s``, ``\\w``, whose meanings differ), and
Python reads a final ``$`` as the end of the text, as the others do.
"""

from __future__ import annotations

import functools
import math
import re
import zoneinfo
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from wow_django.application.gateway import MAX_ID_LENGTH, WaitStage, id_pattern, printable_characters
from wow_django.conf import wow_settings
from wow_django.query import dates
from wow_django.query.condition import (
    COMPARISON_OPERATORS,
    DATE_OPERATORS,
    FIELD_OPERATORS,
    IGNORE_CASE_OPERATORS,
    MAX_FIELD_PATH_LENGTH,
    MAX_FIELD_SEGMENTS,
    MAX_LIST_SIZE,
    MAX_OPTION_LENGTH,
    MAX_QUERY_TEXT,
    MAX_SKIP,
    MAX_SORT_FIELDS,
    MAX_TEXT_LENGTH,
    TEXT_OPERATORS,
    DeletionState,
    Direction,
    Operator,
)

REF = "#/components/schemas/{model}"
#: A pydantic model and the mode its JSON schema is rendered in: "validation" (what it takes, a command's) or
#: "serialization" (what it answers, a state's).
ModelMode = tuple[type[BaseModel], JsonSchemaMode]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: A number in a command or a bus event: within the 64-bit integer range (their JSON parser refuses an integer
#: outside it; JSON Schema cannot tell 1e20 from 100000000000000000000, so both are kept within it).
NUMBER = {"type": "number", "minimum": INT64_MIN, "maximum": INT64_MAX}
#: A number in a query: any (its parser reads an integer past 64 bits as the number it is, a float).
QUERY_NUMBER = {"type": "number"}


def choice(values: Iterable[str | None], **extra) -> dict:
    """One of ``values``. (Wrapped in a one-branch anyOf: drf-spectacular's enum post-processing, which renames
    and splits a property's own ``enum``, leaves it as written.)"""
    return {"anyOf": [{"enum": list(values)}], **extra}


def ref(name: str) -> dict:
    return {"$ref": REF.format(model=name)}


def integer(minimum: int, maximum: int) -> dict:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def _escape(code: int) -> str:
    return f"\\u{code:04x}"


def character_class(predicate) -> str:
    """A character class body (no brackets) of the Basic Multilingual Plane's characters ``predicate`` accepts."""
    parts, start = [], None
    for code in range(0x10001):
        accepted = code < 0x10000 and predicate(chr(code))
        if accepted and start is None:
            start = code
        elif not accepted and start is not None:
            end = code - 1
            parts.append(_escape(start) if start == end else f"{_escape(start)}-{_escape(end)}")
            start = None
    return "".join(parts)


@functools.cache
def whitespace_characters() -> str:
    """A character class body of what Python's ``str.isspace`` (a superset of Unicode's White_Space, which
    pydantic strips) calls whitespace."""
    return character_class(str.isspace)


@functools.cache
def path_characters() -> str:
    """The printable characters but '/': those of an id that a path segment can carry."""
    return character_class(lambda char: char.isprintable() and char != "/")


def stripped_text_pattern() -> str:
    """Text that neither starts nor ends with whitespace (so stripping it changes nothing), is not empty and
    holds no NUL character."""
    space = whitespace_characters()
    return f"^[^{space}\\u0000]([^\\u0000]*[^{space}\\u0000])?$"


NO_NUL = "^[^\\u0000]*$"

#: Strings a NUL-free pattern is checked against: one that matches none of them refuses NUL (a heuristic good for
#: the patterns this API writes: character classes, fixed shapes).
_NUL_PROBES = ("\x00", "a\x00", "\x00a", "a\x00a", "0\x00", "1\x00", "a.\x00")


def forbid_nul(schema):
    """``schema`` (changed in place, and returned) saying that no string of it holds a NUL character, as the API
    refuses them (PostgreSQL stores none): a plain string gets :data:`NO_NUL` as its pattern; one whose own
    pattern lets a NUL through gets it as well, in an ``allOf``; object keys likewise (``propertyNames``)."""
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
        if is_string and not ({"enum", "const", "format"} & set(node)):
            pattern = node.get("pattern")
            if pattern is None:
                node["pattern"] = NO_NUL
            elif not _refuses_nul(pattern) and not any(
                    isinstance(part, dict) and part.get("pattern") == NO_NUL for part in node.get("allOf", ())):
                node["allOf"] = [*node.get("allOf", ()), {"pattern": NO_NUL}]
        names = node.get("propertyNames")
        extra = node.get("additionalProperties")
        if names is None and (extra is True or isinstance(extra, dict)):
            node["propertyNames"] = {"pattern": NO_NUL}  # extra keys are taken: none with a NUL
        elif isinstance(names, dict) and "pattern" in names and not _refuses_nul(names["pattern"]):
            names["allOf"] = [*names.get("allOf", ()), {"pattern": NO_NUL}]
        for key, value in node.items():
            if key not in ("enum", "const", "examples", "example", "default") and isinstance(value, dict | list):
                pending.append(value)
    return schema


def _refuses_nul(pattern: str) -> bool:
    try:
        compiled = re.compile(pattern)
    except re.error:
        return False
    return not any(compiled.search(probe) for probe in _NUL_PROBES)
FIELD_PATH = {
    "type": "string", "minLength": 1, "maxLength": MAX_FIELD_PATH_LENGTH,
    "pattern": f"^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z0-9_]+){{0,{MAX_FIELD_SEGMENTS - 1}}}$",
    "description": "Names of letters, digits and '_' joined by '.', the first not starting with a digit.",
}
#: An absent, null or empty value: what an operator without an argument takes (Wow clients send "").
BLANK = {"anyOf": [{"enum": [None, ""]}]}
NO_CHILDREN = {"type": ["array", "null"], "maxItems": 0}
DATE_PATTERN_SEPARATOR = "[^A-Za-z'\\u0000]{0,3}"


@functools.cache
def time_zones() -> tuple[str, ...]:
    """The IANA zones this server knows (``zoneId`` takes one of them)."""
    found = []
    for name in sorted(zoneinfo.available_timezones()):
        try:
            zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            continue
        found.append(name)
    return tuple(found)


def _date_pattern() -> str:
    """Java-style patterns the date operators read: yyyy MM dd, then optionally HH mm ss SSS, with separators."""
    s = DATE_PATTERN_SEPARATOR
    return f"^yyyy{s}MM{s}dd({s}HH({s}mm({s}ss({s}SSS)?)?)?)?{s}$"


#: Every context alias a ``build_urlpatterns`` call of this process mounted (the OpenAPI document marks the
#: operations below one: each keeps an operationId of its own).
MOUNTED_ALIASES: set[str] = set()


# --- the condition grammar ------------------------------------------------------------------


def _names(operators) -> list[str]:
    return sorted(o.value for o in operators)


def _when(operators, then: dict, **also: dict) -> dict:
    """``then`` applies to a node whose operator is one of ``operators`` (and which matches ``also``)."""
    return {"if": {"properties": {"operator": {"enum": _names(operators)}, **also},
                   "required": ["operator", *also]}, "then": then}


def _required(name: str, schema: dict) -> dict:
    return {"required": [name], "properties": {name: schema}}


#: Operators without an argument: no value (absent, null or "").
NO_VALUE_OPERATORS = (frozenset({Operator.AND, Operator.OR, Operator.NOR, Operator.ALL, Operator.ELEM_MATCH,
                                 Operator.NULL, Operator.NOT_NULL, Operator.TRUE, Operator.FALSE})
                      | (DATE_OPERATORS - {Operator.RECENT_DAYS, Operator.EARLIER_DAYS, Operator.BEFORE_TODAY}))
ID_OPERATORS = frozenset({Operator.ID, Operator.AGGREGATE_ID, Operator.TENANT_ID, Operator.OWNER_ID,
                          Operator.SPACE_ID})
LIST_ID_OPERATORS = frozenset({Operator.IDS, Operator.AGGREGATE_IDS})
#: Operators about the whole stored document: not inside ELEM_MATCH (MATCH and RAW too).
WHOLE_DOCUMENT_OPERATORS = ID_OPERATORS | LIST_ID_OPERATORS | {Operator.DELETED, Operator.MATCH, Operator.RAW}


def _condition(kind: str, allow_raw: bool) -> dict:
    """One condition node: one object schema whose rules depend on its operator (``if``/``then``), so that
    generators and validators meet one shape, not one per operator. ``kind`` is where it stands: ``top`` (the
    query's condition and the ones below it) or ``element`` (inside ELEM_MATCH: no operator about the whole
    document). One rule is left to the server: MATCH stands at the top or below top-level ANDs only (not below
    OR or NOR), once per query — JSON Schema generators do not follow a rule that depends on the path there."""
    operators = {o for o in Operator if allow_raw or o is not Operator.RAW}
    if kind == "element":
        operators -= WHOLE_DOCUMENT_OPERATORS
    below = "WowElementCondition" if kind == "element" else "WowCondition"
    text = {"type": "string", "maxLength": MAX_TEXT_LENGTH, "pattern": NO_NUL}
    identifier = {"type": "string", "minLength": 1, "pattern": NO_NUL}
    values = {"type": "array", "maxItems": MAX_LIST_SIZE, "items": ref("WowValue")}
    children = {"type": "array", "maxItems": MAX_LIST_SIZE}
    and_children = {**children, "items": ref(below)}
    present = operators.__contains__
    rules = [
        _when(FIELD_OPERATORS & operators, _required("field", ref("WowFieldPath"))),
        _when(NO_VALUE_OPERATORS & operators, {"properties": {"value": BLANK}}),
        # Every value is a JSON value (WowValue, the base): EQ and NE take any; RAW's filter is its own.
        *([_when({Operator.EQ, Operator.NE}, {"properties": {"value": ref("WowValue")}})] if allow_raw else []),
        # With ignoreCase, a text value becomes a pattern: bounded.
        _when({Operator.EQ, Operator.NE}, {"properties": {"value": {"maxLength": MAX_TEXT_LENGTH}}},
              options={"type": "object", "required": ["ignoreCase"], "properties": {"ignoreCase": {"const": True}}}),
        _when(COMPARISON_OPERATORS, _required("value", {"anyOf": [{"type": "string"}, QUERY_NUMBER]})),
        _when(TEXT_OPERATORS, _required("value", text)),
        _when({Operator.IN, Operator.NOT_IN}, _required("value", values)),
        _when({Operator.ALL_IN}, _required("value", {**values, "minItems": 1})),
        _when({Operator.BETWEEN}, _required("value", {"anyOf": [
            {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string"}},
            {"type": "array", "minItems": 2, "maxItems": 2, "items": QUERY_NUMBER},
        ]})),
        _when({Operator.EXISTS}, {"properties": {"value": {"anyOf": [BLANK, {"type": "boolean"}]}}}),
        _when({Operator.RECENT_DAYS, Operator.EARLIER_DAYS}, _required("value", integer(1, dates.MAX_DAYS))),
        # Wow's time of day as whole seconds of the day. Wow's text form (HH:mm[:ss[.SSS]]) is read from Python
        # only: no string can join this branch without schemathesis' generator giving up on the grammar
        # (its canonical form of the condition node), and the HTTP API refuses what its document does not allow.
        _when({Operator.BEFORE_TODAY}, {"properties": {"value": {"anyOf": [
            BLANK, integer(0, dates.SECONDS_PER_DAY - 1)]}}}),
        _when({Operator.AND}, {"properties": {"children": and_children}}),
        _when({Operator.OR, Operator.NOR}, _required("children", {**children, "minItems": 1, "items": ref(below)})),
        _when({Operator.ELEM_MATCH}, _required("children", {**children, "minItems": 1,
                                                             "items": ref("WowElementCondition")})),
        _when(operators - {Operator.AND, Operator.OR, Operator.NOR, Operator.ELEM_MATCH},
              {"properties": {"children": NO_CHILDREN}}),
        _when(operators - IGNORE_CASE_OPERATORS,
              {"properties": {"options": {"properties": {"ignoreCase": {"type": "null"}}}}}),
        _when(operators - DATE_OPERATORS,
              {"properties": {"options": {"properties": {"zoneId": {"type": "null"}, "datePattern": {"type": "null"}}}}}),
    ]
    if kind != "element":
        rules += [
            _when(ID_OPERATORS, _required("value", identifier)),
            _when(LIST_ID_OPERATORS, _required("value", {"type": "array", "maxItems": MAX_LIST_SIZE,
                                                         "items": identifier})),
            _when({Operator.DELETED}, _required("value", choice([s.value for s in DeletionState]))),
        ]
    if present(Operator.MATCH):
        rules.append(_when({Operator.MATCH}, _required("value", ref("WowMatchText"))))
    if present(Operator.RAW):
        rules.append(_when({Operator.RAW}, _required("value", {"type": ["object", "string"]})))
    return {
        "type": "object",
        "properties": {
            "operator": choice(_names(operators)),
            "field": {"type": ["string", "null"], "description": "The field path (for the operators that take one)."},
            "value": {**({} if allow_raw else ref("WowValue")),
                      "description": "The operator's argument; its shape depends on the operator."},
            "children": {"type": ["array", "null"], "maxItems": MAX_LIST_SIZE,
                         "description": "The conditions below (AND, OR, NOR, ELEM_MATCH)."},
            "options": {
                "type": ["object", "null"],
                "properties": {
                    "ignoreCase": {"type": ["boolean", "null"], "description": "EQ, NE and the text operators."},
                    "zoneId": {"anyOf": [ref("WowZoneId"), {"type": "null"}],
                               "description": "The date operators' IANA time zone (default UTC)."},
                    "datePattern": {"type": ["string", "null"], "maxLength": MAX_OPTION_LENGTH,
                                    "pattern": _date_pattern(),
                                    "description": "The date operators on a text field: its pattern "
                                                   "(yyyy MM dd, then HH mm ss SSS), e.g. yyyy-MM-dd."},
                },
                "additionalProperties": False,
            },
        },
        "required": ["operator"],
        "additionalProperties": False,
        "allOf": [rule for rule in rules if rule["if"]["properties"]["operator"]["enum"]],
    }


def condition_components(allow_raw: bool) -> dict[str, dict]:
    """``WowCondition`` (a query's condition), the conditions below it and their parts."""
    space = whitespace_characters()
    operators = sorted(o.value for o in Operator if allow_raw or o is not Operator.RAW)
    top = _condition("top", allow_raw)
    top["description"] = (
        "A condition: `operator` (" + ", ".join(operators) + ") with what it takes — a `field` path "
        "(comparisons, text, lists, NULL/EXISTS-style tests, dates, ELEM_MATCH), a `value` of its shape, "
        "`children` (AND, OR, NOR, ELEM_MATCH) and `options` (ignoreCase for EQ, NE and the text operators; "
        "zoneId and datePattern for the date operators). MATCH (full text, once per query) stands at the top "
        "or below top-level ANDs only, not below OR or NOR; inside ELEM_MATCH the operators about the whole document (ids, tenant, owner, "
        "DELETED, MATCH, RAW) are not allowed. Conditions nest at most "
        f"{wow_settings.QUERY_MAX_DEPTH} levels (QUERY_MAX_DEPTH). The texts of all the text conditions "
        f"together (CONTAINS, STARTS_WITH, ENDS_WITH, MATCH, EQ and NE on text) hold at most {MAX_QUERY_TEXT:,} "
        "characters. On an SQL database (the django storage) a query also has a size budget that the whole of "
        "its condition, sort and projection counts against (each condition and value 1, each step of a field "
        "path through JSON more): a query over it is refused with a 400 naming the part that passed it."
        + ("" if allow_raw else " RAW is disabled on this server (QUERY_ALLOW_RAW).")
    )
    return {
        "WowFieldPath": FIELD_PATH,
        "WowZoneId": {**choice(time_zones()), "description": "An IANA time zone this server knows (default UTC)."},
        "WowValue": {
            "description": "A JSON value: no object key starts with '$' or holds NUL.",
            "anyOf": [{"type": "string"}, ref("WowNonTextValue")],
        },
        "WowNonTextValue": {"anyOf": [
            QUERY_NUMBER, {"type": "boolean"}, {"type": "null"},
            {"type": "array", "maxItems": MAX_LIST_SIZE, "items": ref("WowValue")},
            {"type": "object", "propertyNames": {"pattern": "^([^$\\u0000][^\\u0000]*)?$"},
             "additionalProperties": ref("WowValue")},
        ]},
        "WowCondition": top,
        "WowElementCondition": _condition("element", allow_raw),
        "WowMatchText": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_LENGTH,
                         "pattern": f"^[^\\u0000]*[^\\u0000{space}][^\\u0000]*$",
                         "description": "Words to search for (full text)."},
    }


# --- decimals, integers and stripped text in the command schemas ---------------------------------------


class WowJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON Schema, saying what the API really takes (validation mode).

    * a ``Decimal`` is a JSON number on its grid (``multipleOf`` 10^-decimal_places, within the bounds and
      max_digits) or, where its bounds allow a pattern to say it (none, or 0 below), a string of plain
      digits (``"12.50"``: no sign but '-', no exponent, spaces or '_');
    * an ``int`` or ``float`` lies within 64 bits (the JSON parser refuses bigger integers);
    * text pydantic strips (``strip_whitespace``) neither starts nor ends with whitespace;
    * anything else (``Any``, the extra fields a model ignores) is JSON the parser reads: ``WowJSON``.
    """

    def decimal_schema(self, schema) -> dict:
        if self.mode != "validation":
            return {"type": ["number", "string"]}
        places, digits = schema.get("decimal_places"), schema.get("max_digits")
        whole_digits = digits - places if digits is not None and places is not None else digits
        number: dict[str, Any] = {"type": "number"}
        for key, keyword in (("gt", "exclusiveMinimum"), ("ge", "minimum"), ("lt", "exclusiveMaximum"),
                             ("le", "maximum")):
            if schema.get(key) is not None:
                number[keyword] = _json_number(schema[key])
        limit = 10**whole_digits if whole_digits is not None else INT64_MAX
        _tighten(number, "maximum", "exclusiveMaximum", limit, upper=True)
        _tighten(number, "minimum", "exclusiveMinimum", -limit, upper=False)
        if schema.get("multiple_of") is not None:
            number["multipleOf"] = _json_number(schema["multiple_of"])
        elif places is not None:
            number["multipleOf"] = 1 if places == 0 else float(f"1e-{places}")
        text = _decimal_text(schema, whole_digits, places, digits)
        return {"anyOf": [number, text]} if text is not None else number

    def int_schema(self, schema) -> dict:
        found = super().int_schema(schema)
        if self.mode == "validation":
            _tighten(found, "maximum", "exclusiveMaximum", INT64_MAX, upper=True, inclusive=True)
            _tighten(found, "minimum", "exclusiveMinimum", INT64_MIN, upper=False, inclusive=True)
        return found

    def float_schema(self, schema) -> dict:
        found = super().float_schema(schema)
        if self.mode == "validation":
            _tighten(found, "maximum", "exclusiveMaximum", INT64_MAX, upper=True, inclusive=True)
            _tighten(found, "minimum", "exclusiveMinimum", INT64_MIN, upper=False, inclusive=True)
        return found

    def any_schema(self, schema) -> dict:
        return ref("WowJSON") if self.mode == "validation" else super().any_schema(schema)

    def model_schema(self, schema) -> dict:
        found = super().model_schema(schema)
        if self.mode == "validation" and found.get("type") == "object" and "additionalProperties" not in found:
            found["additionalProperties"] = ref("WowJSON")  # extra fields pydantic ignores: still JSON the API reads
        return found

    def str_schema(self, schema) -> dict:
        found = super().str_schema(schema)
        if self.mode == "validation" and schema.get("strip_whitespace") and "pattern" not in found:
            found["pattern"] = stripped_text_pattern()
        if self.mode == "validation":
            forbid_nul(found)  # the API refuses NUL characters anywhere
        return found


def _json_number(value) -> int | float:
    if isinstance(value, int):
        return value
    value = Decimal(str(value))
    return int(value) if value == value.to_integral_value() else float(value)


def _tighten(schema: dict, inclusive_key: str, exclusive_key: str, bound, *, upper: bool,
             inclusive: bool = False) -> None:
    """Add ``bound`` (exclusive unless ``inclusive``) unless the schema's own bound is already as tight."""
    for key in (inclusive_key, exclusive_key):
        if key in schema and (schema[key] <= bound if upper else schema[key] >= bound):
            return
    schema.pop(inclusive_key, None)
    schema.pop(exclusive_key, None)
    schema[inclusive_key if inclusive else exclusive_key] = bound


def _decimal_text(schema, whole_digits: int | None, places: int | None, digits: int | None) -> dict | None:
    """The string form of a Decimal as a pattern, or None where its bounds are more than a pattern can say."""
    if schema.get("multiple_of") is not None or whole_digits == 0:
        return None
    lower = {key: schema[key] for key in ("gt", "ge") if schema.get(key) is not None}
    upper = [schema[key] for key in ("lt", "le") if schema.get(key) is not None]
    if upper and (whole_digits is None or any(Decimal(str(u)) < 10**whole_digits for u in upper)):
        return None
    positive = lower == {"gt": 0}
    if lower and not positive and lower != {"ge": 0}:
        return None

    def fraction(whole: int) -> int | None:
        """The most fraction digits after ``whole`` whole digits (None: any)."""
        if places is not None:
            return places
        return digits - whole if digits is not None else None

    def tail(most: int | None) -> str:
        return "" if most == 0 else ("(\\.[0-9]+)?" if most is None else f"(\\.[0-9]{{1,{most}}})?")

    if whole_digits is None:
        alternatives = [f"[1-9][0-9]*{tail(places)}"]
    elif places is not None:  # the same fraction after any whole part
        alternatives = [f"[1-9][0-9]{{0,{whole_digits - 1}}}{tail(places)}"]
    else:  # max_digits alone: the fewer whole digits, the more fraction digits
        alternatives = [f"[1-9][0-9]{{{count - 1}}}{tail(fraction(count))}" for count in range(1, whole_digits + 1)]
    after_zero = places if places is not None else digits  # 0.001 has as many digits as decimals
    if not positive:
        alternatives.append(f"0{tail(after_zero)}")
    elif after_zero is None:
        alternatives.append("0\\.[0-9]*[1-9][0-9]*")
    elif after_zero > 0:  # above 0: 0.x with a digit other than 0 among at most after_zero
        alternatives.append("0\\.(" + "|".join(f"0{{{zeros}}}[1-9][0-9]{{0,{after_zero - zeros - 1}}}"
                                                for zeros in range(after_zero)) + ")")
    sign = "" if lower else "-?"
    return {"type": "string", "pattern": f"^{sign}({'|'.join(alternatives)})$",
            "description": "The decimal as text: plain digits, an optional '.' and fraction."}


@functools.lru_cache(maxsize=16)
def pydantic_schemas(models: tuple[ModelMode, ...]) -> tuple[dict, dict]:
    """``(keys, definitions)`` of ``models`` (``(model, mode)`` pairs) rendered together by
    :class:`WowJsonSchema`, referring to each other as OpenAPI components."""
    keys, definitions = models_json_schema(list(models), ref_template=REF, schema_generator=WowJsonSchema)
    return keys, definitions.get("$defs", {})


# --- the API's shared components --------------------------------------------------------------------


def _limits() -> tuple:
    return (wow_settings.QUERY_MAX_PAGE_SIZE, wow_settings.QUERY_MAX_LIMIT, wow_settings.QUERY_ALLOW_RAW,
            wow_settings.QUERY_MAX_DEPTH)


def wow_components() -> dict[str, dict]:
    """The components every Wow API schema shares, by name (for the current ``QUERY_*`` settings)."""
    return _wow_components(_limits())


@functools.lru_cache(maxsize=8)
def _wow_components(limits: tuple) -> dict[str, dict]:
    max_page_size, max_limit, allow_raw, _depth = limits
    string = {"type": "string"}
    paths = {"type": ["array", "null"], "items": ref("WowFieldPath"), "maxItems": MAX_LIST_SIZE, "uniqueItems": True,
             "description": "Field paths, none of them another's parent or repeated."}
    query_parts = {
        "condition": {"anyOf": [ref("WowCondition"), {"type": "null"}], "description": "null: every document."},
        "projection": {"anyOf": [ref("WowProjection"), {"type": "null"}]},
        "sort": {"type": ["array", "null"], "items": ref("WowSortField"), "maxItems": MAX_SORT_FIELDS,
                 "description": "At most one entry per field."},
    }
    return {
        "WowJSON": {"description": "Any JSON value the API reads: numbers within 64 bits.", "anyOf": [
            {"type": ["string", "boolean", "null"]}, NUMBER,
            {"type": "array", "items": ref("WowJSON")}, {"type": "object", "additionalProperties": ref("WowJSON")}]},
        "WowId": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH, "pattern": id_pattern(),
                  "description": f"An id: 1 to {MAX_ID_LENGTH} printable characters of the Basic Multilingual "
                                 "Plane (no control, format, separator or private-use character)."},
        "WowPathId": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH,
                      "pattern": f"^[{path_characters()}]{{1,{MAX_ID_LENGTH}}}$",
                      "description": "An id in a path: an id without '/' (no route holds one)."},
        "WowBindingError": {
            "type": "object",
            "properties": {"name": {**string, "description": "The offending field, path or header."},
                           "msg": {**string, "description": "The rule it breaks."}},
            "required": ["name", "msg"],
        },
        "WowError": {
            "type": "object",
            "description": "Every error: a stable code (Wow's ErrorCodes where Wow has one), a message saying what "
                           "to do, and the offending inputs.",
            "properties": {
                "errorCode": string,
                "errorMsg": string,
                "bindingErrors": {"type": "array", "items": ref("WowBindingError")},
            },
            "required": ["errorCode", "errorMsg", "bindingErrors"],
        },
        **condition_components(allow_raw),
        "WowCountQuery": {"anyOf": [ref("WowCondition"), {"type": ["object", "null"], "maxProperties": 0}],
                          "description": "A bare condition (as Wow's count); {} or null counts every document."},
        "WowProjection": {
            "type": "object",
            "description": "Return only `include`d fields (plus the id), or all but `exclude`d ones; not both.",
            "properties": {"include": paths, "exclude": paths},
            "not": {"required": ["include", "exclude"],
                    "properties": {"include": {"minItems": 1}, "exclude": {"minItems": 1}}},
            "additionalProperties": False,
        },
        "WowSortField": {
            "type": "object",
            "properties": {"field": ref("WowFieldPath"),
                           "direction": choice([*(d.value for d in Direction), None],
                                               description="ASC (default) or DESC.")},
            "required": ["field"],
            "additionalProperties": False,
        },
        "WowPagination": {
            "type": "object",
            "properties": {
                # Every page of every size starts within MongoDB's 32-bit skip.
                "index": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_SKIP // max_page_size + 1,
                          "description": "The page, from 1 (default 1)."},
                "size": {"type": ["integer", "null"], "minimum": 1, "maximum": max_page_size,
                         "description": f"Items per page (default {min(10, max_page_size)})."},
            },
            "additionalProperties": False,
        },
        # null: the query with every part at its default.
        "WowSingleQuery": {"type": ["object", "null"], "properties": query_parts, "additionalProperties": False},
        "WowListQuery": {"type": ["object", "null"], "additionalProperties": False, "properties": {
            **query_parts,
            "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": max_limit,
                      "description": f"At most this many (default {min(10, max_limit)})."}}},
        "WowPagedQuery": {"type": ["object", "null"], "additionalProperties": False, "properties": {
            **query_parts, "pagination": {"anyOf": [ref("WowPagination"), {"type": "null"}]}}},
        "WowCommandResult": {
            "type": "object",
            "description": "Wow's CommandResult (with wow_django's events and duplicate).",
            "properties": {
                "id": {**string, "description": "This result's own id (Wow's signal id)."},
                "waitCommandId": {**string, "description": "The command waited for: commandId."},
                "contextName": string,
                "function": {
                    "type": "object", "description": "What produced this result: the aggregate's command handler.",
                    "properties": {"functionKind": string, "contextName": string, "processorName": string,
                                   "name": string},
                    "required": ["functionKind", "contextName", "processorName", "name"],
                },
                "result": {"type": "object", "description": "The command's result data (none: {})."},
                "signalTime": {"type": "integer", "description": "When this result was signalled (epoch ms)."},
                "succeeded": {"type": "boolean", "description": "errorCode is Ok."},
                "commandId": string,
                "requestId": string,
                "aggregateName": string,
                "aggregateId": string,
                "tenantId": string,
                "aggregateVersion": {"type": ["integer", "null"]},
                "stage": choice([s.value for s in WaitStage]),
                "events": {"type": "array", "items": string},
                "duplicate": {"type": "boolean"},
                "errorCode": {**string, "description": "Ok, or why the asked stage was not confirmed "
                              "(RequestTimeout, DispatchFailed): the events are stored either way."},
                "errorMsg": string,
                "bindingErrors": {"type": "array", "items": ref("WowBindingError")},
            },
            "required": ["id", "waitCommandId", "contextName", "function", "result", "signalTime", "succeeded",
                         "commandId", "requestId", "aggregateName", "aggregateId", "tenantId", "aggregateVersion",
                         "stage", "events", "duplicate", "errorCode", "errorMsg", "bindingErrors"],
        },
        "WowSnapshot": {
            "type": "object",
            "description": "A snapshot (read model); a projection may leave fields out.",
            "properties": {
                "aggregateId": string, "contextName": string, "aggregateName": string, "tenantId": string,
                "ownerId": string, "version": {"type": "integer"}, "eventId": string, "firstOperator": string,
                "operator": string, "firstEventTime": {"type": "integer"}, "eventTime": {"type": "integer"},
                "snapshotTime": {"type": "integer"}, "deleted": {"type": "boolean"},
                "state": {"type": "object", "description": "The aggregate's state."},
            },
        },
        "WowDomainEvent": {
            "type": "object",
            "properties": {"id": string, "name": string, "revision": string, "bodyType": string,
                           "body": {"type": "object"}},
        },
        "WowEventStream": {
            "type": "object",
            "description": "The events one command produced; a projection may leave fields out.",
            "properties": {
                "id": string, "contextName": string, "aggregateName": string, "aggregateId": string,
                "tenantId": string, "ownerId": string, "requestId": string, "commandId": string,
                "version": {"type": "integer"}, "header": {"type": "object"},
                "body": {"type": "array", "items": ref("WowDomainEvent")}, "size": {"type": "integer"},
                "createTime": {"type": "integer", "description": "Epoch milliseconds."},
            },
        },
        "WowPagedSnapshotList": {
            "type": "object",
            "properties": {"total": {"type": "integer", "minimum": 0},
                           "list": {"type": "array", "items": ref("WowSnapshot")}},
            "required": ["total", "list"],
        },
        "WowPagedEventStreamList": {
            "type": "object",
            "properties": {"total": {"type": "integer", "minimum": 0},
                           "list": {"type": "array", "items": ref("WowEventStream")}},
            "required": ["total", "list"],
        },
        **bus_components(max_page_size),
    }


# --- the bus ----------------------------------------------------------------------------------------------

#: A date-time the bus reads (ISO 8601; no offset is UTC), as a pattern that allows real dates only (the days of
#: each month, February 29 in leap years) in years 1000 to 8999 (far from the edges where an offset would leave
#: Python's and MongoDB's range), offsets up to ±14:00.
_YEAR = "[1-8][0-9]{3}"
_LEAP_YEAR = "([1-8][0-9](0[48]|[2468][048]|[13579][26])|(1[26]|[2468][048]|[357][26])00)"
BUS_TIME_PATTERN = (
    f"^({_YEAR}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|{_YEAR}-(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    f"|{_YEAR}-02-(0[1-9]|1[0-9]|2[0-8])|{_LEAP_YEAR}-02-29)"
    "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9]|[+-]14:00)?$"
)


def bus_components(max_page_size: int) -> dict[str, dict]:
    """The bus endpoints' bodies and answers."""
    from wow_django.bus.envelope import CONSUMER_ID_RE, ID_RE, MAX_SEQUENCE, MAX_TOPIC_LENGTH, TOPIC_RE
    from wow_django.conf import KEY_NAME_RE, MAX_KEYS
    from wow_django.persistence.bus import EventStatus

    def optional(schema: dict) -> dict:
        return {"anyOf": [BLANK, schema]}

    event_id = {"type": "string", "maxLength": 128, "pattern": ID_RE.pattern}
    consumer_id = {"type": "string", "maxLength": 100, "pattern": CONSUMER_ID_RE.pattern,
                   "description": "Letters, digits, '.', '_' or '-', starting with a letter or digit."}
    text = {"allOf": [ref("WowPrintable")], "minLength": 1, "maxLength": 200}
    string, nullable_string = {"type": "string"}, {"type": ["string", "null"]}
    statuses = [s.value for s in EventStatus]
    return {
        "WowPayload": {
            "description": "A JSON value: no object key starts with '$' or holds NUL; numbers within 64 bits (a "
                           "bigger integer goes as a string); nested at most 32 deep.",
            "anyOf": [{"type": ["string", "boolean", "null"]}, NUMBER,
                      {"type": "array", "items": ref("WowPayload")},
                      {"type": "object", "propertyNames": {"pattern": "^([^$\\u0000][^\\u0000]*)?$"},
                       "additionalProperties": ref("WowPayload")}],
        },
        "WowPrintable": {"type": "string", "pattern": f"^[{printable_characters()}]*$",
                         "description": "Printable text (characters of the Basic Multilingual Plane)."},
        "WowBusTime": {"type": "string", "pattern": BUS_TIME_PATTERN,
                       "description": "ISO 8601 date-time with seconds, e.g. 2024-02-28T10:00:00Z (no offset: "
                                      "UTC), in years 1000 to 8999."},
        "WowTopic": {"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_LENGTH, "pattern": TOPIC_RE.pattern,
                     "description": "Words of letters, digits, '_' or '-' separated by '.' (order.purchased)."},
        "WowConsumerId": consumer_id,
        "WowEnvelope": {
            "type": "object",
            "description": "An integration event (wire form). Missing ids, times and the initiator are filled in; "
                           "expireAt must be later than occurredAt (default: now); a sequence needs a partitionKey; "
                           "a payloadType other than application/json takes a string payload (or null).",
            "properties": {
                **{name: optional(event_id) for name in ("eventId", "traceId", "spanId", "parentEventId")},
                "topic": ref("WowTopic"),
                "payload": {**ref("WowPayload"), "description": "Any JSON (null for none), at most 1 MiB."},
                "payloadType": optional({"allOf": [ref("WowPrintable")], "minLength": 1, "maxLength": 100}),
                "initiator": {"type": ["object", "null"], "additionalProperties": False,
                              "properties": {name: optional(text)
                                             for name in ("service", "operation", "userId", "clientRequestId")}},
                **{name: optional(ref("WowBusTime")) for name in ("occurredAt", "sentAt", "expireAt")},
                "contractVersion": {"type": ["integer", "null"], "minimum": 1, "maximum": 10_000},
                "partitionKey": optional(text),
                "sequence": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEQUENCE},
                "keys": {"type": ["object", "null"], "maxProperties": MAX_KEYS,
                         "propertyNames": {"pattern": KEY_NAME_RE.pattern}, "additionalProperties": text,
                         "description": "Search keys (name: text) the event is found by, e.g. {\"orderId\": "
                                        "\"o-1\"}; with the payload fields of WOW['BUS_SEARCH_FIELDS'], at most "
                                        f"{MAX_KEYS} in all."},
            },
            "required": ["topic", "payload"],
            "additionalProperties": False,
            "allOf": [
                {"anyOf": [{"not": {"required": ["sequence"]}}, {"properties": {"sequence": {"type": "null"}}},
                           {"required": ["partitionKey"], "properties": {"partitionKey": {"type": "string",
                                                                                         "minLength": 1}}}]},
                {"anyOf": [{"not": {"required": ["payloadType"]}},
                           {"properties": {"payloadType": choice([None, "", "application/json"])}},
                           {"properties": {"payload": {"type": ["string", "null"]}}}]},
            ],
        },
        "WowRepush": {"type": "object", "additionalProperties": False,
                      "properties": {"consumerId": optional(consumer_id)},
                      "description": "{} re-pushes to every consumer; consumerId to that consumer's queue only."},
        "WowTopicConsumerChange": {
            "type": "object", "additionalProperties": False, "required": ["topic", "consumerId"],
            "properties": {"topic": ref("WowTopic"), "consumerId": consumer_id,
                           "enabled": {"type": "boolean", "description": "Default true."},
                           "description": {"type": ["string", "null"], "maxLength": 500}},
        },
        "WowFeedback": {
            "type": "object", "additionalProperties": False, "required": ["eventId", "success"],
            "properties": {"eventId": {"type": "string", "minLength": 1},
                           "consumerId": {**optional(consumer_id),
                                          "description": "If given, the token's own consumer id."},
                           "success": {"type": "boolean"},
                           "error": {**nullable_string, "description": "Why it failed (cut to 4000 characters)."}},
        },
        "WowBusEvent": {
            "type": "object", "required": ["eventId", "topic", "status"],
            "properties": {
                "eventId": string, "traceId": string, "spanId": string, "parentEventId": nullable_string,
                "topic": string, "payload": {}, "payloadType": string, "initiator": {"type": "object"},
                "occurredAt": string, "sentAt": nullable_string, "expireAt": nullable_string,
                "contractVersion": {"type": "integer"}, "partitionKey": nullable_string,
                "sequence": {"type": ["integer", "null"]}, "status": choice(statuses),
                "statusAt": nullable_string, "retryCount": {"type": "integer"}, "lastSentAt": nullable_string,
                "lastError": nullable_string, "consumers": {"type": "array", "items": string},
                "keys": {"type": "object", "additionalProperties": string,
                         "description": "The search keys it is found by (the key filter: name=value)."},
                "consumption": {
                    "type": "object", "description": "n of m expected consumers consumed it.",
                    "required": ["consumed", "expected", "failed", "text", "lastFailure"],
                    "properties": {
                        "consumed": {"type": "integer", "minimum": 0}, "expected": {"type": "integer", "minimum": 0},
                        "failed": {"type": "integer", "minimum": 0}, "text": string,
                        "lastFailure": {"anyOf": [{"type": "null"}, {
                            "type": "object", "required": ["consumerId", "attemptNo", "error", "at"],
                            "description": "The latest failed attempt of an expected consumer (its first line).",
                            "properties": {"consumerId": string, "attemptNo": {"type": ["integer", "null"]},
                                           "error": string, "at": nullable_string}}]},
                    },
                },
            },
        },
        "WowBusEventPage": {"anyOf": [
            {"type": "object", "required": ["total", "page", "size", "list"], "description": "By page number.",
             "properties": {"total": {"type": "integer", "minimum": 0}, "page": {"type": "integer"},
                            "size": {"type": "integer"}, "list": {"type": "array", "items": ref("WowBusEvent")}}},
            {"type": "object", "required": ["size", "list", "next", "previous"], "description": "By cursor.",
             "properties": {"size": {"type": "integer"}, "list": {"type": "array", "items": ref("WowBusEvent")},
                            "next": {**nullable_string, "description": "The cursor of the next page."},
                            "previous": {**nullable_string,
                                         "description": "The page before it: give it as before (None on the first "
                                                        "page)."}}},
        ]},
        "WowBusEventDetail": {
            "type": "object", "required": ["event", "consumers", "parent", "children", "repushes"],
            "properties": {
                "event": ref("WowBusEvent"),
                "consumers": {"type": "array", "items": {
                    "type": "object", "required": ["consumerId", "expected", "state", "attempts"],
                    "properties": {"consumerId": string, "expected": {"type": "boolean"},
                                   "state": choice(["CONSUMED", "FAILED", "WAITING"]),
                                   "attempts": {"type": "array", "items": {"type": "object"}}}}},
                "parent": {"anyOf": [ref("WowBusEvent"), {"type": "null"}]},
                "children": {"type": "array", "items": ref("WowBusEvent")},
                "repushes": {"type": "array", "items": {"type": "object"}},
            },
        },
        "WowTrace": {
            "type": "object", "required": ["traceId", "total", "truncated", "timeline", "tree"],
            "properties": {"traceId": string, "total": {"type": "integer"}, "truncated": {"type": "boolean"},
                           "timeline": {"type": "array", "items": ref("WowBusEvent")},
                           "tree": {"type": "array", "items": {"type": "object"}}},
        },
        "WowSendResult": {
            "type": "object", "required": ["eventId", "status", "stored", "duplicate", "consumers", "error"],
            "properties": {"eventId": string, "status": choice([*statuses, None]),
                           "stored": {"type": "boolean", "description": "false: no enabled consumer for the topic "
                                                                       "(nothing stored or published)."},
                           "duplicate": {"type": "boolean"}, "consumers": {"type": "array", "items": string},
                           "error": nullable_string},
        },
        "WowRepushResult": {
            "type": "object", "required": ["eventId", "consumerId", "retryCount", "status", "requestedBy"],
            "properties": {"eventId": string, "consumerId": nullable_string, "retryCount": {"type": "integer"},
                           "status": string, "requestedBy": string, "requestedAt": nullable_string},
        },
        "WowTopicConsumer": {
            "type": "object", "required": ["topic", "consumerId", "enabled"],
            "properties": {"topic": string, "consumerId": string, "enabled": {"type": "boolean"},
                           "description": nullable_string},
        },
        "WowTopicConsumerList": {"type": "object", "required": ["list"],
                                 "properties": {"list": {"type": "array", "items": ref("WowTopicConsumer")}}},
        "WowFeedbackResult": {
            "type": "object", "required": ["eventId", "consumerId", "attemptNo", "success"],
            "properties": {"eventId": string, "consumerId": string, "attemptNo": {"type": "integer"},
                           "success": {"type": "boolean"}},
        },
        "WowBusPageSize": integer(1, max_page_size),
    }


# --- holding a request to the schema ------------------------------------------------------------------


def python_pattern(pattern: str) -> str:
    """``pattern`` as Python reads ECMAScript: a ``$`` outside a class is the end of the text (``\\Z``)."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char == "$" and not in_class:
            out.append("\\Z")
        else:
            out.append(char)
    return "".join(out)


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(python_pattern(pattern))


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"does not match the pattern {_short(pattern)}")


def _multiple_of(validator, divisor, instance, schema):
    """Exactly, on the number as sent (a Decimal from the command parser, an int or a float)."""
    if not validator.is_type(instance, "number"):
        return
    if isinstance(instance, float) and not math.isfinite(instance):
        return
    if Decimal(str(instance)) % Decimal(str(divisor)) != 0:
        yield ValidationError(f"{_short(repr(instance))} is not a multiple of {divisor}")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_integer(checker, instance) -> bool:
    """JSON Schema's integer: any number with no fraction (``5``, and ``5.0`` as the command parser reads it)."""
    if isinstance(instance, bool):
        return False
    if isinstance(instance, int):
        return True
    return isinstance(instance, float | Decimal) and math.isfinite(instance) and instance == int(instance)


_Validator = jsonschema.validators.extend(
    Draft202012Validator, {"pattern": _pattern, "multipleOf": _multiple_of},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@functools.lru_cache(maxsize=64)
def _validator(name: str, limits: tuple, models: tuple[ModelMode, ...] | None) -> Any:
    components = _wow_components(limits) if models is None else _command_components(models, limits)
    return _Validator({"components": {"schemas": components}, "$ref": REF.format(model=name)})


def violations(instance: Any, name: str, models: tuple[ModelMode, ...] | None = None) -> list[dict]:
    """The binding errors (``{name, msg}``) of ``instance`` against the component ``name`` — a shared one, or with
    ``models`` one of theirs (:func:`component_name`) — deepest first; empty when it conforms."""
    validator = _validator(name, _limits(), models)
    found = []
    for error in sorted(validator.iter_errors(instance), key=lambda e: -len(e.absolute_path)):
        leaf = _leaf(error)
        found.append({"name": _path(leaf.absolute_path) or "(body)", "msg": _message(leaf)})
    return found


def _leaf(error: ValidationError) -> ValidationError:
    """The most specific error below an ``anyOf``: the branch that went deepest."""
    while error.context:
        error = max(error.context, key=lambda e: (len(e.absolute_path), -len(e.context or ())))
    return error


def _message(error: ValidationError) -> str:
    if error.validator == "anyOf":
        return "is none of the shapes this part takes (see the OpenAPI schema)"
    if error.validator in ("pattern", "multipleOf"):
        return error.message
    return _short(error.message, 200)


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def command_components(models: tuple[ModelMode, ...]) -> dict[str, dict]:
    """The components a command body is checked against: the shared ones and every command's."""
    return _command_components(models, _limits())


@functools.lru_cache(maxsize=16)
def _command_components(models: tuple[ModelMode, ...], limits: tuple) -> dict[str, dict]:
    _keys, definitions = pydantic_schemas(models)
    return {**_wow_components(limits), **definitions}


def component_name(model: type[BaseModel], mode: JsonSchemaMode, models: tuple[ModelMode, ...]) -> str:
    keys, _ = pydantic_schemas(models)
    return keys[(model, mode)]["$ref"].rsplit("/", 1)[-1]


__all__ = [
    "NUMBER", "QUERY_NUMBER", "REF", "ModelMode", "WowJsonSchema", "choice", "command_components", "component_name",
    "condition_components", "integer", "pydantic_schemas", "python_pattern", "ref", "time_zones", "violations",
    "wow_components",
]

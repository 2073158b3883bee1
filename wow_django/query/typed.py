"""Conditions on typed fields: a Decimal field compares as a number, a time field in time order.

A client writes ``{"field": "state.total_amount", "operator": "GT", "value": 50}``
or ``"value": "50.00"``; ``{"field": "state.placed_at", "operator": "GTE",
"value": "2026-12-01T08:00:00+08:00"}`` or epoch milliseconds. What the field
holds is known from the aggregate's model (its ``State``, its events), so the
values are brought to the stored type before any backend compiles the
condition (:mod:`wow_django.domain.values` says how values are stored):

==========  ===================================================================
field type  condition values become
==========  ===================================================================
Decimal     ``Decimal`` (from a number or numeric text): EQ NE GT GTE LT LTE
            IN NOT_IN ALL_IN BETWEEN. Anything else is a 400 naming the field.
datetime    canonical time text (from ISO-8601 text, with or without an offset,
            or epoch milliseconds): the same operators. The date operators
            (TODAY … EARLIER_DAYS) become bounds in that text, in the
            condition's ``zoneId`` (``datePattern`` does not apply: the field's
            type says how it is stored).
==========  ===================================================================

Null values (EQ null, IN with null) are left alone, as are fields of other types
and fields the model does not declare (``Any``, dicts, unknown paths). Pure: no
Django, no pymongo.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import types
import typing
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from wow_django.domain.values import canonical_time, parse_time
from wow_django.query import dates
from wow_django.query.condition import Condition, Operator, and_conditions, decimal_problem, space_condition
from wow_django.query.errors import QueryValidationError

Op = Operator


class ValueType(StrEnum):
    DECIMAL = "decimal"
    TIME = "time"


Resolver = Callable[[str], "ValueType | None"]

_SINGLE = frozenset({Op.EQ, Op.NE, Op.GT, Op.GTE, Op.LT, Op.LTE})
_MANY = frozenset({Op.IN, Op.NOT_IN, Op.ALL_IN, Op.BETWEEN})
_CONTAINERS = (list, tuple, set, frozenset, typing.Sequence, typing.AbstractSet)


# --- what a model declares ----------------------------------------------------------------


def _kind(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and ``Optional``; a union of several types is left as is."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(members[0]) if len(members) == 1 else annotation
    return annotation


def annotation_type(annotation: Any, segments: tuple[str, ...]) -> ValueType | None:
    """The type of the value at ``segments`` below a field declared as ``annotation`` (None: not typed)."""
    annotation = _kind(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found = {annotation_type(member, segments) for member in typing.get_args(annotation)
                 if member is not type(None)}
        return found.pop() if len(found) == 1 else None
    if origin is not None and (origin in _CONTAINERS or (isinstance(origin, type)
                                                          and issubclass(origin, list | tuple | set | frozenset))):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if not args:
            return None
        element = args[0] if len({repr(a) for a in args}) == 1 else typing.Union[tuple(args)]  # noqa: UP007
        if segments and segments[0].isdigit():  # an index into the array
            segments = segments[1:]
        return annotation_type(element, segments)
    if origin is not None and isinstance(origin, type) and issubclass(origin, dict):
        key_value = typing.get_args(annotation)
        if len(key_value) != 2 or not segments:
            return None
        return annotation_type(key_value[1], segments[1:])
    if not segments:
        if annotation is Decimal:
            return ValueType.DECIMAL
        if annotation is dt.datetime:
            return ValueType.TIME
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return model_type(annotation, segments)
    return None


def model_type(model: type[BaseModel], segments: tuple[str, ...]) -> ValueType | None:
    """The type of the value at ``segments`` of ``model`` (None: not typed, or not declared)."""
    if not segments:
        return None
    field = model.model_fields.get(segments[0])
    if field is None:
        return None
    return annotation_type(field.annotation, segments[1:])


def snapshot_resolver(state: type[BaseModel]) -> Resolver:
    """Field types of snapshot documents: ``state.…`` is the aggregate's state."""

    def resolve(path: str) -> ValueType | None:
        head, _, rest = path.partition(".")
        return model_type(state, tuple(rest.split("."))) if head == "state" and rest else None

    return resolve


def event_stream_resolver(events: list[type[BaseModel]]) -> Resolver:
    """Field types of event-stream documents: ``body.body.…`` is an event's body.

    A field is typed when every event class declaring it declares it with that type.
    """

    def resolve(path: str) -> ValueType | None:
        parts = path.split(".")
        if parts[:2] != ["body", "body"] or len(parts) < 3:
            return None
        found = {model_type(event, tuple(parts[2:])) for event in events if parts[2] in event.model_fields}
        return found.pop() if len(found) == 1 else None

    return resolve


# --- bringing values to the stored type ---------------------------------------------------


def _fail(path: str, message: str) -> QueryValidationError:
    return QueryValidationError(path, message)


def _decimal(value: Any, field: str) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        raise _fail(field, f"{field} holds a Decimal: compare it with a number, not {value!r}")
    if isinstance(value, Decimal):
        number = value
    elif isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _fail(field, f"{field} holds a Decimal: numbers must be finite")
        number = Decimal(repr(value))  # the number as it was written, not the float's binary expansion
    elif isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise _fail(field, f"{field} holds a Decimal: {value!r} is not a number") from None
    else:
        raise _fail(field, f"{field} holds a Decimal: compare it with a number or numeric text")
    if not number.is_finite():
        raise _fail(field, f"{field} holds a Decimal: numbers must be finite")
    if (problem := decimal_problem(number)) is not None:
        raise _fail(field, f"{field} holds a Decimal: {problem}")
    return number


def _time(value: Any, field: str) -> Any:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise _fail(field, f"{field} holds a time: {exc}") from None


def _date_bounds(node: Condition, field: str, now: dt.datetime) -> Condition:
    """A date operator on a time field, as the bounds of its window in canonical time text."""
    window = dates.date_window(node.operator.value, now=now, zone=node.options.zone, days=node.value)
    parts = []
    if window.start is not None:
        parts.append(Condition(operator=Op.GTE, field=node.field, value=canonical_time(window.start)))
    parts.append(Condition(operator=Op.LT, field=node.field, value=canonical_time(window.end)))
    return and_conditions(*parts)


def type_condition(condition: Condition, resolve: Resolver | None, *, now: dt.datetime | None = None,
                   prefix: str = "") -> Condition:
    """``condition`` with the values of typed fields brought to their stored type (see the module table).

    Python values given directly (a ``datetime``) become canonical time text on any field.
    """
    moment = dates.resolve_now(now)
    op = condition.operator
    if op in (Op.AND, Op.OR, Op.NOR):
        children = tuple(type_condition(child, resolve, now=moment, prefix=prefix) for child in condition.children)
        return dataclasses.replace(condition, children=children)
    if op is Op.ELEM_MATCH:
        inner = f"{prefix}{condition.field}."
        children = tuple(type_condition(child, resolve, now=moment, prefix=inner) for child in condition.children)
        return dataclasses.replace(condition, children=children)
    if op is Op.SPACE_ID:  # built in Python (the parser has already resolved the client's)
        return space_condition(condition.value)
    if not condition.field:
        return condition
    path = prefix + condition.field
    kind = resolve(path) if resolve is not None else None
    if kind is ValueType.TIME and op.value in dates.DATE_OPERATORS:
        return _date_bounds(condition, path, moment)
    if op not in _SINGLE and op not in _MANY:
        return condition
    if kind is ValueType.DECIMAL:
        convert: Callable[[Any, str], Any] = _decimal
    elif kind is ValueType.TIME:
        convert = _time
    else:
        def convert(value: Any, field: str) -> Any:
            return canonical_time(value) if isinstance(value, dt.datetime) else value
    if op in _SINGLE:
        value = convert(condition.value, path)
    else:
        value = tuple(convert(item, path) for item in condition.value)
    return dataclasses.replace(condition, value=value)


__all__ = ["ValueType", "annotation_type", "event_stream_resolver", "model_type", "snapshot_resolver",
           "type_condition"]

"""Stored values keep their types: Decimals stay numbers, times compare in time order.

What a state or an event body becomes when it is stored (:func:`stored`), on
every backend:

* a ``Decimal`` stays a ``Decimal`` — the backends store it as a number that
  compares numerically (``Decimal128`` on MongoDB, an exact JSON number on SQL,
  the ``Decimal`` itself in memory) and read it back as ``Decimal``;
* a ``datetime`` becomes its *canonical text*: UTC, always with microseconds,
  ``2026-12-02T03:06:28.120000Z`` (:func:`canonical_time`). One width, one
  zone, so text order is time order on every backend and in every query; a
  naive datetime is taken as UTC. The state model reads it back as an aware
  datetime (UTC);
* everything else is what pydantic's JSON mode makes of it (enums by value,
  UUIDs and dates as text, sets as lists, NaN and infinities as null).

A non-finite Decimal (NaN, Infinity) has no number to be stored as: it is kept
as its text, as pydantic's JSON mode writes it.

:func:`dumps` writes such values as JSON with each Decimal's exact digits (the
standard library would need a float); :func:`loads` reads fractions back as
``Decimal``. Pure: no Django, no pymongo.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from typing import Any, TypedDict, cast

from pydantic import BaseModel, TypeAdapter

_NATIVE = (str, int, float, bool, type(None))
_ANY = TypeAdapter(Any)


def to_jsonable_python(value: Any) -> Any:
    """``value`` as pydantic's JSON mode writes it (enums by value, UUIDs and dates as text, sets as lists)."""
    return _ANY.dump_python(value, mode="json")


def canonical_time(moment: datetime) -> str:
    """``moment`` in UTC as fixed-width text with microseconds and ``Z`` (naive means UTC)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        moment = moment.replace(tzinfo=UTC)
    else:
        moment = moment.astimezone(UTC)
    return (f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:"
            f"{moment.second:02d}.{moment.microsecond:06d}Z")


def parse_time(value: Any) -> str:
    """A client's time (ISO-8601 text, with or without an offset; epoch milliseconds) as canonical text.

    ``ValueError`` naming the accepted forms for anything else.
    """
    if isinstance(value, datetime):
        return canonical_time(value)
    if isinstance(value, bool):
        raise ValueError(f"expected a time (ISO-8601 text or epoch milliseconds), got {value!r}")
    if isinstance(value, int | float | Decimal):
        if not math.isfinite(value):
            raise ValueError("expected a time (ISO-8601 text or epoch milliseconds), got a non-finite number")
        try:
            return canonical_time(datetime.fromtimestamp(float(value) / 1000, tz=UTC))
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"epoch milliseconds {value} are out of the range of dates") from None
    if isinstance(value, str):
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text)  # a date alone too (midnight), from Python 3.11
        except ValueError:
            raise ValueError(
                f"{value!r} is not an ISO-8601 time (e.g. 2026-12-01T09:30:00Z or 2026-12-01T09:30:00+08:00)"
            ) from None
        return canonical_time(moment)
    raise ValueError(f"expected a time (ISO-8601 text or epoch milliseconds), got {type(value).__name__}")


def _typed(value: Any) -> Any:
    """A python-mode dump's value with Decimals kept, times canonical and the rest JSON."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if isinstance(value, Enum):
        return _typed(to_jsonable_python(value))
    if kind is float:
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return value if value.is_finite() else str(value)
    if isinstance(value, datetime):
        return canonical_time(value)
    if isinstance(value, dict):
        return {(key if isinstance(key, str) else _key(key)): _typed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(item) for item in value]
    for base in (int, float, str):  # subclasses of the JSON types, as their base type
        if isinstance(value, base):
            return _typed(base(value))
    if isinstance(value, BaseModel):
        return stored(value)
    return _typed(to_jsonable_python(value))


def _key(key: Any) -> str:
    converted = to_jsonable_python(key)
    return converted if isinstance(converted, str) else json.dumps(converted)


def stored(model: BaseModel) -> dict:
    """``model`` as it is stored: its python-mode dump with Decimals kept and times canonical."""
    # A dict: model_dump gives one, and _typed maps a dict to a dict.
    return cast(dict, _typed(model.model_dump(mode="python")))


class _Exact(Exception):
    """The fast path met a Decimal: write the value the exact way."""


def _refuse_decimal(value: Any) -> Any:
    if isinstance(value, Decimal):
        raise _Exact
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def decimal_text(value: Decimal) -> str:
    """A finite Decimal as a JSON number with its exact digits (``ValueError`` for NaN and infinities)."""
    if not value.is_finite():
        raise ValueError(f"{value} is not a finite number; JSON has no NaN or Infinity")
    text = str(value)
    return text if "E" not in text else text.replace("E", "e")


class _DumpsOptions(TypedDict):
    """The keyword arguments :func:`dumps` passes to :func:`json.dumps`."""

    sort_keys: bool
    separators: tuple[str, str]
    allow_nan: bool
    ensure_ascii: bool


def dumps(value: Any, *, sort_keys: bool = False, default: Callable[[Any], Any] | None = None,
          ensure_ascii: bool = True) -> str:
    """Compact JSON of ``value``, each Decimal written as a number with its exact digits.

    ``default`` converts other objects (as in :func:`json.dumps`); NaN and
    infinities are refused (``ValueError``), as no JSON reader takes them.
    """
    options: _DumpsOptions = {"sort_keys": sort_keys, "separators": (",", ":"), "allow_nan": False,
                              "ensure_ascii": ensure_ascii}

    def fallback(item: Any) -> Any:
        if isinstance(item, Decimal):
            raise _Exact
        if default is not None:
            return default(item)
        return _refuse_decimal(item)

    try:
        return json.dumps(value, default=fallback, **options)  # the C encoder: most values hold no Decimal
    except _Exact:
        pass
    write_key = json.JSONEncoder(ensure_ascii=ensure_ascii).encode

    def write(item: Any) -> str:
        if isinstance(item, Decimal):
            return decimal_text(item)
        if isinstance(item, dict):
            items = [(k if isinstance(k, str) else json.dumps(k, allow_nan=False).strip('"'), v)
                     for k, v in item.items()]
            if sort_keys:
                items.sort(key=lambda pair: pair[0])
            return "{" + ",".join(write_key(k) + ":" + write(v) for k, v in items) + "}"
        if isinstance(item, list | tuple):
            return "[" + ",".join(write(v) for v in item) + "]"
        if isinstance(item, _NATIVE):
            return json.dumps(item, **options)
        if default is None:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        return write(default(item))

    return write(value)


#: One decoder for every call (``json.loads`` with ``parse_float`` builds a decoder and its scanner each
#: time); its C scanner runs without giving the GIL away, so threads can share it.
_decode = json.JSONDecoder(parse_float=Decimal).decode


def loads(text: str | bytes) -> Any:
    """JSON with every number that has a fraction or an exponent read as an exact ``Decimal``."""
    if not isinstance(text, str):
        if not isinstance(text, bytes | bytearray):
            raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(text).__name__}")
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _decode(text)


class ExactJSONEncoder(json.JSONEncoder):
    """A :class:`json.JSONEncoder` (for ``cls=`` arguments) whose output keeps each Decimal's digits.

    Compact separators; ``sort_keys`` and ``ensure_ascii`` as given.
    """

    def encode(self, o: Any) -> str:
        return dumps(o, sort_keys=self.sort_keys, ensure_ascii=self.ensure_ascii,
                     default=None if type(self).default is json.JSONEncoder.default else self.default)

    def iterencode(self, o: Any, _one_shot: bool = False) -> Iterator[str]:
        yield self.encode(o)


__all__ = ["ExactJSONEncoder", "canonical_time", "decimal_text", "dumps", "loads",
           "parse_time", "stored"]


#: The rule a NUL character breaks: PostgreSQL stores none in text or JSON, so every backend refuses them.
NUL_RULE = "must not contain NUL characters (\\u0000)"


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is anywhere in a JSON-like value, its keys included."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            for key in item:
                if "\x00" in (key if isinstance(key, str) else str(key)):
                    return True
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False


def nul_path(value: Any, root: str = "") -> str | None:
    """Where the first NUL character of a JSON-like value is (``items[0].sku``; a key holding one names its
    object, ``root`` or ``"body"`` at the top), or ``None``. Iterative: any depth."""
    if not _holds_nul(value):  # the common case, without building a path for every item
        return None
    pending: list[tuple[str, Any]] = [(root, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return path or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in str(key):
                    return path or "body"
                pending.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(item, list | tuple):
            pending.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return None

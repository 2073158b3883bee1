"""The JSON parser of the API: strict, bounded, and never a 500 for a bad body.

Compared with DRF's ``JSONParser`` it also refuses, with a 400:

* ``NaN``/``Infinity`` and numbers that overflow to infinity (``1e999``);
* integers outside 64 bits (MongoDB cannot store them) and nesting deeper
  than the interpreter can parse (DRF lets the ``RecursionError`` through);
* text that is not UTF-8 and lone surrogates (``"\\ud800"``), which no
  store or JSON encoder accepts later;

and answers 413 for a body larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE``,
which DRF does not apply to JSON.

:class:`CommandJSONParser`, the parser of command bodies, reads numbers with a
fraction or an exponent as :class:`~wow_django.domain.messages.JSONDecimal`
instead of ``float``, so ``0.99999999999999999999`` reaches the command's
model as written (and is refused by ``decimal_places=2``) rather than as ``1.0``;
:class:`QueryJSONParser`, the parser of query bodies, reads ``5.0`` as the whole
number 5 and an integer past 64 bits the float it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from decimal import Decimal

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer

from wow_django.domain.messages import JSONDecimal
from wow_django.domain.values import NUL_RULE, nul_path


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:40]!r} is out of range (numbers must be finite)")
    return number


def _finite_decimal(text: str) -> Decimal:
    _finite(text)  # the same numbers as everywhere else: none that overflows a float
    return JSONDecimal(text)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int64(text: str) -> int:
    number = int(text)  # ValueError past Python's digit limit
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"integer {text[:40]!r}... does not fit in 64 bits (BSON's largest integer)")
    return number


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def _check_text(value, text: str) -> None:
    """Raise ``UnicodeEncodeError`` on a lone surrogate anywhere (keys included), iteratively; a
    ``ValidationError`` naming the field on a NUL character (see :func:`~wow_django.domain.values.nul_path`).
    JSON can only carry a NUL as the escape ``\\u0000``: the parsed value is walked for it only when ``text``,
    the body it was parsed from, holds that escape."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            item.encode("utf-8")
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    where = nul_path(value) if "\\u0000" in text else None
    if where is not None:
        raise ValidationError({where: NUL_RULE})


class WowJSONParser(BaseParser):
    media_type = "application/json"
    renderer_class = JSONRenderer
    # How ``json.loads`` reads a number with a fraction or an exponent, and a whole number (see the subclasses).
    parse_float: Callable[[str], float | Decimal] = staticmethod(_finite)
    parse_int: Callable[[str], int | float] = staticmethod(_int64)

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise RequestTooLarge(f"The request body is larger than {limit} bytes.")
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            raise ParseError(f"The request body is not valid {encoding} text.")
        try:
            data = json.loads(text, parse_float=self.parse_float, parse_int=self.parse_int,
                              parse_constant=_no_constants)
        except RecursionError:
            raise ParseError("Malformed JSON: nested too deeply.")
        except ValueError as exc:
            raise ParseError(f"Malformed JSON: {exc}")
        try:
            _check_text(data, text)
        except UnicodeEncodeError:
            raise ParseError("Malformed JSON: strings must not contain lone surrogates (\\ud800-\\udfff).")
        return data


def _whole_or_float(text: str) -> int | float:
    number = _finite(text)
    return int(number) if number.is_integer() and INT64_MIN <= number <= INT64_MAX else number


def _int_or_float(text: str) -> int | float:
    number = int(text)  # ValueError past Python's digit limit
    return number if INT64_MIN <= number <= INT64_MAX else _finite(text)


class QueryJSONParser(WowJSONParser):
    """The JSON parser of query bodies: numbers are the numbers JSON means — ``5.0`` is the whole number 5, as
    JSON Schema's ``integer`` counts it (a limit, a page, a day count may be written so), and an integer past 64
    bits is the float it is (a value to compare with, never stored)."""

    parse_float = staticmethod(_whole_or_float)
    parse_int = staticmethod(_int_or_float)


class CommandJSONParser(WowJSONParser):
    """The JSON parser of command bodies: numbers with a fraction or an exponent are decimals, exactly as sent."""

    parse_float = staticmethod(_finite_decimal)

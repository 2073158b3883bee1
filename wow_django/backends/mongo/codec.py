"""Typed values on MongoDB: a Decimal is stored as ``Decimal128`` and read back as ``Decimal``.

``Decimal128`` compares numerically with MongoDB's other numbers (``{"$gt": 50}``
matches ``Decimal128("50.01")``) and sorts among them. It holds 34 significant
digits and exponents up to 6144: a Decimal beyond that cannot be stored exactly
and is refused (``ValueError`` naming the value) rather than rounded.

Times need nothing here: states and event bodies hold them as canonical text
(:mod:`wow_django.domain.values`).
"""

from __future__ import annotations

import decimal
from typing import Any

from bson import Decimal128


def to_bson(value: Any) -> Any:
    """``value`` with every Decimal as a ``Decimal128`` (dicts and lists copied only where one is found)."""
    if isinstance(value, decimal.Decimal):
        try:
            return Decimal128(value)
        except (decimal.Inexact, decimal.Overflow, decimal.InvalidOperation):
            raise ValueError(
                f"the Decimal {value} cannot be stored on MongoDB exactly: Decimal128 holds 34 significant digits "
                "and exponents from -6143 to 6144"
            ) from None
    if isinstance(value, dict):
        converted = None
        for key, item in value.items():
            new = to_bson(item)
            if new is not item:
                if converted is None:
                    converted = dict(value)
                converted[key] = new
        return value if converted is None else converted
    if isinstance(value, list | tuple):
        items = [to_bson(item) for item in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) or isinstance(value, tuple) \
            else value
    return value


def from_bson(value: Any) -> Any:
    """``value`` with every ``Decimal128`` as a Decimal (in place: documents read are the caller's own)."""
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list | Decimal128):
                value[key] = from_bson(item)
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, dict | list | Decimal128):
                value[index] = from_bson(item)
        return value
    return value


def holds_decimal(value: Any) -> bool:
    """Whether a document about to be written holds a Decimal anywhere."""
    if isinstance(value, decimal.Decimal):
        return True
    if isinstance(value, dict):
        return any(holds_decimal(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(holds_decimal(item) for item in value)
    return False

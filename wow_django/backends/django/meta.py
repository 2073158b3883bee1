"""What the stores read of a model's ``_meta``: its fields that are columns, typed as such."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db.models import Field, Model


def concrete_field(model: type[Model], name: str) -> Field[Any, Any]:
    """The field ``name`` of ``model``, a column of its table (``get_field`` also finds relations, which are not)."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field):
        raise FieldDoesNotExist(f"{model.__name__}.{name} is not a column")
    return field

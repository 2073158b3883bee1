"""What this process declared: aggregate types and prepare-key names.

The schema initializer reads it; ``wow_django.domain`` fills the aggregate
part from installed apps.
"""

from __future__ import annotations

import re
import threading

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")

_lock = threading.Lock()
_aggregate_names: dict[str, str] = {}  # name → who declared it
_prepare_key_names: set[str] = set()


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"{what} {name!r} must start with a letter and hold only letters, digits, '_' or '-' (≤ 63)"
        )
    return name


def register_aggregate_name(name: str, declared_by: str) -> None:
    """Declare an aggregate type; a second declaration under one name is an error."""
    check_name(name, "aggregate name")
    with _lock:
        previous = _aggregate_names.get(name)
        if previous is not None and previous != declared_by:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"Two aggregates are named {name!r}: {previous} and {declared_by}. Rename one."
            )
        _aggregate_names[name] = declared_by


def unregister_aggregate_name(name: str) -> None:
    with _lock:
        _aggregate_names.pop(name, None)


def aggregate_names() -> list[str]:
    with _lock:
        return sorted(_aggregate_names)


def register_prepare_key(name: str) -> None:
    check_name(name, "prepare key name")
    with _lock:
        _prepare_key_names.add(name)


def prepare_key_names() -> list[str]:
    with _lock:
        return sorted(_prepare_key_names)

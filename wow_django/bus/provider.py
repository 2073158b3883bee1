"""Where the bus facade finds this process's bus, without importing the layer above it.

The application layer (:mod:`wow_django.application.runtime`) owns the process's
bus and installs a provider here when it is imported; the ``ready()`` of the
``wow_django`` and ``wow_django.bus`` apps import it, so after ``django.setup()``
:func:`wow_django.bus.get_bus` answers. The bus package never imports the
application layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from wow_django.bus.service import EventBus

_provider: Callable[[], EventBus] | None = None


def install(provider: Callable[[], EventBus]) -> None:
    """Make ``provider()`` the process's bus (the runtime calls this once, on import)."""
    global _provider
    _provider = provider


def current_bus() -> EventBus:
    """The bus of the installed provider; a clear error when no runtime has been loaded."""
    provider = _provider
    if provider is None:
        raise ImproperlyConfigured(
            "wow_django.bus.get_bus() found no runtime: add 'wow_django' (or 'wow_django.bus') to "
            "INSTALLED_APPS and call django.setup() first (importing wow_django.application.runtime also "
            "installs it).")
    return provider()

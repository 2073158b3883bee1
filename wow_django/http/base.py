"""What every wow_django view shares: JSON in, JSON errors out, the project's authentication.

Both the aggregate API (:mod:`wow_django.http.views`) and the bus API
(:mod:`wow_django.http.bus_views`) derive from :class:`WowView`.
"""

from __future__ import annotations

from django.utils.module_loading import import_string
from rest_framework.renderers import JSONRenderer
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from wow_django.conf import wow_settings
from wow_django.http.errors import exception_handler
from wow_django.http.parsers import WowJSONParser


def import_classes(values) -> list[type]:
    """Classes given as classes or dotted paths."""
    return [import_string(value) if isinstance(value, str) else value for value in values]


def default_authentication_classes() -> list[type]:
    """``WOW["API_AUTHENTICATION_CLASSES"]``, else DRF's ``DEFAULT_AUTHENTICATION_CLASSES``."""
    if wow_settings.API_AUTHENTICATION_CLASSES is not None:
        return import_classes(wow_settings.API_AUTHENTICATION_CLASSES)
    return list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)


class WowView(APIView):
    """A DRF view answering errors through :func:`wow_django.http.errors.exception_handler`."""

    # JSON only: numbers checked (finite, 64-bit), size capped, and no form
    # posts, so a cross-site HTML form cannot act with a browser's credentials.
    parser_classes = [WowJSONParser]
    renderer_classes = [JSONRenderer]

    def get_exception_handler(self):
        return exception_handler

    def get_authentication_classes(self) -> list[type]:
        return default_authentication_classes()

    def get_authenticators(self):
        return [cls() for cls in self.get_authentication_classes()]

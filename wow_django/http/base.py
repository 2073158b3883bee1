"""What every wow_django view shares: JSON in, JSON errors out, the project's authentication.

Both the aggregate API (:mod:`wow_django.http.views`) and the bus API
(:mod:`wow_django.http.bus_views`) derive from :class:`WowView`.
"""

from __future__ import annotations

import base64
import binascii
import logging

from django.db import DataError
from django.http.request import MediaType
from django.utils.module_loading import import_string
from rest_framework.exceptions import AuthenticationFailed, UnsupportedMediaType
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from wow_django.conf import wow_settings
from wow_django.domain.values import NUL_RULE
from wow_django.http.errors import InvalidRequest, exception_handler
from wow_django.http.parsers import WowJSONParser

JSON_MEDIA_TYPE = "application/json"
logger = logging.getLogger("wow_django.http")


def refuse_nul(request, kwargs: dict) -> None:
    """``InvalidRequest`` (400, naming it) for a NUL character in a path parameter, a query parameter (name or
    value) or a header: PostgreSQL stores none, so every backend refuses them alike, before any lookup."""
    for name, value in kwargs.items():
        if isinstance(value, str) and "\x00" in value:
            raise InvalidRequest(name, NUL_RULE)
    for name, values in request.query_params.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            raise InvalidRequest(name.replace("\x00", "\\u0000"), NUL_RULE)
    for key, value in request.META.items():
        if key.startswith("HTTP_") and key != "HTTP_AUTHORIZATION" and isinstance(value, str) and "\x00" in value:
            raise InvalidRequest(key[5:].replace("_", "-").title(), NUL_RULE)


def _nul_in_credentials(header: str) -> bool:
    if "\x00" in header:
        return True
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "basic" or not credentials:
        return False
    try:  # leniently, as DRF's BasicAuthentication decodes it (characters outside base64 are skipped)
        return b"\x00" in base64.b64decode(credentials.strip())
    except (binascii.Error, ValueError):
        return False  # DRF's own check answers a malformed header


def import_classes(values) -> list[type]:
    """Classes given as classes or dotted paths."""
    return [import_string(value) if isinstance(value, str) else value for value in values]


def default_authentication_classes() -> list[type]:
    """``WOW["API_AUTHENTICATION_CLASSES"]``, else DRF's ``DEFAULT_AUTHENTICATION_CLASSES``."""
    if wow_settings.API_AUTHENTICATION_CLASSES is not None:
        return import_classes(wow_settings.API_AUTHENTICATION_CLASSES)
    return list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)  # type: ignore[arg-type]  # classes at runtime, not str


class WowView(APIView):
    """A DRF view answering errors through :func:`wow_django.http.errors.exception_handler`."""

    # JSON only: numbers checked (finite, 64-bit), size capped, and no form
    # posts, so a cross-site HTML form cannot act with a browser's credentials.
    parser_classes = [WowJSONParser]
    # JSON first: what a client gets unless it asks for text/html, as a browser does (DRF's browsable API,
    # whose forms post JSON too).
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]

    def get_exception_handler(self):
        return exception_handler

    def initial(self, request, *args, **kwargs):
        # The user first, once (what DRF's own perform_authentication does, made safe): whatever answers the
        # request afterwards — an error below, the browsable API's page — reads it without asking a database
        # again. Then the path, query and headers: no NUL reaches a database, on any backend.
        self.perform_authentication(request)
        refuse_nul(request, kwargs)
        super().initial(request, *args, **kwargs)
        self.check_content_type(request)

    def perform_authentication(self, request):
        """DRF's, except that credentials no database can look up (a NUL in them) are refused as what they
        are, bad credentials (401), and a database error while checking them (a session key or user name the
        database refuses) is one too, never a 500. Either way the request is left anonymous, so nothing that
        reads ``request.user`` afterwards runs the authenticators again."""
        if hasattr(request, "_user"):
            return  # resolved already
        if _nul_in_credentials(request.META.get("HTTP_AUTHORIZATION", "")):
            request._not_authenticated()
            raise AuthenticationFailed(f"The Authorization header's credentials {NUL_RULE}.")
        try:
            request.user  # noqa: B018 - runs the authenticators (DRF leaves it anonymous on their refusal)
        except DataError as exc:
            logger.warning("checking a request's credentials failed: %s: %s", type(exc).__name__, exc)
            request._not_authenticated()
            raise AuthenticationFailed("The credentials could not be checked.") from exc

    def get_authenticate_header(self, request):
        """The first authenticator's challenge; when it has none (session authentication first) but the request
        sent an ``Authorization`` header, a challenge for that header's scheme: bad credentials are a 401 with
        ``WWW-Authenticate``, not the 403 DRF would answer."""
        header = super().get_authenticate_header(request)
        if header:
            return header
        scheme = request.META.get("HTTP_AUTHORIZATION", "").split(" ", 1)[0].strip()
        if scheme.isalnum():
            return f'{scheme} realm="api"'
        return None

    def check_content_type(self, request) -> None:
        """Refuse an unsafe request that does not say ``Content-Type: application/json``, whatever its body.

        DRF parses nothing for an empty body, so without this an empty cross-site form
        post (or a body-less ``fetch`` in no-cors mode), which a browser sends with the
        user's cookies or Basic credentials, would act. A DELETE or PUT without a body
        may omit the header (a body-less DELETE may even name another type: there is
        nothing to parse): no browser sends those cross-site without a CORS preflight.
        """
        if request.method in ("GET", "HEAD", "OPTIONS", "TRACE") or not self.handles(request.method):
            return  # a method the view does not have is a 405 (DRF answers it after this), not a 415
        given = request.META.get("CONTENT_TYPE", "")
        if request.method == "DELETE" and not _has_body(request):
            return  # nothing to parse, whatever it says; no browser sends a DELETE cross-site without a preflight
        if not given and request.method == "PUT" and not _has_body(request):
            return
        media_type = MediaType(given)
        if (media_type.main_type, media_type.sub_type) == ("application", "json"):
            return
        raise UnsupportedMediaType(
            given or "(none)",
            detail=f"{request.method} requests must send Content-Type: {JSON_MEDIA_TYPE}, even with an empty "
            f"body (got {_short(given) if given else 'no Content-Type'}); send {{}} as JSON for no arguments.",
        )

    def handles(self, method: str) -> bool:
        """Whether this view has a handler for ``method`` (else DRF answers 405)."""
        name = method.lower()
        return name in self.http_method_names and hasattr(self, name)

    def get_authentication_classes(self) -> list[type]:
        return default_authentication_classes()

    def get_authenticators(self):
        return [cls() for cls in self.get_authentication_classes()]


def _has_body(request) -> bool:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return True


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")

"""Error handlers for the project's URLconf (``handler400``), answering in the API's shape on its routes."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import Resolver404, resolve
from django.views import defaults

from wow_django.exceptions import ErrorCodes
from wow_django.http.base import WowView
from wow_django.http.errors import WOW_ERROR_CODE_HEADER, error_body


def bad_request(request, exception=None):
    """A ``handler400``: a request Django refuses before any view runs (a Host header it does not allow, a
    malformed cookie or multipart body — ``SuspiciousOperation``) is answered in the API's JSON error
    shape on wow_django's routes, and by Django's own page elsewhere::

        handler400 = "wow_django.http.handlers.bad_request"
    """
    try:
        view = getattr(resolve(request.path_info).func, "view_class", None)
    except Resolver404:
        view = None
    if isinstance(view, type) and issubclass(view, WowView):
        reason = type(exception).__name__ if exception is not None else "the request"
        return JsonResponse(error_body(ErrorCodes.BAD_REQUEST, f"The request was refused before it reached the API "
                                                      f"({reason}): check its Host header, cookies and body."),
                            status=400, headers={WOW_ERROR_CODE_HEADER: ErrorCodes.BAD_REQUEST})
    return defaults.bad_request(request, exception)

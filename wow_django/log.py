"""Logging helpers for projects using wow_django (the sample's ``LOGGING`` uses them).

:class:`RequestIdFilter` gives every record a ``request_id`` attribute for a format string: the request id
of the HTTP request the record is about (Django's ``django.request`` records carry the request), taken from
``Command-Request-Id`` (Wow's header) or ``X-Request-Id``, else ``-``. Sanitised: at most 128 characters, no
line breaks or control characters (a client chooses it).
"""

from __future__ import annotations

import logging

#: The headers a request id is read from, in order (``request.META`` keys).
REQUEST_ID_HEADERS = ("HTTP_COMMAND_REQUEST_ID", "HTTP_X_REQUEST_ID")


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (see the module docstring); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        meta = getattr(getattr(record, "request", None), "META", None)
        value = "-"
        if isinstance(meta, dict):
            value = next((str(meta[key]) for key in REQUEST_ID_HEADERS if meta.get(key)), "-")
        record.request_id = "".join(c if c.isprintable() else "?" for c in value[:128]) or "-"
        return True

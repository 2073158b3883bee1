"""Logging helpers for projects using wow_django (the sample's ``LOGGING`` uses them), and
:func:`describe_failure`, the text kept of a handler's exception (consumers, followers).

:class:`RequestIdFilter` gives every record a ``request_id`` attribute for a format string: the request id
of the HTTP request the record is about (Django's ``django.request`` records carry the request), taken from
``Command-Request-Id`` (Wow's header) or ``X-Request-Id``, else ``-``. Sanitised: at most 128 characters, no
line breaks or control characters (a client chooses it).
"""

from __future__ import annotations

import logging
import traceback

#: How much of a failure :func:`describe_failure` keeps by default (a feedback row's ``error`` holds as much).
FAILURE_TEXT_LIMIT = 4000
MAX_MESSAGE_LENGTH = 1000  # of the exception's own message, the first line of a failure's text
TRACEBACK_HEADING = "Traceback (most recent call last):"
MAX_LINE_LENGTH = 300  # of one line of the traceback (a long message repeats on its last line)


def describe_failure(exc: BaseException, limit: int = FAILURE_TEXT_LIMIT) -> str:
    """What a consumer's feedback row or a follower's poison record keeps of a handler's exception, at most
    ``limit`` characters.

    The first line is ``Type: message`` (the message cut to ``MAX_MESSAGE_LENGTH``), what a list shows;
    then the traceback, chained exceptions included, with the frames nearest the failure kept when it is
    too long (the line where it broke matters more than how the worker got there). An exception whose
    message is bare (``InvalidOperation: [<class 'decimal.ConversionSyntax'>]``) is explained by its
    last frame. NUL characters are written out as ``\\u0000``.
    """
    # one line (what a list shows, and the text up to the first blank line), no NUL (no SQL store takes one)
    message = " ".join(str(exc).replace("\x00", "\\u0000").split("\n"))
    if len(message) > MAX_MESSAGE_LENGTH:
        message = message[:MAX_MESSAGE_LENGTH - 1] + "…"
    first = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    first = first[:limit]
    lines = [line if len(line) <= MAX_LINE_LENGTH else line[:MAX_LINE_LENGTH - 1] + "…"
             for line in "".join(traceback.format_exception(exc)).replace("\x00", "\\u0000").splitlines()]
    room = limit - len(first) - 2  # the blank line between
    if room <= len(TRACEBACK_HEADING) + 40 or not lines:
        return first
    note = len(f"{TRACEBACK_HEADING} [{len(lines)} earlier lines left out]") + 1  # at most this long
    kept: list[str] = []
    used = 0
    for line in reversed(lines):  # innermost first, until the room is used up
        if used + len(line) + 1 > room - note:  # keeps room for the note of what was left out
            break
        kept.append(line)
        used += len(line) + 1
    kept.reverse()
    left_out = len(lines) - len(kept)
    if left_out:
        kept.insert(0, f"{TRACEBACK_HEADING} [{left_out} earlier lines left out]")
    return f"{first}\n\n" + "\n".join(kept)


def first_line(text: str) -> str:
    """The first line of a :func:`describe_failure` text: what lists, logs and clients are shown (the rest
    is its traceback)."""
    return text.partition("\n")[0]


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

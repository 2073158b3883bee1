"""Server-sent events (``Accept: text/event-stream``), as Wow's server streams them.

* A command route streams one event per wait stage the command reaches, up to the one asked
  (``Command-Wait-Stage``), then ends: ``id`` (the result's id), ``event`` (the stage) and ``data`` (the
  command result as JSON). A refusal is an event named after its ``errorCode`` whose data is the result with
  the error, and ends the stream (the status is 200 once streaming began, as Wow's).
* The list routes (``snapshot/list``, ``snapshot/list/state``, ``event/list``) stream one event per document
  (``data``: the document, or the state), then end.

Wow's TypeScript client parses each event's ``data`` as JSON (``sendAndWaitStream``, ``listStream``,
``listStateStream``).

How it runs: the response is a ``StreamingHttpResponse`` over a generator. Under WSGI the worker (or its
thread) serves the stream until it ends, which is at most the command's wait timeout
(``Command-Wait-Timeout``, at most ``COMMAND_WAIT_TIMEOUT_S``) for a command, one query's time for a list;
under ASGI Django iterates the generator in a thread of its own (``sync_to_async``), so the event loop is
never held. Proxies must not buffer it: the response says ``Cache-Control: no-cache`` and
``X-Accel-Buffering: no``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from rest_framework.renderers import BaseRenderer, JSONRenderer

EVENT_STREAM = "text/event-stream"
_JSON = JSONRenderer()


def event(data, *, name: str | None = None, event_id: str | None = None) -> bytes:
    """One event: ``id``/``event`` lines when given, then the data as one line of JSON."""
    lines = []
    if event_id:
        lines.append(f"id: {_one_line(event_id)}")
    if name:
        lines.append(f"event: {_one_line(name)}")
    # As the JSON answers are written (DRF's renderer: the project's settings, Decimals included); JSON
    # escapes line breaks, so the data is one line.
    lines.append("data: " + _JSON.render(data).decode())
    return ("\n".join(lines) + "\n\n").encode()


def _one_line(value: str) -> str:
    return str(value).replace("\r", " ").replace("\n", " ")


def streaming_response(request, events: Iterable[bytes]) -> StreamingHttpResponse:
    """``events`` streamed as they come: under ASGI through an asynchronous iterator that takes each event in
    Django's thread for synchronous code (a synchronous one would be read to its end before anything is sent),
    under WSGI as they are."""
    raw = getattr(request, "_request", request)
    content = _in_a_thread(iter(events)) if isinstance(raw, ASGIRequest) else iter(events)
    response = StreamingHttpResponse(content, content_type=f"{EVENT_STREAM}; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _next_event(events: Iterator[bytes]) -> bytes | None:
    """The next event, or None past the last."""
    return next(events, None)


async def _in_a_thread(events: Iterator[bytes]) -> AsyncIterator[bytes]:
    step = sync_to_async(_next_event, thread_sensitive=True)
    while True:
        chunk = await step(events)
        if chunk is None:
            return
        yield chunk


class EventStreamRenderer(BaseRenderer):
    """Lets a client ask for ``text/event-stream`` (content negotiation). The views stream their own events; what
    reaches this renderer is an answer given before streaming began — an error (a refused credential, a bad
    header or body) — written as one event named after its ``errorCode``, with the error's status."""

    media_type = EVENT_STREAM
    # The JSON renderer's format: chosen by the Accept header only, never by ?format= (which would select
    # the JSON renderer first), so the API keeps no format query parameter.
    format = "json"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        name = data.get("errorCode") if isinstance(data, dict) else None
        return event(data, name=name)


def wants_event_stream(request) -> bool:
    """Whether content negotiation chose the event stream for this request."""
    renderer = getattr(request, "accepted_renderer", None)
    return isinstance(renderer, EventStreamRenderer)

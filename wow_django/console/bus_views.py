"""Bus events in the console: the list (filters, search, keyset pages), the detail and re-push."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from wow_django.bus import get_bus
from wow_django.bus.envelope import EventStatus, check_consumer_id
from wow_django.bus.service import document_to_json
from wow_django.console.base import allowed, audit, page, pretty, requires
from wow_django.exceptions import EnvelopeValidationError, EventNotFound, RepushRefused, TransportUnavailable
from wow_django.log import first_line

PAGE_SIZE = 25
#: The status filter's choices: each status, and the one an incident starts from.
FAILED_FOR_SOME = "FAILED,PARTIAL"
STATUS_CHOICES = [(FAILED_FOR_SOME, "failed for some consumer (FAILED or PARTIAL)"),
                  *((status, status) for status in EventStatus.__members__)]
FILTERS = ("status", "topic", "service", "user", "request", "since", "until", "q")
ENVELOPE_HIDDEN = ("payload",)


def _query_filters(filters: dict) -> dict:
    """The bus's query arguments of the console's filters."""
    return {"status": filters["status"], "topic": filters["topic"], "service": filters["service"],
            "user_id": filters["user"], "client_request_id": filters["request"], "since": filters["since"],
            "until": filters["until"]}


def _canonical_statuses(text: str) -> str:
    """Several statuses in one order (``PARTIAL, FAILED`` → ``FAILED,PARTIAL``): the filter shows as chosen and
    its page links keep it. Anything else is left for the bus to refuse."""
    parts = {part.strip() for part in text.split(",")}
    return ",".join(sorted(parts)) if text and parts <= set(EventStatus.__members__) else text


def _errors(exc: EnvelopeValidationError) -> list[str]:
    return [f"{e['name']}: {e['msg']}" for e in exc.binding_errors] or [str(exc)]


@requires("view_bus_events")
def event_list(request):
    """Events newest first: filters status, topic, the initiator's service, user and request id, time range;
    search by eventId or traceId."""
    bus = get_bus()
    filters = {key: request.GET.get(key, "").strip() for key in FILTERS}
    filters["status"] = _canonical_statuses(filters["status"])
    choices = list(STATUS_CHOICES)
    if filters["status"] and filters["status"] not in dict(choices):  # several statuses typed in the URL
        choices.append((filters["status"], filters["status"]))
    cursor = request.GET.get("cursor") or None
    rows, next_cursor, problems = [], None, []
    try:
        query = bus.query_of(**_query_filters(filters))
    except EnvelopeValidationError as exc:
        problems, query = _errors(exc), None
    if query is not None and filters["q"]:
        found = bus.store.get_event(filters["q"])
        if found is not None and query.matches(found):  # an eventId: that event
            rows = [document_to_json(found, bus.summaries([found])[found["eventId"]])]
            query = None
        else:  # otherwise a traceId
            query = bus.query_of(**_query_filters(filters), trace_id=filters["q"])
    if query is not None:
        try:
            result = bus.events_page(query, cursor=cursor, size=PAGE_SIZE)
        except EnvelopeValidationError as exc:  # a bad cursor: say so and show the first page
            problems = _errors(exc)
            result = bus.events_page(query, size=PAGE_SIZE)
            cursor = None
        rows, next_cursor = result["list"], result["next"]
    for problem in problems:
        messages.error(request, problem)
    kept = {key: value for key, value in filters.items() if value}
    return page(request, "events.html", "Bus events", events=rows, filters=filters,
                statuses=choices, first_page=cursor is not None,
                first_url=f"?{urlencode(kept)}",
                next_url=f"?{urlencode({**kept, 'cursor': next_cursor})}" if next_cursor else None)


def _event_or_404(event_id: str) -> dict:
    try:
        return get_bus().event_detail(event_id)
    except EventNotFound:
        raise Http404(f"There is no bus event {event_id!r}.")


@requires("view_bus_events")
def event_detail(request, event_id: str):
    """Envelope, payload (with ``view_payloads``), per-consumer feedback history, re-pushes, parent, children."""
    bus = get_bus()
    detail = _event_or_404(event_id)
    stored = bus.store.get_event(event_id) or {}
    envelope = {k: v for k, v in detail["event"].items() if k not in ENVELOPE_HIDDEN}
    can_repush = allowed(request.user, "repush_bus_events")
    refusal = bus.repush_refusal(stored) if can_repush and stored else None
    for consumer in detail["consumers"]:
        for attempt in consumer["attempts"]:
            attempt["errorHead"] = first_line(attempt["error"]) if attempt.get("error") else None
        consumer["refusal"] = bus.repush_refusal(stored, consumer["consumerId"]) if can_repush and stored else None
    return page(request, "event_detail.html", f"Bus event {event_id}", detail=detail, event=detail["event"],
                envelope=pretty(envelope), payload=pretty(detail["event"].get("payload")),
                show_payload=allowed(request.user, "view_payloads"), can_repush=can_repush, refusal=refusal)


@requires("view_bus_events", "repush_bus_events")
@require_http_methods(["GET", "POST"])
def event_repush(request, event_id: str):
    """GET: what a re-push (whole, or ``consumer``) will send; POST (CSRF-protected): re-push, audit, redirect."""
    bus = get_bus()
    event = bus.store.get_event(event_id)
    if event is None:
        raise Http404(f"There is no bus event {event_id!r}.")
    consumer = (request.POST if request.method == "POST" else request.GET).get("consumer") or None
    back = reverse("wow_console:event", args=[event_id])
    if consumer is not None:
        try:
            check_consumer_id(consumer)
        except EnvelopeValidationError:
            raise Http404(f"{consumer!r} is not a consumer id.")
    target = f"event:{event_id}" + (f" consumer:{consumer}" if consumer else "")
    refusal = bus.repush_refusal(event, consumer)
    if refusal is not None:
        messages.error(request, f"Not re-pushed: {refusal}")
        return redirect(back)
    if request.method == "POST":
        try:
            result = bus.repush(event_id, requested_by=request.user.get_username(), consumer_id=consumer)
        except (RepushRefused, TransportUnavailable) as exc:  # it changed since the page, or the broker is down
            audit(request, "repush", target, outcome="refused", consumer=consumer, error=str(exc))
            messages.error(request, f"Not re-pushed: {exc}")
            return redirect(back)
        audit(request, "repush", target, outcome="published", consumer=consumer, retryCount=result.retry_count)
        messages.success(request, f"Re-pushed {event_id}" + (f" to {consumer}" if consumer else " to every consumer")
                         + f" (re-push {result.retry_count} of {bus.repush_max_count}).")
        return redirect(back)
    shown = document_to_json(event)
    if not allowed(request.user, "view_payloads"):
        shown["payload"] = "(hidden: you lack the permission to view payloads)"
    consumers = [consumer] if consumer else list(event.get("consumers") or ())
    return page(request, "repush_confirm.html", f"Re-push {event_id}?", event=shown, consumer=consumer,
                consumers=consumers, sent=pretty(shown), retry_count=event.get("retryCount", 0),
                max_count=bus.repush_max_count, back=back)

"""Bus events in the console: the list (filters, search, keyset pages), the detail and re-push."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import NoReverseMatch, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from wow_django.bus import get_bus
from wow_django.bus.envelope import ID_RE, EventStatus, check_consumer_id, iso, parse_time, utcnow
from wow_django.bus.service import decode_cursor, decode_feedback_cursor, document_to_json, encode_cursor
from wow_django.console.base import allowed, audit, page, pretty, requires
from wow_django.console.insight import consumer_states
from wow_django.exceptions import EnvelopeValidationError, EventNotFound, RepushRefused, TransportUnavailable
from wow_django.log import first_line

PAGE_SIZE = 25
MAX_COUNTED = 1_000  # the event list counts its matches up to this many, then says "more than"
#: The status filter's choices: each status, and the one an incident starts from.
FAILED_FOR_SOME = "FAILED,PARTIAL"
STATUS_CHOICES = [(FAILED_FOR_SOME, "failed for some consumer (FAILED or PARTIAL)"),
                  *((status, status) for status in EventStatus.__members__)]
FILTERS = ("status", "topic", "service", "user", "request", "since", "until", "q", "at")
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


def _search(request, bus, filters: dict, query):
    """The search box: ``name=value`` is a search key; otherwise an eventId (that event), else a traceId,
    else a value of the search fields (``WOW['BUS_SEARCH_FIELDS']``, ``aggregateId``): ``[event]`` or a query."""
    text = filters["q"]
    if not text.isprintable():
        messages.error(request, "search: must be printable text (no NUL or control character)")
        return None
    may_see_keys = allowed(request.user, "view_payloads")  # a search key may be a payload field's value
    if "=" in text and not may_see_keys:
        messages.error(request, "search: searching by key needs the permission to view payloads (its values are "
                                "payload fields)")
        return None
    if "=" in text:
        try:
            return bus.query_of(**_query_filters(filters), key=text)
        except EnvelopeValidationError as exc:
            for problem in _errors(exc):
                messages.error(request, f"search: {problem}")
            return None
    found = bus.store.get_event(text) if ID_RE.fullmatch(text) else None
    if found is not None and query.matches(found):
        return [document_to_json(found, bus.summaries([found])[found["eventId"]])]
    traced = bus.query_of(**_query_filters(filters), trace_id=text) if len(text) <= 200 else None
    if traced is not None and bus.store.events_after(traced, after=None, limit=1):
        return traced
    if not may_see_keys:
        return traced
    keys = [f"{name}={text}" for name in dict.fromkeys((*bus.search_fields, "aggregateId"))]
    try:
        return bus.query_of(**_query_filters(filters), key=keys)
    except EnvelopeValidationError:  # not a value a key holds: nothing has it
        return traced


def _key_links(request, keys: dict) -> list[dict]:
    """Each search key of an event with the list of the events that have it, and for ``aggregate`` (its
    ``name/id``) the aggregate's page when the user may see aggregates."""
    links = []
    for name, value in sorted(keys.items()):
        item = {"name": name, "value": value,
                "list_url": reverse("wow_console:events") + "?" + urlencode({"q": f"{name}={value}"})}
        aggregate, _, aggregate_id = str(value).partition("/")
        if name == "aggregate" and aggregate and aggregate_id and allowed(request.user, "view_aggregates"):
            try:
                item["aggregate_url"] = reverse("wow_console:aggregate", args=[aggregate, aggregate_id])
            except NoReverseMatch:
                pass
        links.append(item)
    return links


def _errors(exc: EnvelopeValidationError) -> list[str]:
    return [f"{e['name']}: {e['msg']}" for e in exc.binding_errors] or [str(exc)]


@requires("view_bus_events")
def event_list(request):
    """Events newest first: filters status, topic, the initiator's service, user and request id, time range;
    search by eventId or traceId."""
    bus = get_bus()
    if request.GET.get("consumer"):  # the list filtered by consumer: that consumer's deliveries
        chosen = request.GET["consumer"].strip()
        try:
            check_consumer_id(chosen)
        except EnvelopeValidationError as exc:
            messages.error(request, "; ".join(_errors(exc)))
        else:
            outcome = request.GET.get("outcome", "")
            return redirect(reverse("wow_console:consumer_feedback", args=[chosen])
                            + (f"?{urlencode({'outcome': outcome})}" if outcome in OUTCOMES and outcome else ""))
    filters = {key: request.GET.get(key, "").strip() for key in FILTERS}
    filters["status"] = _canonical_statuses(filters["status"])
    choices = list(STATUS_CHOICES)
    if filters["status"] and filters["status"] not in dict(choices):  # several statuses typed in the URL
        choices.append((filters["status"], filters["status"]))
    cursor, before = request.GET.get("cursor") or None, request.GET.get("before") or None
    rows, next_cursor, previous_cursor, problems, total, at = [], None, None, [], None, None
    try:
        query = bus.query_of(**_query_filters(filters))
    except EnvelopeValidationError as exc:
        problems, query = _errors(exc), None
    if filters["at"]:
        try:
            at = parse_time(filters["at"])
        except ValueError as exc:
            problems.append(f"at: {exc}")
    if query is not None and filters["q"]:
        query = _search(request, bus, filters, query)
        if isinstance(query, list):  # one event, by its id
            rows, query, total = query, None, len(query)
    if query is not None:
        size = min(PAGE_SIZE, bus.max_page_size)
        if at is not None:  # jump: the page of the events at or before that time
            cursor = before = None
            end = at + timedelta(milliseconds=1) if at < datetime.max - timedelta(milliseconds=1) else None
            until = min(end, query.until) if end is not None and query.until is not None else end or query.until
            result = bus.events_page(replace(query, until=until), size=size)
            if result["list"]:
                first = result["list"][0]
                key = (parse_time(first["occurredAt"]), first["eventId"])
                result["previous"] = encode_cursor(*key) if bus.store.events_before(query, before=key, limit=1) \
                    else None
        else:
            try:
                result = bus.events_page(query, cursor=cursor, before=before, size=size)
            except EnvelopeValidationError as exc:  # a bad cursor: say so and show the first page
                problems += _errors(exc)
                result = bus.events_page(query, size=size)
                cursor = before = None
        rows, next_cursor, previous_cursor = result["list"], result["next"], result["previous"]
        total = bus.store.count_events(query, up_to=MAX_COUNTED + 1)  # bounded: a page's cost stays flat
    for problem in problems:
        messages.error(request, problem)
    kept = {key: value for key, value in filters.items() if value and key != "at"}
    consumers = sorted({r["consumerId"] for r in bus.topic_consumers()})
    return page(request, "events.html", "Bus events", events=rows, filters=filters, consumers=consumers,
                statuses=choices, total=total,
                more_than=total is not None and total > MAX_COUNTED, max_counted=MAX_COUNTED,
                first_url=f"?{urlencode(kept)}" if previous_cursor else None,
                previous_url=f"?{urlencode({**kept, 'before': previous_cursor})}" if previous_cursor else None,
                next_url=f"?{urlencode({**kept, 'cursor': next_cursor})}" if next_cursor else None)


def _event_or_404(event_id: str) -> dict:
    if not ID_RE.fullmatch(event_id):  # no event has such an id (and a NUL is an error on PostgreSQL)
        raise Http404(f"There is no bus event {event_id!r}.")
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
    hidden = ENVELOPE_HIDDEN if allowed(request.user, "view_payloads") else (*ENVELOPE_HIDDEN, "keys")
    envelope = {k: v for k, v in detail["event"].items() if k not in hidden}
    can_repush = allowed(request.user, "repush_bus_events")
    refusal = bus.repush_refusal(stored) if can_repush and stored else None
    for consumer in detail["consumers"]:
        for attempt in consumer["attempts"]:
            attempt["errorHead"] = first_line(attempt["error"]) if attempt.get("error") else None
        consumer["refusal"] = bus.repush_refusal(stored, consumer["consumerId"]) if can_repush and stored else None
    return page(request, "event_detail.html", f"Bus event {event_id}", detail=detail, event=detail["event"],
                keys=_key_links(request, detail["event"].get("keys") or {}) if allowed(request.user, "view_payloads")
                else [],
                envelope=pretty(envelope), payload=pretty(detail["event"].get("payload")),
                show_payload=allowed(request.user, "view_payloads"), can_repush=can_repush, refusal=refusal)


@requires("view_bus_events", "repush_bus_events")
@require_http_methods(["GET", "POST"])
def event_repush(request, event_id: str):
    """GET: what a re-push (whole, or ``consumer``) will send; POST (CSRF-protected): re-push, audit, redirect."""
    bus = get_bus()
    event = bus.store.get_event(event_id) if ID_RE.fullmatch(event_id) else None
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
        shown.pop("keys", None)  # payload fields (WOW['BUS_SEARCH_FIELDS']) among them
    consumers = [consumer] if consumer else list(event.get("consumers") or ())
    return page(request, "repush_confirm.html", f"Re-push {event_id}?", event=shown, consumer=consumer,
                consumers=consumers, sent=pretty(shown), retry_count=event.get("retryCount", 0),
                max_count=bus.repush_max_count, back=back)


# --- a consumer's deliveries, and events not consumed in time (seed 004 §2.7, §5.2) -----------------------

OUTCOMES = {"": None, "failed": False, "succeeded": True}
MAX_BULK = 200  # events one bulk re-push takes


@requires("view_bus_events")
def consumer_feedback(request, consumer_id: str):
    """What one consumer reported, newest first (its ``consumerId`` + ``consumedAt`` index): each report with
    its event, attempt, outcome and error; only its failures or successes; keyset pages."""
    bus = get_bus()
    try:
        check_consumer_id(consumer_id)
    except EnvelopeValidationError:
        raise Http404(f"{consumer_id!r} is not a consumer id.")
    outcome = request.GET.get("outcome", "")
    if outcome not in OUTCOMES:
        messages.error(request, "outcome: must be failed, succeeded or empty (any)")
        outcome = ""
    cursor = request.GET.get("cursor") or None
    try:
        decode_feedback_cursor(cursor) if cursor else None
    except EnvelopeValidationError as exc:  # a bad cursor: say so and show the first page
        for problem in _errors(exc):
            messages.error(request, problem)
        cursor = None
    result = bus.consumer_feedback_page(consumer_id, success=OUTCOMES[outcome], cursor=cursor,
                                        size=min(PAGE_SIZE, bus.max_page_size))
    for row in result["list"]:
        row["errorHead"] = first_line(row["error"]) if row.get("error") else None
    kept = {"outcome": outcome} if outcome else {}
    topics = [r["topic"] for r in bus.topic_consumers(consumer_id=consumer_id)]
    return page(request, "consumer_feedback.html", f"Deliveries to {consumer_id}", consumer_id=consumer_id,
                rows=result["list"], outcome=outcome, topics=topics,
                first_url=f"?{urlencode(kept)}" if cursor is not None else None,
                next_url=f"?{urlencode({**kept, 'cursor': result['next']})}" if result["next"] else None)


@requires("view_bus_events")
def not_consumed(request):
    """Events not consumed in time: SENT or RETRYING and last sent ``BUS_REPUSH_TIMEOUT_S`` ago or more,
    newest first (keyset pages), each with the consumers still waiting; a re-push of the ones chosen."""
    bus = get_bus()
    query = bus.not_consumed_query()
    cursor = request.GET.get("cursor") or None
    try:
        after = decode_cursor(cursor) if cursor else None
    except EnvelopeValidationError as exc:  # a bad cursor: say so and show the first page
        for problem in _errors(exc):
            messages.error(request, problem)
        after = cursor = None
    events = bus.store.events_after(query, after=after, limit=PAGE_SIZE + 1)
    more, events = len(events) > PAGE_SIZE, events[:PAGE_SIZE]
    states = consumer_states(bus, events)
    summaries = bus.summaries(events)
    can_repush = allowed(request.user, "repush_bus_events")
    rows = [{"event": document_to_json(event, summaries[event["eventId"]]),
             "waiting": [consumer for consumer, state in states[event["eventId"]].items() if state["state"] != "CONSUMED"],
             "refusal": bus.repush_refusal(event) if can_repush else None} for event in events]
    last = events[-1] if events and more else None
    return page(request, "not_consumed.html", "Not consumed in time", rows=rows, can_repush=can_repush,
                timeout=bus.repush_timeout_s, cutoff=query.sent_before, first_url="?" if cursor else None,
                next_url=f"?{urlencode({'cursor': encode_cursor(last['occurredAt'], last['eventId'])})}"
                if last else None)


@requires("view_bus_events", "repush_bus_events")
@require_http_methods(["GET", "POST"])
def not_consumed_repush(request):
    """GET: which of the chosen events (``event``, repeated) a re-push takes now and which it refuses, and why;
    POST (CSRF-protected): re-push those to every consumer still waiting, audited as one bulk re-push."""
    bus = get_bus()
    data = request.POST if request.method == "POST" else request.GET
    given = [value for value in data.getlist("event") if value]
    chosen = list(dict.fromkeys(value for value in given if ID_RE.fullmatch(value)))
    if len(chosen) < len(set(given)):  # never looked up, nor written to the audit (a NUL is an error in jsonb)
        messages.error(request, f"event: {len(set(given)) - len(chosen)} value(s) are not event ids; left out.")
    back = reverse("wow_console:not_consumed")
    if not chosen:
        messages.error(request, "Choose the events to re-push first.")
        return redirect(back)
    if len(chosen) > MAX_BULK:
        messages.error(request, f"event: at most {MAX_BULK} events in one re-push ({len(chosen)} chosen).")
        return redirect(back)
    ready, refused = [], []
    for event_id in chosen:
        event = bus.store.get_event(event_id)
        refusal = "there is no such event" if event is None else bus.repush_refusal(event)
        (refused if refusal is not None else ready).append({"eventId": event_id, "event": event,
                                                            "why": str(refusal) if refusal else None})
    if request.method == "POST":
        published: list[str] = []
        failed = [{"eventId": item["eventId"], "error": item["why"]} for item in refused]
        try:
            for item in ready:
                try:
                    bus.repush(item["eventId"], requested_by=request.user.get_username())
                    published.append(item["eventId"])
                except (RepushRefused, TransportUnavailable, EventNotFound) as exc:  # changed since the preview,
                    failed.append({"eventId": item["eventId"], "error": str(exc)})  # or the broker is down
        finally:  # what was re-pushed is audited, whatever stops the rest
            audit(request, "repush.bulk", "not-consumed", published=published, refused=failed, at=iso(utcnow()))
        if published:
            messages.success(request, f"Re-pushed {len(published)} event(s) to their consumers"
                             + (f"; {len(failed)} not re-pushed." if failed else "."))
        for item in failed:
            messages.error(request, f"Not re-pushed {item['eventId']}: {item['error']}")
        return redirect(back)
    return page(request, "not_consumed_repush.html", f"Re-push {len(ready)} event(s)?", ready=ready,
                refused=refused, back=back, max_count=bus.repush_max_count)

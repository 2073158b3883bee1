"""Traces, failures (grouped, with bulk re-push and triage notes) and the dashboard."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from wow_django.application.followers import declared_followers
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus
from wow_django.bus.envelope import EventStatus, check_consumer_id, utcnow
from wow_django.bus.rollup import latest_by_consumer, outcome
from wow_django.bus.service import document_to_json
from wow_django.console.base import allowed, audit, page, requires
from wow_django.console.charts import horizontal_bars, stacked_bars
from wow_django.console.models import FailureNote
from wow_django.exceptions import EnvelopeValidationError, RepushRefused, TraceNotFound, TransportUnavailable
from wow_django.log import first_line
from wow_django.management.commands.wow_followers import status as follower_status
from wow_django.persistence.bus import EventQuery

MAX_FAILED_EVENTS = 1000  # the newest FAILED and PARTIAL events each that the failures page groups
EVENTS_SHOWN_PER_GROUP = 20


def consumer_states(bus, events: list[dict]) -> dict[str, dict[str, dict]]:
    """``{eventId: {consumerId: {"state", "error", "attempts"}}}`` with one read of the feedback rows."""
    rows: dict[str, list[dict]] = {}
    for row in bus.store.consumption_rows(e["eventId"] for e in events):
        rows.setdefault(row["eventId"], []).append(row)
    out: dict[str, dict[str, dict]] = {}
    for event in events:
        latest = latest_by_consumer(rows.get(event["eventId"], []))
        expected = list(event.get("consumers") or sorted(latest))
        out[event["eventId"]] = {
            consumer: {"state": {True: "CONSUMED", False: "FAILED", None: "WAITING"}[outcome(latest.get(consumer))],
                       "error": first_line((latest.get(consumer) or {}).get("error") or "") or None,
                       "attempts": (latest.get(consumer) or {}).get("attemptNo", 0)}
            for consumer in sorted(set(expected) | set(latest))}
    return out


@requires("view_bus_events")
def trace(request, trace_id: str):
    """The trace's parent → child tree with each event's per-consumer delivery state, and its time line."""
    bus = get_bus()
    try:
        found = bus.trace(trace_id)
    except (TraceNotFound, EnvelopeValidationError):
        raise Http404(f"There is no trace {trace_id!r}.")
    events = bus.store.trace_events(trace_id, len(found["timeline"]))
    states = consumer_states(bus, events)
    rows: list[dict] = []

    def walk(node: dict, depth: int) -> None:
        rows.append({"event": node, "depth": depth, "indent": depth * 1.5,
                     "consumers": states.get(node["eventId"], {})})
        for child in node["children"]:
            walk(child, depth + 1)

    for root in found["tree"]:
        walk(root, 0)
    start = events[0]["occurredAt"] if events and events[0].get("occurredAt") else None
    timeline = [{"event": e, "offset_ms": int((e["occurredAt"] - start).total_seconds() * 1000)
                 if start and e.get("occurredAt") else None} for e in events]
    return page(request, "trace.html", f"Trace {trace_id}", trace_id=trace_id, rows=rows, timeline=timeline,
                truncated=found["truncated"])


def _group_key(consumer: str, error: str) -> str:
    return hashlib.sha1(f"{consumer}\n{error}".encode()).hexdigest()[:12]


def failure_groups(bus) -> list[dict]:
    """FAILED and PARTIAL events grouped by (consumer, its latest error), biggest group first."""
    events = []
    for status in (EventStatus.FAILED.value, EventStatus.PARTIAL.value):
        events += bus.store.events_after(EventQuery(status=status), after=None, limit=MAX_FAILED_EVENTS)
    states = consumer_states(bus, events)
    groups: dict[str, dict] = {}
    for event in events:
        for consumer, state in states[event["eventId"]].items():
            if state["state"] != "FAILED":
                continue
            error = (state["error"] or "failed").strip().splitlines()[0][:300]
            key = _group_key(consumer, error)
            group = groups.setdefault(key, {"key": key, "consumer": consumer, "error": error, "events": []})
            group["events"].append(event)
    ordered = sorted(groups.values(), key=lambda g: (-len(g["events"]), g["consumer"], g["error"]))
    notes = {(n.event_id, n.consumer_id): n for n in FailureNote.objects.filter(
        event_id__in=[e["eventId"] for e in events])} if events else {}
    for group in ordered:
        group["count"] = len(group["events"])
        group["shown"] = [{"event": document_to_json(e), "note": notes.get((e["eventId"], group["consumer"]))}
                          for e in group["events"][:EVENTS_SHOWN_PER_GROUP]]
        group["acknowledged"] = sum(1 for e in group["events"]
                                    if getattr(notes.get((e["eventId"], group["consumer"])), "acknowledged", False))
    return ordered


@requires("view_bus_events")
def failures(request):
    """FAILED and PARTIAL events grouped by consumer and error, with triage notes and a bulk re-push per group."""
    return page(request, "failures.html", "Failures", groups=failure_groups(get_bus()),
                can_repush=allowed(request.user, "repush_bus_events"), limit=MAX_FAILED_EVENTS)


@requires("view_bus_events", "repush_bus_events")
@require_http_methods(["GET", "POST"])
def failures_repush(request, key: str):
    """GET: how many of the group's events the bus would re-push to its consumer now; POST: re-push them."""
    bus = get_bus()
    group = next((g for g in failure_groups(bus) if g["key"] == key), None)
    if group is None:
        messages.error(request, "That group of failures is gone (re-pushed or consumed since); nothing to re-push.")
        return redirect("wow_console:failures")
    consumer = group["consumer"]
    ready = [e for e in group["events"] if bus.repush_refusal(e, consumer) is None]
    if not ready:
        messages.error(request, f"None of the {group['count']} events of this group may be re-pushed to {consumer} "
                                "now (limit reached, expired or changed).")
        return redirect("wow_console:failures")
    if request.method == "POST":
        published, refused = [], []
        for event in ready:
            try:
                bus.repush(event["eventId"], requested_by=request.user.get_username(), consumer_id=consumer)
                published.append(event["eventId"])
            except (RepushRefused, TransportUnavailable) as exc:
                refused.append({"eventId": event["eventId"], "error": str(exc)})
        audit(request, "repush.bulk", f"consumer:{consumer}", error=group["error"], published=published,
              refused=refused)
        (messages.success if published else messages.error)(
            request, f"Re-pushed {len(published)} event(s) to {consumer}" + (f"; {len(refused)} refused." if refused
                                                                              else "."))
        return redirect("wow_console:failures")
    return page(request, "failures_repush.html", f"Re-push {len(ready)} events to {consumer}?", group=group,
                ready=ready, skipped=group["count"] - len(ready))


@requires("view_bus_events", "repush_bus_events")
@require_POST
def failure_note(request):
    """Acknowledge (or re-open) one consumer's failure of an event, with a note; audited."""
    bus = get_bus()
    event_id, consumer = request.POST.get("event_id", ""), request.POST.get("consumer", "")
    note = request.POST.get("note", "").strip()
    try:
        check_consumer_id(consumer)
    except EnvelopeValidationError:
        raise Http404(f"{consumer!r} is not a consumer id.")
    event = bus.store.get_event(event_id) if event_id and len(event_id) <= 128 else None
    if event is None or consumer not in (event.get("consumers") or ()):
        raise Http404(f"No failure of {consumer!r} on event {event_id!r}.")
    if len(note) > 2000:
        messages.error(request, "note: at most 2000 characters")
        return redirect("wow_console:failures")
    acknowledged = request.POST.get("acknowledged") == "on"
    FailureNote.objects.update_or_create(event_id=event_id, consumer_id=consumer, defaults={
        "acknowledged": acknowledged, "note": note, "by": request.user.get_username()})
    audit(request, "failure.note", f"event:{event_id} consumer:{consumer}", acknowledged=acknowledged, note=note)
    messages.success(request, f"{'Acknowledged' if acknowledged else 'Noted'} the failure of {consumer} on {event_id}.")
    return redirect("wow_console:failures")


# --- dashboard --------------------------------------------------------------------------------------------


def status_buckets(bus, now: datetime, hours: int = 24, buckets: int = 8) -> list[tuple[str, dict[str, int]]]:
    """``[(label, {status: events that occurred in the bucket and have that status now})]``, oldest first."""
    width = timedelta(hours=hours / buckets)
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    out = []
    for index in range(buckets, 0, -1):
        since, until = end - width * index, end - width * (index - 1)
        counts = {}
        for status in EventStatus.__members__:
            total, _ = bus.store.find_events(EventQuery(status=status, since=since, until=until), skip=0, limit=1)
            counts[status] = total
        out.append((f"{since:%H:%M}", counts))
    return out


@requires("view_bus_events")
def dashboard(request):
    """Charts: events per status over the last 24 hours, failures per consumer, follower lag."""
    bus = get_bus()
    now = utcnow()
    per_status = stacked_bars(status_buckets(bus, now), list(EventStatus.__members__),
                              title="bus events per status, by the hour they occurred (UTC)")
    per_consumer: dict[str, int] = {}
    for group in failure_groups(bus):
        per_consumer[group["consumer"]] = per_consumer.get(group["consumer"], 0) + group["count"]
    failures_chart = horizontal_bars(sorted(per_consumer.items(), key=lambda kv: -kv[1]),
                                     title="failed deliveries per consumer", colour="#c8443c")
    lag_chart = None
    if allowed(request.user, "manage_followers"):
        runtime = get_runtime()
        try:
            store, feed = runtime.follower_store, runtime.stream_feed
        except NotImplementedError:
            store = feed = None
        if store is not None:
            states = {state.name: state for state in store.all()}
            declared = declared_followers()
            moment = datetime.now(UTC)
            rows = [follower_status(states.get(name), name, feed, moment, declared)
                    for name in sorted(set(states) | set(declared))]
            lag_chart = horizontal_bars([(r["name"], r["lag_events"]) for r in rows], unit=" streams",
                                        title="follower lag (streams behind the head)")
    return page(request, "dashboard.html", "Dashboard", per_status=per_status, failures_chart=failures_chart,
                lag_chart=lag_chart)

"""Topic consumers and followers in the console: lists, and audited actions behind confirmation pages."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_http_methods

from wow_django.application.followers import declared_followers
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus
from wow_django.console.base import allowed, audit, page, requires
from wow_django.exceptions import EnvelopeValidationError, UnknownFollower
from wow_django.management.commands.wow_followers import status as follower_status

MAX_POSITION = 2**63 - 1  # what a position column holds

# --- topic consumers -------------------------------------------------------------------------------------------


def _topic_consumer_or_404(topic: str, consumer_id: str) -> dict:
    found = get_bus().topic_consumers(topic=topic, consumer_id=consumer_id)
    if not found:
        raise Http404(f"No consumer {consumer_id!r} is configured for topic {topic!r}.")
    return found[0]


def _errors(exc: EnvelopeValidationError) -> list[str]:
    return [f"{e['name']}: {e['msg']}" for e in exc.binding_errors] or [str(exc)]


@requires("view_bus_events")
def topic_consumers(request):
    """Every (topic, consumer) configuration; filter by topic."""
    topic = request.GET.get("topic", "").strip()
    rows = get_bus().topic_consumers(topic=topic or None)
    return page(request, "topic_consumers.html", "Topic consumers", rows=rows, topic=topic,
                can_manage=allowed(request.user, "manage_topic_consumers"))


@requires("view_bus_events", "manage_topic_consumers")
@require_http_methods(["GET", "POST"])
def topic_consumer_create(request):
    """A form; POST creates the configuration (enabled or not) unless it exists."""
    form = {"topic": "", "consumerId": "", "description": "", "enabled": True}
    if request.method == "POST":
        form = {"topic": request.POST.get("topic", "").strip(), "consumerId": request.POST.get("consumerId", "").strip(),
                "description": request.POST.get("description", ""), "enabled": request.POST.get("enabled") == "on"}
        bus = get_bus()
        try:
            exists = form["topic"] and form["consumerId"] and bus.topic_consumers(
                topic=form["topic"], consumer_id=form["consumerId"])
            if exists:
                messages.error(request, f"{form['consumerId']} is already configured for {form['topic']}: edit it.")
            else:
                bus.set_topic_consumer(form["topic"], form["consumerId"], enabled=form["enabled"],
                                       description=form["description"], updated_by=request.user.get_username())
                audit(request, "topic_consumer.create", f"topic:{form['topic']} consumer:{form['consumerId']}",
                      enabled=form["enabled"], description=form["description"])
                messages.success(request, f"{form['consumerId']} now consumes {form['topic']}"
                                 + ("" if form["enabled"] else " (disabled)") + ".")
                return redirect("wow_console:topic_consumers")
        except EnvelopeValidationError as exc:
            for problem in _errors(exc):
                messages.error(request, problem)
    return page(request, "topic_consumer_form.html", "New topic consumer", form=form, creating=True)


@requires("view_bus_events", "manage_topic_consumers")
@require_http_methods(["GET", "POST"])
def topic_consumer_edit(request, topic: str, consumer_id: str):
    """Edit the description; the enabled flag changes through its own confirmation."""
    record = _topic_consumer_or_404(topic, consumer_id)
    form = {"topic": topic, "consumerId": consumer_id, "description": record.get("description") or "",
            "enabled": record.get("enabled")}
    if request.method == "POST":
        form["description"] = request.POST.get("description", "")
        try:
            get_bus().set_topic_consumer(topic, consumer_id, enabled=bool(record.get("enabled")),
                                         description=form["description"], updated_by=request.user.get_username())
        except EnvelopeValidationError as exc:
            for problem in _errors(exc):
                messages.error(request, problem)
        else:
            audit(request, "topic_consumer.edit", f"topic:{topic} consumer:{consumer_id}",
                  description=form["description"])
            messages.success(request, f"Saved {consumer_id} on {topic}.")
            return redirect("wow_console:topic_consumers")
    return page(request, "topic_consumer_form.html", f"Edit {consumer_id} on {topic}", form=form, creating=False)


@requires("view_bus_events", "manage_topic_consumers")
@require_http_methods(["GET", "POST"])
def topic_consumer_toggle(request, topic: str, consumer_id: str, enable: bool):
    """GET: what enabling/disabling changes for sending; POST: do it, audit, redirect."""
    bus = get_bus()
    record = _topic_consumer_or_404(topic, consumer_id)
    others = [c for c in bus.store.enabled_consumers(topic) if c != consumer_id]
    if request.method == "POST":
        bus.set_topic_consumer(topic, consumer_id, enabled=enable, updated_by=request.user.get_username())
        audit(request, "topic_consumer.enable" if enable else "topic_consumer.disable",
              f"topic:{topic} consumer:{consumer_id}", was_enabled=bool(record.get("enabled")))
        messages.success(request, f"{'Enabled' if enable else 'Disabled'} {consumer_id} on {topic}.")
        return redirect("wow_console:topic_consumers")
    return page(request, "topic_consumer_toggle.html", f"{'Enable' if enable else 'Disable'} {consumer_id} on {topic}?",
                record=record, enable=enable, others=others)


# --- followers -----------------------------------------------------------------------------------------------


def _follower_parts():
    runtime = get_runtime()
    try:
        return runtime.follower_store, runtime.stream_feed
    except NotImplementedError as exc:
        raise Http404(f"Followers are not available here: {exc}")


def _follower_or_404(store, name: str):
    state = store.get(name)
    if state is None:
        raise Http404(f"Follower {name!r} has never run (nothing to change yet).")
    return state


@requires("manage_followers")
def followers(request):
    """Every declared follower and every one with a checkpoint: position, head, lag, gaps, error, pause, lease."""
    store, feed = _follower_parts()
    states = {state.name: state for state in store.all()}
    declared = declared_followers()
    now = datetime.now(UTC)
    rows = [follower_status(states.get(name), name, feed, now, declared) for name in sorted(set(states) | set(declared))]
    return page(request, "followers.html", "Followers", rows=rows)


@requires("manage_followers")
@require_http_methods(["GET", "POST"])
def follower_pause(request, name: str, pause: bool):
    """GET: confirm pausing/resuming; POST: do it, audit, redirect."""
    store, _ = _follower_parts()
    state = _follower_or_404(store, name)
    if request.method == "POST":
        try:
            store.set_paused(name, pause)
        except UnknownFollower:
            raise Http404(f"Follower {name!r} has never run.")
        audit(request, "follower.pause" if pause else "follower.resume", f"follower:{name}", was_paused=state.paused)
        messages.success(request, f"{'Paused' if pause else 'Resumed'} {name}.")
        return redirect("wow_console:followers")
    return page(request, "follower_pause.html", f"{'Pause' if pause else 'Resume'} {name}?", name=name, pause=pause,
                state=state)


def _rewind_target(data, feed) -> tuple[int | None, str | None]:
    """(position, None) from ``to_position`` or ``to_time``; (None, problem) for bad input; (None, None) for none."""
    position, moment = (data.get("to_position") or "").strip(), (data.get("to_time") or "").strip()
    if position:
        if not position.isdecimal() or int(position) > MAX_POSITION:
            return None, f"to_position: must be an integer from 0 to {MAX_POSITION}, got {position!r}"
        return int(position), None
    if moment:
        parsed = parse_datetime(moment) if len(moment) < 64 else None
        if parsed is None:
            return None, f"to_time: must be an ISO time such as 2026-05-01T12:00:00Z, got {moment!r}"
        return feed.position_at(parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)), None
    return None, None


@requires("manage_followers")
@require_http_methods(["GET", "POST"])
def follower_rewind(request, name: str):
    """GET: the target form, and with a target how many streams a rewind replays; POST: rewind, audit, redirect."""
    store, feed = _follower_parts()
    state = _follower_or_404(store, name)
    data = request.POST if request.method == "POST" else request.GET
    target, problem = _rewind_target(data, feed)
    if problem:
        messages.error(request, problem)
    if target is not None and request.method == "POST":
        store.rewind(name, target, now=datetime.now(UTC))
        audit(request, "follower.rewind", f"follower:{name}", from_position=state.position, to_position=target)
        messages.success(request, f"Rewound {name} from position {state.position} to {target}.")
        return redirect("wow_console:followers")
    replay = feed.count_between(target, state.position) if target is not None and target < state.position else 0
    return page(request, "follower_rewind.html", f"Rewind {name}", name=name, state=state, target=target,
                replay=replay, to_position=data.get("to_position", ""), to_time=data.get("to_time", ""),
                back=reverse("wow_console:followers"))

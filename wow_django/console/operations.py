"""Topic consumers and followers in the console: lists, and audited actions behind confirmation pages."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from wow_django.application.followers import declared_followers
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus
from wow_django.console.base import allowed, audit, page, requires
from wow_django.exceptions import EnvelopeValidationError, UnknownFollower
from wow_django.log import first_line
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
    for row in rows:
        if row["error"]:
            row["error"]["summary"] = first_line(row["error"]["error"])
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


def _poisoned_or_message(request, store, name: str):
    """The follower's state when it is stopped on a poison event, and — on a POST — still on the one the
    confirmation page showed (``position``); else None after saying why."""
    state = _follower_or_404(store, name)
    if state.poison is None:
        messages.error(request, f"{name} is not stopped on a poison event (any more): nothing to do.")
        return None
    if request.method == "POST" and request.POST.get("position") != str(state.poison.position):
        messages.error(request, f"{name} is no longer stopped at the position the page showed (now at "
                                f"{state.poison.position}): look again before acting.")
        return None
    return state


@requires("manage_followers")
@require_http_methods(["GET", "POST"])
def follower_retry(request, name: str):
    """GET: what retrying the poison event does; POST: clear it (the follower handles that stream again),
    audit, redirect. What ``wow_followers retry`` does."""
    store, _ = _follower_parts()
    state = _poisoned_or_message(request, store, name)
    if state is None:
        return redirect("wow_console:followers")
    poison = state.poison
    if request.method == "POST":
        store.rewind(name, state.position, now=datetime.now(UTC))
        audit(request, "follower.retry", f"follower:{name}", position=poison.position, streamId=poison.stream_id,
              aggregate=poison.aggregate, error=poison.error[:500])
        messages.success(request, f"Cleared the poison event of {name} at position {poison.position}: "
                                  "it handles that stream again.")
        return redirect("wow_console:followers")
    return page(request, "follower_poison.html", f"Retry {name}?", name=name, state=state, poison=poison,
                action="retry")


MAX_REASON = 500


@requires("manage_followers")
@require_http_methods(["GET", "POST"])
def follower_skip(request, name: str):
    """GET: the poison event and a reason to give; POST (with ``reason``): pass it, audited by the store
    (who, why, what) and the console, redirect. What ``wow_followers skip`` does."""
    store, _ = _follower_parts()
    state = _poisoned_or_message(request, store, name)
    if state is None:
        return redirect("wow_console:followers")
    poison = state.poison
    reason = (request.POST.get("reason") or "").strip() if request.method == "POST" else ""
    if request.method == "POST":
        if not reason or len(reason) > MAX_REASON:
            messages.error(request, f"reason: say why the event is skipped (1 to {MAX_REASON} characters); "
                                    "it is kept with the skip")
        else:
            try:
                skipped = store.skip_poison(name, by=request.user.get_username(), reason=reason,
                                            now=datetime.now(UTC))
            except ValueError as exc:  # it was retried or skipped by someone else meanwhile
                messages.error(request, f"Not skipped: {exc}")
                return redirect("wow_console:followers")
            audit(request, "follower.skip", f"follower:{name}", position=skipped.position,
                  streamId=skipped.stream_id, aggregate=skipped.aggregate, reason=reason)
            messages.success(request, f"Skipped position {skipped.position} ({skipped.aggregate}) of {name}.")
            return redirect("wow_console:followers")
    return page(request, "follower_poison.html", f"Skip the poison event of {name}?", name=name, state=state,
                poison=poison, action="skip", reason=request.POST.get("reason", "")[:MAX_REASON])


def _stream_target(data, feed) -> tuple[int | None, str | None]:
    """The position just before the stream ``aggregate``/``aggregate_id`` at ``version`` (a rewind there
    replays that stream first), or a problem."""
    name, aggregate_id = (data.get("aggregate") or "").strip(), (data.get("aggregate_id") or "").strip()
    version = (data.get("version") or "").strip()
    if not version.isdecimal() or not 1 <= int(version) <= MAX_POSITION:
        return None, f"version: must be a whole number from 1, got {version!r}"
    if not name or not aggregate_id or len(name) > 200 or len(aggregate_id) > 500:
        return None, "aggregate: name the stream's aggregate and aggregate id"
    position = feed.position_of(name, aggregate_id, int(version))
    if position is None:
        return None, f"aggregate: no stream {name}/{aggregate_id} at version {version} is stored"
    return position - 1, None


def _rewind_target(data, feed) -> tuple[int | None, str | None]:
    """(position, None) from ``to_position``, ``to_time`` or a stream (``aggregate``, ``aggregate_id``,
    ``version``); (None, problem) for bad input; (None, None) for none."""
    position, moment = (data.get("to_position") or "").strip(), (data.get("to_time") or "").strip()
    if data.get("version"):
        return _stream_target(data, feed)
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
    stream = {key: data.get(key, "") for key in ("aggregate", "aggregate_id", "version")} if data.get("version") \
        else None
    return page(request, "follower_rewind.html", f"Rewind {name}", name=name, state=state, target=target,
                replay=replay, to_position=data.get("to_position", ""), to_time=data.get("to_time", ""),
                stream=stream, back=reverse("wow_console:followers"))


@requires("manage_followers")
def rewind_to_stream(request):
    """From a stream's row: the rewind page of the chosen ``follower``, with that stream as the target."""
    store, _ = _follower_parts()
    name = request.GET.get("follower", "")
    _follower_or_404(store, name)
    query = urlencode({key: request.GET.get(key, "") for key in ("aggregate", "aggregate_id", "version")})
    return redirect(f"{reverse('wow_console:follower_rewind', args=[name])}?{query}")

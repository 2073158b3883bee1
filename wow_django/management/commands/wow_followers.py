"""Followers' status and operations.

::

    manage.py wow_followers [--format json]
    manage.py wow_followers pause NAME | resume NAME | retry NAME
    manage.py wow_followers rewind NAME (--to-position P | --to-time ISO) [--yes]
    manage.py wow_followers skip NAME --reason TEXT [--by WHO]
"""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from wow_django.application.followers import declared_followers
from wow_django.application.runtime import get_runtime
from wow_django.exceptions import UnknownFollower
from wow_django.log import first_line
from wow_django.persistence.followers import FollowerState, FollowerStore, StreamFeed


def status(state: FollowerState | None, name: str, feed: StreamFeed, now: datetime,
           declared: dict | None = None) -> dict:
    """One follower's status: position, lag in streams and seconds, gaps, poison, pause, lease.

    ``declared``: :func:`declared_followers` if already at hand."""
    declared = declared_followers() if declared is None else declared
    position = state.position if state else 0
    head = feed.head()
    lag_events = feed.count_between(position, head) if head > position else 0
    lag_seconds = 0.0
    if lag_events:
        waiting = feed.read(position, 1)
        if waiting:
            created = datetime.fromtimestamp(waiting[0].stream.create_time / 1000, UTC)
            lag_seconds = round(max(0.0, (now - created).total_seconds()), 3)
    lease_holder: str | None = None  # who holds the lease, and until when, while it lasts
    lease_until: str | None = None
    if state is not None and state.lease_owner and state.lease_until and state.lease_until > now:
        lease_holder, lease_until = state.lease_owner, state.lease_until.isoformat()
    poison = state.poison if state else None
    gap = state.last_gap if state else None
    return {
        "name": name,
        "declared": name in declared,
        "kind": declared[name].kind if name in declared else None,
        "position": position,
        "head": head,
        "lag_events": lag_events,
        "lag_seconds": lag_seconds,
        "gaps_skipped": state.gaps_skipped if state else 0,
        "last_gap": {"first": gap.first, "last": gap.last, "seen_at": gap.seen_at.isoformat(),
                     "skipped_at": gap.skipped_at.isoformat()} if gap else None,
        "error": {"position": poison.position, "stream_id": poison.stream_id, "aggregate": poison.aggregate,
                  "error": poison.error, "at": poison.at.isoformat()} if poison else None,
        "paused": state.paused if state else False,
        "lease_holder": lease_holder,
        "lease_until": lease_until,
        "updated_at": state.updated_at.isoformat() if state else None,
    }


class Command(BaseCommand):
    help = "Show followers' status (position, lag, gaps, errors, pause, lease), or pause, resume, rewind, retry, skip."

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=("text", "json"), default="text", help="Status output format.")
        actions = parser.add_subparsers(dest="action", metavar="ACTION")
        for action, text in (("pause", "Pause a follower: its instances keep the lease and wait."),
                             ("resume", "Resume a paused follower."),
                             ("retry", "Clear the poison event a follower stopped on: it handles that stream again."),
                             ("rewind", "Move a follower's checkpoint to a position or time (replays what follows)."),
                             ("skip", "Pass the poison event a follower stopped on, with an audit record.")):
            sub = actions.add_parser(action, help=text, description=text)
            sub.add_argument("name", metavar="NAME", help="The follower's name.")
            if action == "rewind":
                target = sub.add_mutually_exclusive_group(required=True)
                target.add_argument("--to-position", dest="to_position", help="The new checkpoint (an integer ≥ 0).")
                target.add_argument("--to-time", dest="to_time",
                                    help="ISO time: the checkpoint becomes the last stream created before it.")
                sub.add_argument("--yes", action="store_true", help="Rewind; without it the command only tells.")
            if action == "skip":
                sub.add_argument("--reason", required=True, help="Why the event is skipped (kept in the audit).")
                sub.add_argument("--by", default=None, help="Who skips it (default: this user).")

    def handle(self, *args, action=None, name=None, **options):
        runtime = get_runtime()
        try:
            store, feed = runtime.follower_store, runtime.stream_feed
        except NotImplementedError as exc:
            raise CommandError(str(exc)) from exc
        now = datetime.now(UTC)
        if action is None:
            return self._status(store, feed, now, options["format"])
        if action in ("pause", "resume"):
            self._call(name, store.set_paused, name, action == "pause")
            self.stdout.write(self.style.SUCCESS(f"{'Paused' if action == 'pause' else 'Resumed'} {name}."))
        elif action == "retry":
            state = self._state(store, name)
            if state.poison is None:
                raise CommandError(f"NAME: follower {name!r} is not stopped on a poison event")
            store.rewind(name, state.position, now=now)
            self.stdout.write(self.style.SUCCESS(
                f"Cleared the poison event of {name} at position {state.poison.position}: it is handled again."))
        elif action == "skip":
            reason = (options["reason"] or "").strip()
            if not reason:
                raise CommandError("--reason must say why the event is skipped")
            by = options["by"] or getpass.getuser()
            try:
                poison = store.skip_poison(name, by=by, reason=reason, now=now)
            except UnknownFollower as exc:
                raise CommandError(f"NAME: {exc}") from exc
            except ValueError as exc:
                raise CommandError(f"NAME: {exc}") from exc
            self.stdout.write(self.style.SUCCESS(
                f"Skipped position {poison.position} ({poison.aggregate}) of {name}; audited as skipped by {by}."))
        elif action == "rewind":
            self._rewind(store, feed, name, now, options)

    def _state(self, store: FollowerStore, name: str) -> FollowerState:
        state = store.get(name)
        if state is None:
            raise CommandError(f"NAME: {UnknownFollower(name)}")
        return state

    def _call(self, name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnknownFollower as exc:
            raise CommandError(f"NAME: {exc}") from exc

    def _rewind(self, store: FollowerStore, feed: StreamFeed, name: str, now: datetime, options) -> None:
        state = self._state(store, name)
        if options["to_position"] is not None:
            try:
                target = int(options["to_position"])
            except ValueError:
                target = -1
            if target < 0:
                raise CommandError(f"--to-position must be an integer ≥ 0, got {options['to_position']!r}")
        else:
            moment = parse_datetime(options["to_time"] or "")
            if moment is None:
                raise CommandError(f"--to-time must be an ISO time such as 2026-05-01T12:00:00Z, "
                                   f"got {options['to_time']!r}")
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            target = feed.position_at(moment)
        replay = feed.count_between(target, state.position) if target < state.position else 0
        self.stdout.write(f"Rewinding {name} from position {state.position} to {target} replays {replay} "
                          f"stream(s).")
        if not options["yes"]:
            self.stdout.write("Nothing changed: add --yes to rewind.")
            return
        store.rewind(name, target, now=now)
        self.stdout.write(self.style.SUCCESS(f"Rewound {name} to position {target}."))

    def _status(self, store: FollowerStore, feed: StreamFeed, now: datetime, fmt: str) -> None:
        states = {state.name: state for state in store.all()}
        declared = declared_followers()
        names = sorted(set(states) | set(declared))
        rows = [status(states.get(name), name, feed, now, declared) for name in names]
        if fmt == "json":
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("No follower is declared or has run.")
            return
        for row in rows:
            flags = []
            if row["paused"]:
                flags.append("PAUSED")
            if row["error"]:
                flags.append(f"STOPPED at {row['error']['position']} ({row['error']['aggregate']}): "
                             f"{first_line(row['error']['error'])}")
            if not row["declared"]:
                flags.append("not declared in this project")
            self.stdout.write(
                f"{row['name']}: position {row['position']} of {row['head']}, lag {row['lag_events']} stream(s) / "
                f"{row['lag_seconds']}s, gaps skipped {row['gaps_skipped']}, lease "
                f"{row['lease_holder'] or 'free'}" + "".join(f"; {flag}" for flag in flags))

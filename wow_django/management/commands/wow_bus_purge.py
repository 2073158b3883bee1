"""Delete bus events past their retention, with their feedback, inbox entries and re-push audit."""

from __future__ import annotations

import copy

from django.core.management.base import BaseCommand, CommandError

from wow_django.application.runtime import get_runtime


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise CommandError(f"{value!r} is not a number of days") from None
    if not days >= 0:
        raise CommandError(f"a number of days is ≥ 0, not {value!r}")
    return days


class Command(BaseCommand):
    help = ("Delete bus events past their retention: CONSUMED events --retention-days after they settled, "
            "events of any status --expired-retention-days after their expireAt (defaults: "
            "WOW['BUS_RETENTION_DAYS'] and WOW['BUS_EXPIRED_RETENTION_DAYS']). Events in flight or failed "
            "are kept.")

    def add_arguments(self, parser):
        parser.add_argument("--retention-days", type=_days, default=None,
                            help="CONSUMED events older than this (since they settled) go")
        parser.add_argument("--expired-retention-days", type=_days, default=None,
                            help="events whose expireAt is older than this go")
        parser.add_argument("--max-events", type=int, default=50_000,
                            help="stop after this many (run again to go on); default 50000")

    def handle(self, *args, retention_days, expired_retention_days, max_events, **options):
        if max_events < 1:
            raise CommandError("--max-events must be at least 1")
        bus = copy.copy(get_runtime().bus)  # the options apply to this run only
        if retention_days is not None:
            bus.retention_days = retention_days
        if expired_retention_days is not None:
            bus.expired_retention_days = expired_retention_days
        if bus.retention_days is None and bus.expired_retention_days is None:
            raise CommandError("no retention is set: give --retention-days or --expired-retention-days, or set "
                               "WOW['BUS_RETENTION_DAYS'] / WOW['BUS_EXPIRED_RETENTION_DAYS']")
        purged = bus.purge(max_events=max_events)
        self.stdout.write(f"purged {len(purged)} event(s)"
                          + (" (the limit: run again to go on)" if len(purged) >= max_events else ""))

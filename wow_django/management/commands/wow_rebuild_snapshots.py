"""Replay events into fresh snapshots. Safe to rerun: saves are version-guarded."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from wow_django.application.runtime import get_runtime
from wow_django.application.snapshotting import rebuild_snapshots
from wow_django.domain.registry import aggregates as registered


class Progress:
    """A one-line progress bar on a terminal, a line per 10% elsewhere."""

    def __init__(self, stream, label: str, total: int, width: int = 30):
        self.stream, self.label, self.total, self.width = stream, label, total, width
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self._last_tenth = -1

    def __call__(self, done: int, _aggregate_id: str = "") -> None:
        total = max(self.total, done)
        filled = int(self.width * done / total) if total else self.width
        line = f"{self.label}: [{'#' * filled}{'-' * (self.width - filled)}] {done}/{total}"
        if self.tty:
            self.stream.write("\r" + line)
            self.stream.flush()
            return
        tenth = done * 10 // total if total else 10
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(line + "\n")

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")


class Command(BaseCommand):
    help = "Rebuild snapshots by replaying every aggregate's events (all aggregate types, or those named)."

    def add_arguments(self, parser):
        parser.add_argument("aggregates", nargs="*", help="aggregate names (default: every registered one)")
        parser.add_argument("--batch", type=int, default=500, help="aggregate ids read per scan (default 500)")

    def handle(self, *args, aggregates=(), batch=500, **options):
        names = list(aggregates or ())
        known = registered()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CommandError(f"Unknown aggregate(s): {', '.join(unknown)}. Known: {', '.join(sorted(known)) or 'none'}.")
        if batch < 1:
            raise CommandError("--batch must be ≥ 1")
        repository = get_runtime().gateway.repository
        if repository.snapshot_store is None:
            raise CommandError("No snapshot store is configured.")
        out = self.stdout._out if hasattr(self.stdout, "_out") else sys.stdout
        for name in names or sorted(known):
            total = sum(1 for _ in repository.event_store.iter_all(name, batch=batch))
            progress = Progress(out, name, total)
            done = rebuild_snapshots(repository, known[name], progress=progress, batch=batch)
            progress.finish()
            self.stdout.write(self.style.SUCCESS(f"{name}: {done} snapshot(s) rebuilt"))

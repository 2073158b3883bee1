"""Create or verify the MongoDB collections and indexes wow_django needs."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from wow_django.backends.mongo import initialize, planned_specs


class Command(BaseCommand):
    help = (
        "Claim each configured MongoDB database for this bounded context and create the "
        "collections and indexes of every registered aggregate, prepare key and the bus. "
        "Never drops anything. With --check, change nothing and exit 1 unless the schema matches."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--check", action="store_true",
            help="Only verify; exit status 0 when everything exists and matches, 1 otherwise.",
        )

    def handle(self, *args, check=False, **options):
        if not planned_specs():
            self.stdout.write("Nothing to do: no aggregate, prepare key or bus collection uses MongoDB.")
            return
        report = initialize(check_only=check)
        styles = {"created": self.style.SUCCESS, "verified": str, "missing": self.style.WARNING,
                  "conflict": self.style.ERROR}
        for database, collection, subject, state in report.lines:
            self.stdout.write(styles[state](f"{state:9} {database}.{collection} {subject}"))
        for problem in report.problems:
            self.stderr.write(self.style.ERROR(problem))
        counts = {}
        for *_, state in report.lines:
            counts[state] = counts.get(state, 0) + 1
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        if report.problems:
            raise CommandError(f"Schema does not match ({summary}).", returncode=1)
        if check and not report.matches:
            raise CommandError(f"Schema is incomplete ({summary}); run wow_init_schema without --check.",
                               returncode=1)
        self.stdout.write(self.style.SUCCESS(f"Schema OK ({summary})."))

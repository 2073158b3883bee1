"""Create or verify the schema wow_django's stores need: MongoDB collections and indexes, and the
django backend's migrations, tables, constraints and indexes."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from wow_django.backends import mongo
from wow_django.backends.django import schema as django_schema
from wow_django.persistence.schema import SchemaReport


class Command(BaseCommand):
    help = (
        "For stores on MongoDB: claim each configured database for this bounded context and create the "
        "collections and indexes of every registered aggregate, prepare key and the bus. For stores on the "
        "django backend: apply the wow_django/wow_bus migrations on WOW['DATABASE_ALIAS'] and verify their "
        "tables, unique constraints and indexes. Never drops anything. With --check, change nothing and exit 1 "
        "unless the schema matches."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--check", action="store_true",
            help="Only verify; exit status 0 when everything exists and matches, 1 otherwise.",
        )

    def handle(self, *args, check=False, **options):
        uses_mongo = bool(mongo.planned_specs())
        uses_django = bool(django_schema.planned_apps())
        if not (uses_mongo or uses_django):
            self.stdout.write("Nothing to do: no store uses MongoDB or the django backend.")
            return
        report = SchemaReport()
        try:
            if uses_django:
                report.merge(django_schema.initialize(check_only=check))
            if uses_mongo:
                report.merge(mongo.initialize(check_only=check))
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
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

"""The django backend's schema: its apps' migrations, tables, unique constraints and indexes.

``manage.py wow_init_schema`` calls :func:`initialize` for the database of
``WOW['DATABASE_ALIAS']`` when a store uses the django backend:

* **migrations**: the unapplied migrations of ``wow_django`` (events,
  snapshots, prepare keys) and of ``wow_bus`` (the bus records, when the bus
  store is the django backend) are applied — or, with ``check_only``,
  reported ``missing``;
* **tables, constraints, indexes**: each table of those apps is read back from
  the database (Django's introspection) and every unique constraint and index
  its model declares must be there by name. One that was dropped by hand
  while the migrations say it exists is created again (``check_only``:
  ``missing``); a missing table whose migration is recorded as applied is a
  ``conflict`` (the migration history and the database disagree; nothing is
  guessed).

Like the MongoDB initializer it never drops anything: the report says what it
found (only a database that is not configured, or not PostgreSQL or SQLite,
raises ``ImproperlyConfigured``).
"""

from __future__ import annotations

from django.apps import apps
from django.core.management import call_command
from django.db import DatabaseError, models
from django.db.migrations.executor import MigrationExecutor

from wow_django.backends.django.connection import prepare_database
from wow_django.conf import wow_settings
from wow_django.persistence.schema import SchemaReport

#: Which app's tables serve which stores.
STORE_APPS = (
    ("wow_django", ("EVENT_STORE", "SNAPSHOT_STORE", "PREPARE_STORE")),
    ("wow_bus", ("BUS_STORE",)),
)


def planned_apps() -> list[str]:
    """The labels of the backend apps whose tables the configured stores use."""
    planned = []
    for label, purposes in STORE_APPS:
        if any(wow_settings.storage_for(purpose) == "django" for purpose in purposes):
            if label == "wow_bus" and not apps.is_installed("wow_django.bus"):
                continue  # no bus app, no bus store: the runtime refuses it with its own message
            planned.append(label)
    return planned


def initialize(*, check_only: bool = False, using: str | None = None) -> SchemaReport:
    """Reconcile the planned apps' schema on ``using`` (default ``WOW['DATABASE_ALIAS']``); report, raise nothing."""
    using = using or wow_settings.DATABASE_ALIAS
    report = SchemaReport()
    labels = planned_apps()
    if not labels:
        return report
    connection = prepare_database(using)  # ImproperlyConfigured for an unknown alias or engine
    pending = _unapplied(connection, labels)
    for label in labels:
        names = pending.get(label, [])
        if not names:
            report.add(using, label, "migrations", "verified")
            continue
        if check_only:
            for name in names:
                report.add(using, label, f"migration {name}", "missing")
            continue
        call_command("migrate", label, database=using, interactive=False, verbosity=0)
        for name in names:
            report.add(using, label, f"migration {name}", "created")
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
    for label in labels:
        unapplied = bool(pending.get(label)) and check_only
        for model in apps.get_app_config(label).get_models():
            if not model._meta.managed or model._meta.proxy:  # e.g. the bus app's permission holder
                continue
            _reconcile_table(report, connection, model, tables, check_only=check_only, unapplied=unapplied)
    return report


def _unapplied(connection, labels: list[str]) -> dict[str, list[str]]:
    executor = MigrationExecutor(connection)
    targets = [node for label in labels for node in executor.loader.graph.leaf_nodes(label)]
    pending: dict[str, list[str]] = {}
    for migration, backwards in executor.migration_plan(targets):
        if not backwards and migration.app_label in labels:
            pending.setdefault(migration.app_label, []).append(migration.name)
    return pending


def _expected(model: type[models.Model]) -> list[models.Index | models.UniqueConstraint]:
    declared = [*model._meta.constraints, *model._meta.indexes]
    return [item for item in declared if isinstance(item, models.Index | models.UniqueConstraint)]


def _reconcile_table(report: SchemaReport, connection, model: type[models.Model], tables: set[str], *,
                     check_only: bool, unapplied: bool) -> None:
    table, using = model._meta.db_table, connection.alias
    if table not in tables:
        if unapplied:  # the pending migration creates it
            report.add(using, table, "table", "missing")
            return
        report.add(using, table, "table", "conflict")
        report.conflicts.append(
            f"{using}: table {table} of app {model._meta.app_label} does not exist although its migrations are "
            f"recorded as applied. Re-create it (e.g. manage.py migrate {model._meta.app_label} zero "
            f"--database={using}, then migrate again — that drops its data) or restore it."
        )
        return
    report.add(using, table, "table", "verified")
    with connection.cursor() as cursor:
        present = connection.introspection.get_constraints(cursor, table)
    for item in _expected(model):
        kind = "unique" if isinstance(item, models.UniqueConstraint) else "index"
        subject = f"{kind} {item.name} ({', '.join(item.fields)})"
        if item.name in present:
            if kind == "unique" and not (present[item.name].get("unique") or present[item.name].get("primary_key")):
                report.add(using, table, subject, "conflict")
                report.conflicts.append(f"{using}: {table}.{item.name} exists but is not unique; drop it and run "
                                        "wow_init_schema again.")
            else:
                report.add(using, table, subject, "verified")
            continue
        if check_only:
            report.add(using, table, subject, "missing")
            continue
        try:
            with connection.schema_editor() as editor:
                if kind == "unique":
                    editor.add_constraint(model, item)
                else:
                    editor.add_index(model, item)
        except DatabaseError as exc:  # e.g. rows that already break the unique constraint
            report.add(using, table, subject, "conflict")
            report.conflicts.append(f"{using}: cannot create {table}.{item.name}: {exc}")
            continue
        report.add(using, table, subject, "created")

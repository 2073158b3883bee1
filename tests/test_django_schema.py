"""``wow_init_schema`` on the django backend: migrations applied? tables, unique constraints, indexes there?

Runs on SQLite (``wow_sqlite``) and PostgreSQL (``wow_pg``). Each test leaves
the schema as it found it.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.db.migrations.state import ModelState, ProjectState
from django.test import override_settings

from wow_django.backends.django.bus_models import TopicConsumerRecord
from wow_django.backends.django.models import EventStreamRow, PrepareKeyRow
from wow_django.backends.django.schema import initialize, planned_apps

ALIASES = ["wow_sqlite", "wow_pg"]
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", *ALIASES])


@pytest.fixture(params=ALIASES)
def alias(request):
    with override_settings(WOW={"CONTEXT_NAME": "order-service", "STORAGE": "django",
                                "DATABASE_ALIAS": request.param}):
        yield request.param


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("wow_init_schema", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def failing(*args) -> tuple[CommandError, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("wow_init_schema", *args, stdout=out, stderr=err)
    return caught.value, out.getvalue(), err.getvalue()


def test_a_migrated_database_checks_ok(alias):
    out, _ = run("--check")
    assert "Schema OK" in out
    assert f"verified  {alias}.wow_django migrations" in out
    assert f"verified  {alias}.wow_bus migrations" in out
    assert f"verified  {alias}.wow_event_stream unique wow_stream_agg_version_uniq (aggregate_name, aggregate_id, version)" in out
    assert f"verified  {alias}.wow_event_stream index wow_stream_ctx_position (context_name, position)" in out
    assert f"verified  {alias}.wow_bus_event unique wow_bus_event_id_uniq (eventId)" in out
    assert "missing" not in out and "created" not in out


def test_a_dropped_index_is_missing_then_created(alias):
    connection = connections[alias]
    with connection.schema_editor() as editor:
        editor.remove_index(EventStreamRow, _named(EventStreamRow._meta.indexes, "wow_stream_ctx_position"))
        editor.remove_constraint(_without(PrepareKeyRow, "wow_prepare_key_uniq"),
                                 _named(PrepareKeyRow._meta.constraints, "wow_prepare_key_uniq"))
    error, out, _ = failing("--check")
    assert error.returncode == 1 and "Schema is incomplete" in str(error)
    assert f"missing   {alias}.wow_event_stream index wow_stream_ctx_position" in out
    assert f"missing   {alias}.wow_prepare_key unique wow_prepare_key_uniq (name, key)" in out
    assert _constraint_names(alias, "wow_event_stream").isdisjoint({"wow_stream_ctx_position"})  # --check changed nothing
    out, _ = run()
    assert f"created   {alias}.wow_event_stream index wow_stream_ctx_position" in out
    assert f"created   {alias}.wow_prepare_key unique wow_prepare_key_uniq" in out
    assert "wow_prepare_key_uniq" in _constraint_names(alias, "wow_prepare_key")
    out, _ = run("--check")
    assert "Schema OK" in out


def test_unapplied_migrations_are_missing_then_applied(alias):
    call_command("migrate", "wow_bus", "zero", database=alias, verbosity=0)
    try:
        error, out, _ = failing("--check")
        assert error.returncode == 1
        assert f"missing   {alias}.wow_bus migration 0001_initial" in out
        assert f"missing   {alias}.wow_bus migration 0002_django_bus_store" in out
        assert f"missing   {alias}.wow_bus_topic_consumer table" in out
        assert f"verified  {alias}.wow_django migrations" in out
        assert TopicConsumerRecord._meta.db_table not in _tables(alias)
        out, _ = run()
        assert f"created   {alias}.wow_bus migration 0002_django_bus_store" in out
        assert f"verified  {alias}.wow_bus_topic_consumer table" in out
        assert "Schema OK" in run("--check")[0]
    finally:
        call_command("migrate", "wow_bus", database=alias, verbosity=0)


def test_the_initiator_columns_migration_fills_existing_events(alias):
    """Events stored before migration 0004 are found by their initiator's user and request id after it."""
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[alias]
    executor = MigrationExecutor(connection)
    executor.migrate([("wow_bus", "0003_purge_indexes")])
    try:
        old = executor.loader.project_state([("wow_bus", "0003_purge_indexes")]).apps.get_model("wow_bus", "EventRecord")
        rows = [old(eventId=f"evt-old-{n}", initiator=initiator, occurredAt=None) for n, initiator in enumerate([
            {"service": "s", "userId": "ann", "clientRequestId": "req-1"}, {"service": "s", "userId": "bob"},
            {"service": "s"}, None, "not an object", {"userId": 5, "clientRequestId": "r" * 256}])]
        old.objects.using(alias).bulk_create(rows)
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("wow_bus"))
        from wow_django.backends.django.bus_models import EventRecord

        filled = {r.eventId: (r.initiatorUserId, r.initiatorRequestId) for r in EventRecord.objects.using(alias)
                  .filter(eventId__startswith="evt-old-")}
        assert filled == {"evt-old-0": ("ann", "req-1"), "evt-old-1": ("bob", None), "evt-old-2": (None, None),
                          "evt-old-3": (None, None), "evt-old-4": (None, None),
                          "evt-old-5": (None, None)}  # no text, or more than the column holds: the JSON keeps it
        assert {"wow_bus_event_user_occ", "wow_bus_event_request_occ"} <= _constraint_names(alias, "wow_bus_event")
    finally:
        from wow_django.backends.django.bus_models import EventRecord

        EventRecord.objects.using(alias).filter(eventId__startswith="evt-old-").delete()
        call_command("migrate", "wow_bus", database=alias, verbosity=0)


def test_a_table_dropped_behind_the_migrations_back_is_a_conflict(alias):
    connection = connections[alias]
    with connection.schema_editor() as editor:
        editor.delete_model(PrepareKeyRow)
    try:
        error, out, err = failing()
        assert error.returncode == 1 and "Schema does not match" in str(error)
        assert f"conflict  {alias}.wow_prepare_key table" in out
        assert "does not exist although its migrations are recorded as applied" in err
        assert "wow_prepare_key" not in _tables(alias)  # nothing guessed, nothing created
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(PrepareKeyRow)


def test_rows_that_break_a_unique_constraint_are_a_conflict_not_a_crash(alias):
    connection = connections[alias]
    constraint = _named(PrepareKeyRow._meta.constraints, "wow_prepare_key_uniq")
    with connection.schema_editor() as editor:
        editor.remove_constraint(_without(PrepareKeyRow, "wow_prepare_key_uniq"), constraint)
    try:
        for _ in range(2):
            PrepareKeyRow.objects.using(alias).create(name="username", key="ada", value={}, ttl_at=0)
        error, out, err = failing()
        assert f"conflict  {alias}.wow_prepare_key unique wow_prepare_key_uniq" in out
        assert "cannot create wow_prepare_key.wow_prepare_key_uniq" in err
    finally:
        PrepareKeyRow.objects.using(alias).all().delete()
        if "wow_prepare_key_uniq" not in _constraint_names(alias, "wow_prepare_key"):
            with connection.schema_editor() as editor:
                editor.add_constraint(PrepareKeyRow, constraint)


def test_only_the_apps_the_stores_use_are_planned():
    with override_settings(WOW={"STORAGE": "in_memory"}):
        assert planned_apps() == []
        out, _ = run()
        assert "Nothing to do" in out
    with override_settings(WOW={"STORAGE": "in_memory", "BUS_STORE": "django"}):
        assert planned_apps() == ["wow_bus"]
    with override_settings(WOW={"STORAGE": "django", "BUS_STORE": "in_memory"}):
        assert planned_apps() == ["wow_django"]
        assert initialize(check_only=True, using="wow_sqlite").matches


def test_an_unknown_database_alias_is_a_command_error():
    with override_settings(WOW={"STORAGE": "django", "DATABASE_ALIAS": "nope"}):
        error, out, _ = failing("--check")
    assert "WOW['DATABASE_ALIAS'] must name a database in settings.DATABASES" in str(error)
    assert out == ""


def _without(model, constraint_name: str):
    """``model`` as a migration would see it once ``constraint_name`` is gone (SQLite rebuilds the table from it)."""
    state = ModelState.from_model(model)
    state.options["constraints"] = [c for c in state.options.get("constraints", []) if c.name != constraint_name]
    project = ProjectState()
    project.add_model(state)
    return project.apps.get_model(model._meta.app_label, model._meta.model_name)


def _named(items, name):
    [item] = [item for item in items if item.name == name]
    return item


def _tables(alias: str) -> set[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def _constraint_names(alias: str, table: str) -> set[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))

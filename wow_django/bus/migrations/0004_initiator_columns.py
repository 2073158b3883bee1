# The initiator's userId and clientRequestId in columns of their own, with a listing index each, so that an
# operator finds the events of a user or of a request (the bus event list's userId/clientRequestId filters).
# Existing rows are filled from their initiator JSON.

from django.db import migrations, models

# (name, column): each index is (column, occurred_at DESC, event_id), as migration 0002's listing indexes.
INITIATOR_INDEXES = (
    ("wow_bus_event_user_occ", "initiator_user_id"),
    ("wow_bus_event_request_occ", "initiator_request_id"),
)
BATCH = 1000


def fill_from_initiator(apps, schema_editor):
    """Copy initiator.userId and .clientRequestId of the existing events into the new columns."""
    events = apps.get_model("wow_bus", "EventRecord").objects.using(schema_editor.connection.alias)
    last = 0
    while True:
        rows = list(events.filter(id__gt=last).order_by("id").values("id", "initiator")[:BATCH])
        if not rows:
            return
        for row in rows:
            initiator = row["initiator"] if isinstance(row["initiator"], dict) else {}
            user, request = initiator.get("userId"), initiator.get("clientRequestId")
            if isinstance(user, str) or isinstance(request, str):
                events.filter(id=row["id"]).update(
                    initiatorUserId=user if isinstance(user, str) else None,
                    initiatorRequestId=request if isinstance(request, str) else None)
        last = rows[-1]["id"]


def create_indexes(apps, schema_editor):
    quote = schema_editor.quote_name
    postgresql = schema_editor.connection.vendor == "postgresql"
    nulls = " NULLS LAST" if postgresql else ""
    event_id = quote("event_id") + (' COLLATE "C"' if postgresql else "")
    for name, column in INITIATOR_INDEXES:
        schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote('wow_bus_event')} "
                              f"({quote(column)}, {quote('occurred_at')} DESC{nulls}, {event_id})")


def drop_indexes(apps, schema_editor):
    for name, _ in INITIATOR_INDEXES:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):

    dependencies = [
        ('wow_bus', '0003_purge_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='eventrecord',
            name='initiatorUserId',
            field=models.CharField(db_column='initiator_user_id', max_length=255, null=True),
        ),
        migrations.AddField(
            model_name='eventrecord',
            name='initiatorRequestId',
            field=models.CharField(db_column='initiator_request_id', max_length=255, null=True),
        ),
        migrations.RunPython(fill_from_initiator, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(create_indexes, drop_indexes),
    ]

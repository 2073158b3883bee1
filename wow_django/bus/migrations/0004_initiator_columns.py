# The initiator's userId and clientRequestId in columns of their own, with a listing index each, so that an
# operator finds the events of a user or of a request (the bus event list's userId/clientRequestId filters).
#
# Not one transaction: the columns are added (nullable: no table rewrite), existing rows are filled from
# their initiator JSON in batches of BATCH rows, each batch its own short transaction, and on PostgreSQL the
# indexes are built CONCURRENTLY — the bus keeps sending and listing meanwhile. Interrupted, it can run
# again: the fill only writes rows still empty, and the indexes are created IF NOT EXISTS.

from django.db import migrations, models, transaction

# (name, column): each index is (column, occurred_at DESC, event_id), as migration 0002's listing indexes.
INITIATOR_INDEXES = (
    ("wow_bus_event_user_occ", "initiator_user_id"),
    ("wow_bus_event_request_occ", "initiator_request_id"),
)
BATCH = 1000
COLUMN_LENGTH = 255


def _text(value):
    """A value the column holds: text that fits, else None (the JSON keeps it)."""
    return value if isinstance(value, str) and len(value) <= COLUMN_LENGTH else None


def fill_from_initiator(apps, schema_editor):
    """Copy initiator.userId and .clientRequestId of the existing events into the new columns."""
    model = apps.get_model("wow_bus", "EventRecord")
    alias = schema_editor.connection.alias
    events = model.objects.using(alias)
    last = 0
    while True:
        with transaction.atomic(using=alias):
            rows = list(events.filter(id__gt=last, initiatorUserId__isnull=True, initiatorRequestId__isnull=True)
                        .order_by("id").only("id", "initiator")[:BATCH])
            if not rows:
                return
            changed = []
            for row in rows:
                initiator = row.initiator if isinstance(row.initiator, dict) else {}
                row.initiatorUserId = _text(initiator.get("userId"))
                row.initiatorRequestId = _text(initiator.get("clientRequestId"))
                if row.initiatorUserId is not None or row.initiatorRequestId is not None:
                    changed.append(row)
            events.bulk_update(changed, ["initiatorUserId", "initiatorRequestId"], batch_size=BATCH)
            last = rows[-1].id


def create_indexes(apps, schema_editor):
    quote = schema_editor.quote_name
    postgresql = schema_editor.connection.vendor == "postgresql"
    nulls = " NULLS LAST" if postgresql else ""
    event_id = quote("event_id") + (' COLLATE "C"' if postgresql else "")
    # CONCURRENTLY: writes go on while PostgreSQL builds it (it cannot run inside a transaction)
    how = "CREATE INDEX CONCURRENTLY IF NOT EXISTS" if postgresql and not schema_editor.connection.in_atomic_block \
        else "CREATE INDEX IF NOT EXISTS"
    for name, column in INITIATOR_INDEXES:
        schema_editor.execute(f"{how} {quote(name)} ON {quote('wow_bus_event')} "
                              f"({quote(column)}, {quote('occurred_at')} DESC{nulls}, {event_id})")


def drop_indexes(apps, schema_editor):
    for name, _ in INITIATOR_INDEXES:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):

    atomic = False  # see the top: short transactions, and concurrent index builds on PostgreSQL

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
        migrations.RunPython(fill_from_initiator, migrations.RunPython.noop, elidable=False, atomic=False),
        migrations.RunPython(create_indexes, drop_indexes, atomic=False),
    ]

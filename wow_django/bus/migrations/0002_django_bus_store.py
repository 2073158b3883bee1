# The tables of the django bus store (wow_django.backends.django.bus_models), named wow_bus_*.

from django.db import migrations, models

# The listing indexes of wow_bus_event: (name, filtered column or None, direction of occurredAt).
# Each is (column, occurred_at, event_id) in the order of the store's ORDER BY. PostgreSQL is told
# that a missing occurredAt is the smallest value (NULLS FIRST ascending, NULLS LAST descending, as
# MongoDB and SQLite sort) and to compare event ids by code point (COLLATE "C"); otherwise the
# store's ORDER BY would not match its indexes.
LISTING_INDEXES = (
    ("wow_bus_event_status_occ", "status", "DESC"),
    ("wow_bus_event_topic_occ", "topic", "DESC"),
    ("wow_bus_event_service_occ", "initiator_service", "DESC"),
    ("wow_bus_event_trace_occ", "trace_id", "ASC"),
    ("wow_bus_event_parent_occ", "parent_event_id", "ASC"),
    ("wow_bus_event_occ", None, "DESC"),
)


def create_listing_indexes(apps, schema_editor):
    quote = schema_editor.quote_name
    postgresql = schema_editor.connection.vendor == "postgresql"
    for name, column, direction in LISTING_INDEXES:
        nulls = (" NULLS LAST" if direction == "DESC" else " NULLS FIRST") if postgresql else ""
        event_id = quote("event_id") + (' COLLATE "C"' if postgresql else "")
        columns = ([quote(column)] if column else []) + [f"{quote('occurred_at')} {direction}{nulls}", event_id]
        schema_editor.execute(f"CREATE INDEX {quote(name)} ON {quote('wow_bus_event')} ({', '.join(columns)})")


def drop_listing_indexes(apps, schema_editor):
    for name, _, _ in LISTING_INDEXES:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):

    dependencies = [
        ('wow_bus', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='ConsumptionRecord',
            fields=[
                ('extra', models.JSONField(default=dict)),
                ('absent', models.BigIntegerField(default=0)),
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('eventId', models.CharField(db_column='event_id', max_length=255)),
                ('consumerId', models.CharField(db_column='consumer_id', max_length=255)),
                ('attemptNo', models.BigIntegerField(db_column='attempt_no')),
                ('success', models.BooleanField(db_column='success', null=True)),
                ('consumedAt', models.DateTimeField(db_column='consumed_at', null=True)),
                ('error', models.TextField(db_column='error', null=True)),
                ('source', models.CharField(db_column='source', max_length=255, null=True)),
                ('createdAt', models.DateTimeField(db_column='created_at', null=True)),
            ],
            options={
                'db_table': 'wow_bus_consumption',
                'default_permissions': (),
                'indexes': [models.Index(fields=['consumerId', '-consumedAt'], name='wow_bus_consumer_consumed')],
                'constraints': [models.UniqueConstraint(fields=('eventId', 'consumerId', 'attemptNo'), name='wow_bus_attempt_uniq')],
            },
        ),
        migrations.CreateModel(
            name='EventRecord',
            fields=[
                ('extra', models.JSONField(default=dict)),
                ('absent', models.BigIntegerField(default=0)),
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('eventId', models.CharField(db_column='event_id', max_length=255)),
                ('traceId', models.CharField(db_column='trace_id', max_length=255, null=True)),
                ('spanId', models.CharField(db_column='span_id', max_length=255, null=True)),
                ('parentEventId', models.CharField(db_column='parent_event_id', max_length=255, null=True)),
                ('topic', models.CharField(db_column='topic', max_length=255, null=True)),
                ('payload', models.JSONField(db_column='payload', null=True)),
                ('payloadType', models.CharField(db_column='payload_type', max_length=255, null=True)),
                ('initiator', models.JSONField(db_column='initiator', null=True)),
                ('initiatorService', models.CharField(db_column='initiator_service', max_length=255, null=True)),
                ('occurredAt', models.DateTimeField(db_column='occurred_at', null=True)),
                ('sentAt', models.DateTimeField(db_column='sent_at', null=True)),
                ('contractVersion', models.BigIntegerField(db_column='contract_version', null=True)),
                ('partitionKey', models.CharField(db_column='partition_key', max_length=255, null=True)),
                ('sequence', models.BigIntegerField(db_column='sequence', null=True)),
                ('expireAt', models.DateTimeField(db_column='expire_at', null=True)),
                ('status', models.CharField(db_column='status', max_length=32, null=True)),
                ('statusAt', models.DateTimeField(db_column='status_at', null=True)),
                ('statusRevision', models.BigIntegerField(db_column='status_revision', null=True)),
                ('retryCount', models.BigIntegerField(db_column='retry_count', null=True)),
                ('lastSentAt', models.DateTimeField(db_column='last_sent_at', null=True)),
                ('lastError', models.TextField(db_column='last_error', null=True)),
                ('consumers', models.JSONField(db_column='consumers', null=True)),
                ('createdAt', models.DateTimeField(db_column='created_at', null=True)),
                ('relayLeaseUntil', models.DateTimeField(db_column='relay_lease_until', null=True)),
            ],
            options={
                'db_table': 'wow_bus_event',
                'default_permissions': (),
                'indexes': [models.Index(fields=['status', 'statusAt'], name='wow_bus_event_status_at')],
                'constraints': [models.UniqueConstraint(fields=('eventId',), name='wow_bus_event_id_uniq')],
            },
        ),
        migrations.CreateModel(
            name='InboxEntry',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('consumerId', models.CharField(db_column='consumer_id', max_length=255)),
                ('eventId', models.CharField(db_column='event_id', max_length=255)),
                ('state', models.CharField(db_column='state', max_length=16)),
                ('owner', models.CharField(db_column='owner', max_length=255)),
                ('leaseUntil', models.DateTimeField(db_column='lease_until', null=True)),
                ('claimedAt', models.DateTimeField(db_column='claimed_at', null=True)),
                ('doneAt', models.DateTimeField(db_column='done_at', null=True)),
            ],
            options={
                'db_table': 'wow_bus_inbox',
                'default_permissions': (),
                'constraints': [models.UniqueConstraint(fields=('consumerId', 'eventId'), name='wow_bus_inbox_uniq')],
            },
        ),
        migrations.CreateModel(
            name='RepushRecord',
            fields=[
                ('extra', models.JSONField(default=dict)),
                ('absent', models.BigIntegerField(default=0)),
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('eventId', models.CharField(db_column='event_id', max_length=255)),
                ('requestedAt', models.DateTimeField(db_column='requested_at', null=True)),
                ('consumerId', models.CharField(db_column='consumer_id', max_length=255, null=True)),
                ('requestedBy', models.CharField(db_column='requested_by', max_length=255, null=True)),
                ('retryCount', models.BigIntegerField(db_column='retry_count', null=True)),
                ('previousStatus', models.CharField(db_column='previous_status', max_length=32, null=True)),
                ('outcome', models.CharField(db_column='outcome', max_length=32, null=True)),
                ('error', models.TextField(db_column='error', null=True)),
            ],
            options={
                'db_table': 'wow_bus_repush',
                'default_permissions': (),
                'indexes': [models.Index(fields=['eventId', '-requestedAt'], name='wow_bus_repush_event_at')],
            },
        ),
        migrations.CreateModel(
            name='SequenceRecord',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('consumerId', models.CharField(db_column='consumer_id', max_length=255)),
                ('partitionKey', models.CharField(db_column='partition_key', max_length=255)),
                ('sequence', models.BigIntegerField(db_column='sequence', null=True)),
                ('updatedAt', models.DateTimeField(db_column='updated_at', null=True)),
            ],
            options={
                'db_table': 'wow_bus_sequence',
                'default_permissions': (),
                'constraints': [models.UniqueConstraint(fields=('consumerId', 'partitionKey'), name='wow_bus_sequence_uniq')],
            },
        ),
        migrations.CreateModel(
            name='TopicConsumerRecord',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('topic', models.CharField(db_column='topic', max_length=255)),
                ('consumerId', models.CharField(db_column='consumer_id', max_length=255)),
                ('enabled', models.BooleanField(db_column='enabled')),
                ('description', models.TextField(db_column='description')),
                ('createdAt', models.DateTimeField(db_column='created_at')),
                ('updatedAt', models.DateTimeField(db_column='updated_at')),
                ('updatedBy', models.CharField(db_column='updated_by', max_length=255, null=True)),
            ],
            options={
                'db_table': 'wow_bus_topic_consumer',
                'default_permissions': (),
                'constraints': [models.UniqueConstraint(fields=('topic', 'consumerId'), name='wow_bus_topic_consumer_uniq')],
            },
        ),
        migrations.RunPython(create_listing_indexes, drop_listing_indexes),
    ]

# The events' search keys (``searchKeys``: name=value texts from the envelope's ``keys`` and the payload
# fields of WOW['BUS_SEARCH_FIELDS']), one row each, so that the listing finds an event by an order id or by
# the aggregate it comes from. A new, empty table: events stored before it have no search keys (they are
# still found by id, trace, topic, status, initiator and time).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('wow_bus', '0004_initiator_columns'),
    ]

    operations = [
        migrations.CreateModel(
            name='EventKeyRecord',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('eventId', models.CharField(db_column='event_id', max_length=255)),
                ('key', models.CharField(db_column='search_key', max_length=300)),
                ('occurredAt', models.DateTimeField(db_column='occurred_at', null=True)),
            ],
            options={
                'db_table': 'wow_bus_event_key',
                'default_permissions': (),
                'indexes': [models.Index(fields=['key', '-occurredAt', 'eventId'], name='wow_bus_event_key_listing'), models.Index(fields=['eventId'], name='wow_bus_event_key_event')],
                'constraints': [models.UniqueConstraint(fields=('key', 'eventId'), name='wow_bus_event_key_uniq')],
            },
        ),
    ]

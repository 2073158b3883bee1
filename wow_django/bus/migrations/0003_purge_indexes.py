# Indexes of the bus purge (EventBus.purge): events by expireAt, inbox entries by eventId.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('wow_bus', '0002_django_bus_store'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='eventrecord',
            index=models.Index(fields=['expireAt'], name='wow_bus_event_expire_at'),
        ),
        migrations.AddIndex(
            model_name='inboxentry',
            index=models.Index(fields=['eventId'], name='wow_bus_inbox_event'),
        ),
    ]

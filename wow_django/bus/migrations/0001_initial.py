# The bus's permissions holder; it has no table (managed=False).

from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='BusEvent',
            fields=[
                ('id', models.AutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'verbose_name': 'bus event',
                'verbose_name_plural': 'bus events',
                'permissions': [('send_event', 'Can send bus events over HTTP'), ('repush_event', 'Can re-push bus events'), ('manage_topic_consumers', 'Can configure topic consumers')],
                'managed': False,
                'default_permissions': ('view',),
            },
        ),
    ]

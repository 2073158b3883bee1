"""The bus app's models: a placeholder for its permissions, and the tables of the django bus store.

``BusEvent`` has no table: it gives the bus real Django permissions,
``wow_bus.view_busevent`` (read events and traces), ``wow_bus.send_event``,
``wow_bus.repush_event`` and ``wow_bus.manage_topic_consumers``. The bus
records live in the bus store: MongoDB, or the tables of the models imported
below (defined with the django backend) when ``WOW['BUS_STORE']`` is ``"django"``.
"""

from django.db import models

from wow_django.backends.django.bus_models import (  # noqa: F401 - Django finds the models of an app here
    ConsumptionRecord,
    EventRecord,
    InboxEntry,
    RepushRecord,
    SequenceRecord,
    TopicConsumerRecord,
)


class BusEvent(models.Model):
    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = [
            ("send_event", "Can send bus events over HTTP"),
            ("repush_event", "Can re-push bus events"),
            ("manage_topic_consumers", "Can configure topic consumers"),
        ]
        verbose_name = "bus event"
        verbose_name_plural = "bus events"

    def __str__(self) -> str:
        return f"bus event {self.pk}"

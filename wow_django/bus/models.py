"""A placeholder model without a table: it gives the bus real Django permissions.

``wow_bus.view_busevent`` (read events and traces), ``wow_bus.send_event``,
``wow_bus.repush_event`` and ``wow_bus.manage_topic_consumers``. Bus data lives
in MongoDB, never in this model.
"""

from django.db import models


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

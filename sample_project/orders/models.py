"""What the sample's downstream services keep: rows in the project's database.

In production ``member-service`` and ``message-service`` would be services of
their own with their own databases; the sample keeps their effects in its
Django database so that every process of a deployment (web workers, the
``wow_consume`` consumers, a shell) sees the same points and notices.

A row's primary key is the consumer's idempotency key: a redelivered event
inserts nothing the second time (see :mod:`sample_project.orders.integration`).
"""

from __future__ import annotations

from django.db import models


class PointsEntry(models.Model):
    """``member-service``: points added for one ``order.purchased``."""

    key = models.CharField(primary_key=True, max_length=255, help_text="the consumer's idempotency key")
    member_id = models.CharField(max_length=255, db_index=True)
    points = models.IntegerField()
    order_id = models.CharField(max_length=255)
    source_event_id = models.CharField(max_length=255)
    at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "points entries"

    def __str__(self) -> str:
        return f"{self.member_id}: +{self.points} ({self.order_id})"


class Notice(models.Model):
    """``message-service``: one notice sent to a user."""

    key = models.CharField(primary_key=True, max_length=255, help_text="the consumer's idempotency key")
    user_id = models.CharField(max_length=255, db_index=True)
    channel = models.CharField(max_length=64)
    template_id = models.CharField(max_length=64)
    text = models.TextField()
    source_event_id = models.CharField(max_length=255)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.template_id} → {self.user_id}"


class Member(models.Model):
    """``member-service``: when a member was last notified."""

    user_id = models.CharField(primary_key=True, max_length=255)
    last_notified_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.user_id

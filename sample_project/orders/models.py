"""What the sample's downstream services keep: rows in the project's database.

In production ``member-service`` and ``message-service`` would be services of
their own with their own databases; the sample keeps their effects in its
Django database so that every process of a deployment (web workers, the
``wow_consume`` consumers, a shell) sees the same points and notices.

A row's primary key is the consumer's idempotency key: a redelivered event
inserts nothing the second time (see :mod:`sample_project.orders.integration`).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from wow_django.application.gateway import ID_RULE, is_valid_id


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


class OrderSummary(models.Model):
    """The order service's own read model: one row per order, kept by the ``order-summaries`` projection.

    ``version`` and ``sequence`` name the last event applied (its stream's version, its place in the
    stream): an event handed again (followers deliver at least once) or replayed after a rewind
    changes nothing, so the projection is idempotent.
    """

    order_id = models.CharField(primary_key=True, max_length=255)
    tenant_id = models.CharField(max_length=255)
    customer_id = models.CharField(max_length=255, db_index=True)
    status = models.CharField(max_length=32)
    total_amount = models.DecimalField(max_digits=14, decimal_places=2)
    paid_amount = models.DecimalField(max_digits=14, decimal_places=2, default=0)
    currency = models.CharField(max_length=3)
    version = models.IntegerField()
    sequence = models.IntegerField(default=1)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "order summaries"

    def __str__(self) -> str:
        return f"{self.order_id}: {self.status}"


def validate_tenant_id(value: str) -> None:
    if not is_valid_id(value):
        raise ValidationError(f"A tenant id is {ID_RULE}.")


class TenantMembership(models.Model):
    """Which tenant a user acts for through the API when the sample is deployed (``DEBUG`` off): read by
    :class:`sample_project.orders.tenancy.MembershipTenantResolver`. A user without one is refused (403).
    Kept in the admin (Orders → Tenant memberships) or a shell."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_membership")
    tenant_id = models.CharField(
        max_length=128, db_index=True,
        validators=[validate_tenant_id],
        help_text="the tenant this user's requests act for (a wow_django id)")

    def __str__(self) -> str:
        return f"{self.user} → {self.tenant_id}"

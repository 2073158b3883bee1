"""The sample's tenant resolver when deployed (``DEBUG`` off): the tenant of the signed-in user's membership."""

from __future__ import annotations

from wow_django.http.tenancy import UserTenantResolver


class MembershipTenantResolver(UserTenantResolver):
    """``request.user.tenant_membership.tenant_id`` (:class:`~sample_project.orders.models.TenantMembership`):
    anonymous requests are refused (401), users without a membership too (403), and a ``Command-Tenant-Id``
    header naming another tenant (403)."""

    attribute = "tenant_membership.tenant_id"

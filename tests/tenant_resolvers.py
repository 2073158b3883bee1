"""Tenant resolvers the tests name by their dotted path (``WOW["TENANT_RESOLVER"]``)."""

from rest_framework.exceptions import PermissionDenied

from wow_django.http.tenancy import HeaderTenantResolver


class OnlyAcme(HeaderTenantResolver):
    """The header resolver with a check of its own: only the acme tenant."""

    def resolve(self, request) -> str:
        tenant = super().resolve(request)
        if tenant != "acme":
            raise PermissionDenied("acme only")
        return tenant

"""Which tenant a request acts for: pluggable resolvers named by ``WOW["TENANT_RESOLVER"]``.

The API asks the resolver once per request and enforces the answer on the
server: commands go to the gateway with it (an aggregate of another tenant
is "not found"), queries are ANDed with it, reads by id check it. Nothing in
a request body can widen it.

* :class:`HeaderTenantResolver` (the default) takes the ``Command-Tenant-Id``
  header, or the default tenant ``(0)`` without one (an empty header is refused:
  a tenant id is an id, :data:`~wow_django.application.gateway.ID_RULE`). The client chooses, so
  use it behind a gateway that sets the header, or for a single tenant.
A path may name the tenant too (``tenant/{tenantId}/…``, Wow's attribution prefix): the header resolver
takes it (a header naming another is a 400), any other resolver must find the same tenant (403 otherwise).

* :class:`UserTenantResolver` takes the tenant from the authenticated user
  (``request.user.tenant_id`` by default; set ``attribute`` to a dotted path
  such as ``"profile.tenant_id"`` in a subclass). Anonymous requests get a
  401/403, users without a tenant a 403, and a ``Command-Tenant-Id`` header naming
  another tenant a 403.

A custom resolver subclasses :class:`TenantResolver` and implements
``resolve(request) -> str``; ``schema_parameters()`` documents the headers it
reads in the OpenAPI schema.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from rest_framework.exceptions import NotAuthenticated, PermissionDenied

from wow_django.application.gateway import ID_RULE, MAX_ID_LENGTH, is_valid_id
from wow_django.http.errors import InvalidRequest
from wow_django.persistence.records import DEFAULT_TENANT_ID

TENANT_HEADER = "Command-Tenant-Id"
MAX_TENANT_ID_LENGTH = MAX_ID_LENGTH
TENANT_RULE = f"a tenant id is {ID_RULE}"


def check_tenant_id(value, name: str) -> str:
    """``value`` if it is a usable tenant id (the id rule), else InvalidRequest (400) naming ``name``."""
    if not is_valid_id(value):
        raise InvalidRequest(name, TENANT_RULE)
    return value


class TenantResolver(ABC):
    """Base class: ``resolve(request)`` returns the tenant id the request acts for."""

    @abstractmethod
    def resolve(self, request) -> str:
        """The tenant id of ``request``; raise ``InvalidRequest`` (400) or ``PermissionDenied`` (403) to refuse."""

    def schema_parameters(self) -> list[dict]:
        """OpenAPI parameter objects for the inputs this resolver reads (headers)."""
        return []

    def resolve_for_path(self, request, claimed: str) -> str:
        """The tenant of a request whose path names one (``tenant/{tenantId}/…``, Wow's attribution prefix):
        the tenant :meth:`resolve` gives, which the path must name (403 otherwise: a prefix never reaches
        another tenant)."""
        tenant = self.resolve(request)
        if claimed != tenant:
            raise PermissionDenied("The path names a tenant other than your own.")
        return tenant


class HeaderTenantResolver(TenantResolver):
    """The ``Command-Tenant-Id`` header, or ``default`` when it is absent."""

    header = TENANT_HEADER
    default = DEFAULT_TENANT_ID

    def resolve(self, request) -> str:
        value = request.headers.get(self.header)
        if value is None:
            return self.default
        return check_tenant_id(value, self.header)

    def resolve_for_path(self, request, claimed: str) -> str:
        """The path's tenant (the client names it, as with the header); a header naming another is refused. A
        subclass with its own ``resolve`` (a check of its own) is held to it: the path must name its tenant."""
        if type(self).resolve is not HeaderTenantResolver.resolve:
            return super().resolve_for_path(request, claimed)
        value = request.headers.get(self.header)
        if value is not None and value != claimed:
            raise InvalidRequest(self.header, "names another tenant than the path (tenant/{tenantId}/…)")
        return claimed

    def schema_parameters(self) -> list[dict]:
        return [{
            "name": self.header,
            "in": "header",
            "required": False,
            "description": f"The tenant to act for (default {self.default!r}). Commands and queries never "
            "reach another tenant's aggregates.",
            # The id rule: the OpenAPI schema's shared component WowId (its pattern is id_pattern()).
            "schema": {"$ref": "#/components/schemas/WowId"},
        }]


class UserTenantResolver(TenantResolver):
    """The authenticated user's tenant: the value at ``attribute`` (a dotted path) on ``request.user``."""

    attribute = "tenant_id"
    header = TENANT_HEADER

    def get_user_tenant(self, user) -> object:
        value = user
        for name in self.attribute.split("."):
            value = getattr(value, name, None)
            if value is None:
                return None
        return value() if callable(value) else value

    def resolve(self, request) -> str:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            raise NotAuthenticated("Sign in: the tenant is taken from the signed-in user.")
        tenant = self.get_user_tenant(user)
        if tenant is None or tenant == "":
            raise PermissionDenied("Your account belongs to no tenant.")
        tenant = check_tenant_id(str(tenant), f"user.{self.attribute}")
        claimed = request.headers.get(self.header)
        if claimed and claimed != tenant:
            raise PermissionDenied(f"{self.header} names a tenant other than your own.")
        return tenant

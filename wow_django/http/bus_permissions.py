"""Who may do what through the bus endpoints: real Django permissions (``wow_bus.*``).

Superusers have them all; grant them to staff through groups. ``is_staff``
alone is not enough: reading, sending, re-pushing and configuring are
separate rights.
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from wow_django.http.bus_authentication import ConsumerPrincipal

VIEW = "wow_bus.view_busevent"
SEND = "wow_bus.send_event"
REPUSH = "wow_bus.repush_event"
MANAGE_CONSUMERS = "wow_bus.manage_topic_consumers"


class _HasPerm(BasePermission):
    perm = ""

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(self.perm))


class CanViewBus(_HasPerm):
    message = f"Reading bus events needs the {VIEW!r} permission."
    perm = VIEW


class CanSendEvents(_HasPerm):
    message = f"Sending bus events needs the {SEND!r} permission."
    perm = SEND


class CanRepush(_HasPerm):
    message = f"Re-pushing bus events needs the {REPUSH!r} permission."
    perm = REPUSH


class CanManageConsumers(_HasPerm):
    message = f"Configuring topic consumers needs the {MANAGE_CONSUMERS!r} permission."
    perm = MANAGE_CONSUMERS


class IsConsumer(BasePermission):
    message = "This endpoint is for consumers authenticated by their callback token."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, ConsumerPrincipal)

"""Permission classes that know the Wow routes (``view.action``)."""

from __future__ import annotations

from rest_framework.permissions import BasePermission

COMMAND_ACTIONS = frozenset({"command", "delete", "recover"})


class IsAuthenticatedForCommands(BasePermission):
    """Anyone may read (state, snapshots, events, queries); only authenticated users send commands.

    DRF's ``IsAuthenticatedOrReadOnly`` cannot say this: queries are POSTs.
    """

    message = "Sign in to send commands."

    def has_permission(self, request, view) -> bool:
        if getattr(view, "action", "") not in COMMAND_ACTIONS:
            return True
        user = getattr(request, "user", None)
        return bool(user and user.is_authenticated)

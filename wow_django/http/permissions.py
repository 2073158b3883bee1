"""Permission classes that know the Wow routes (``view.action``).

* :class:`IsAuthenticatedForCommands`: anyone reads, signed-in users send commands.
* :class:`IsOwnerOrPermitted`: the owner policy — a command on an aggregate that another user owns is
  refused unless the user has :data:`ACT_FOR_ANY_OWNER`.

Both go in ``WOW["API_PERMISSION_CLASSES"]`` (or an aggregate's ``api_permission_classes``) beside
the tenant resolver (:mod:`wow_django.http.tenancy`): the tenant bounds what a request can reach at
all, the owner policy who may change an aggregate within the tenant.
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from wow_django.application.gateway import is_valid_id

COMMAND_ACTIONS = frozenset({"command", "delete", "recover"})

#: The Django permission that lets a user send commands to aggregates that other users own (superusers have it).
ACT_FOR_ANY_OWNER = "wow_django.act_for_any_owner"


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


class IsOwnerOrPermitted(BasePermission):
    """Commands (and delete, recover) on an existing aggregate come from its owner only.

    The owner of an aggregate is the operator of the command that created it (``ownerId``: the user's
    primary key, ``view.get_owner_id()``); it never changes. A command on an aggregate with an owner is
    refused (403) when the request's operator (``view.get_operator()``) is someone else, unless the user
    has ``permission`` (:data:`ACT_FOR_ANY_OWNER` by default; superusers have every permission): staff who
    act for customers, for instance. Creates pass (the new aggregate is the operator's), so do aggregates
    created without an owner (by anonymous requests or the Python API), and ids this tenant does not have
    (the command answers 404: nothing about another tenant's aggregates shows through a 403).

    Reads are not restricted by owner: every user of a tenant reads its aggregates (use a query scope,
    ``QueryView.get_scope()``, to narrow them). It adds one read of the aggregate's last event stream per
    command on an existing aggregate. The Python API (``CommandGateway``) is trusted code and does not
    apply it.
    """

    permission = ACT_FOR_ANY_OWNER

    def has_permission(self, request, view) -> bool:
        if getattr(view, "action", "") not in COMMAND_ACTIONS:
            return True
        aggregate_id = view.kwargs.get("id")
        if aggregate_id is None or not is_valid_id(aggregate_id):
            return True  # a create; a malformed id is the view's 400, which names it
        owner = view.get_aggregate_owner(aggregate_id)
        if not owner or owner == view.get_operator():
            return True
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and user.has_perm(self.permission):
            return True
        self.message = (f"{view.aggregate.aggregate_name} {aggregate_id!r} belongs to another user: only its "
                        f"owner sends it commands, or a user with the {self.permission!r} permission.")
        return False

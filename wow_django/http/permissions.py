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
from wow_django.exceptions import NotAggregateOwner

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

    The owner of an aggregate is set by the command that created it (``view.get_owner_id()``: the user's
    primary key by default) and never changes. A command on an aggregate owned by someone else is refused
    (403 ``IllegalAccessOwnerAggregate``, Wow's code; nothing appended) unless the user has ``permission``
    (:data:`ACT_FOR_ANY_OWNER` by default; superusers have every permission): staff who act for customers,
    for instance. Creates pass (the new aggregate is its sender's), so do aggregates created without an
    owner (anonymously or from the Python API), and ids this tenant does not have (the command answers
    404: nothing about another tenant's aggregates shows through a 403).

    Checked twice: here, with one read of the aggregate's last event stream, for a quick 403; and by the
    gateway when the command runs (``owner_only``, under the aggregate's lock), so a command queued with
    wait stage ``SENT``, or one racing the aggregate's creation, is held to the same rule.

    Reads are not restricted by owner: every user of a tenant reads its aggregates (use a query scope,
    ``QueryView.get_scope()``, to narrow them). The Python API (``CommandGateway``) is trusted code: it
    applies the rule only when asked (``owner_only=True``).
    """

    permission = ACT_FOR_ANY_OWNER

    def has_permission(self, request, view) -> bool:
        if getattr(view, "action", "") not in COMMAND_ACTIONS:
            return True
        find_owner = getattr(view, "get_aggregate_owner", None)
        if find_owner is None:  # a command route this policy cannot read owners through: closed
            self.message = f"{type(view).__name__} cannot tell an aggregate's owner: refused by the owner policy."
            return False
        aggregate_id = view.kwargs.get("id")
        if aggregate_id is None or not is_valid_id(aggregate_id):
            return True  # a create (the new aggregate is its sender's); a malformed id is the view's 400
        owner = find_owner(aggregate_id)
        if owner is not None and owner in ("", view.get_owner_id()):
            view.owner_only = True  # the gateway checks again when the command runs
            return True
        if self.may_act_for_any_owner(request):
            return True
        if owner is None:  # not in this tenant (yet): the gateway applies the rule when the command runs
            view.owner_only = True
            return True
        # Wow's IllegalAccessOwnerAggregate (403), as the gateway answers when the command runs.
        raise NotAggregateOwner(f"{view.aggregate.aggregate_name} {aggregate_id!r} belongs to another user: only "
                                f"its owner sends it commands, or a user with the {self.permission!r} permission.")

    def may_act_for_any_owner(self, request) -> bool:
        """Whether the request's user may send commands to other users' aggregates (``permission``)."""
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_authenticated and user.has_perm(self.permission))

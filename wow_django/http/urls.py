"""The API's URLconf: routes for every registered aggregate, then a JSON 404 for the rest.

Mount it once::

    urlpatterns = [
        path("api/schema/", SpectacularAPIView.as_view(), name="schema"),  # your own api/ routes first
        path("api/", include("wow_django.http.urls")),
    ]

Its last route answers every other path below its prefix with a JSON 404
(unknown aggregate, unknown command, no such route), so put your own routes
that share the prefix before the include.

Per aggregate ``a`` (reverse names in the ``wow`` namespace, e.g. ``wow:order-snapshot-paged``):

=========  ===============================  ==========================
method     path                             name
=========  ===============================  ==========================
POST       a/snapshot/{single|list|paged|count}  a-snapshot-<operation>
POST       a/event/{list|paged|count}       a-event-<operation>
POST       a/<create command>               a-<command>
DELETE     a/<id>                           a-delete
PUT        a/<id>/recover                   a-recover
GET        a/<id>/state                     a-state
GET        a/<id>/snapshot                  a-snapshot
GET        a/<id>/event/<head>/<tail>       a-event-range
GET        a/request/<requestId>/status     a-request-status
POST       a/<id>/<command>                 a-<command>
GET        a/<id>/state/<version>           a-state-version
GET        a/<id>/state/time/<createTime>   a-state-time
POST       a/snapshot/{single|list|paged}/state  a-snapshot-<operation>-state
=========  ===============================  ==========================

Every route also answers below Wow's attribution prefixes ``tenant/<tenantId>/``, ``owner/<ownerId>/`` and
``tenant/<tenantId>/owner/<ownerId>/`` (namespaces ``wow:tenant``, ``wow:owner``, ``wow:tenant-owner``), and
with ``WOW["CONTEXT_ALIAS"]`` all of them again below ``<alias>/`` (``wow:alias``, ``wow:alias:tenant``…).

DELETE and recover exist when the aggregate allows deletion. A command may
not be named ``snapshot``, ``event``, ``state`` or ``recover`` (its route
would be ambiguous). An aggregate id equal to a create command's name cannot
be deleted over HTTP (``a/<command>`` is that command's route).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import EllipsisType

from django.core.exceptions import ImproperlyConfigured
from django.urls import include, path, re_path

from wow_django.domain.aggregate import Aggregate, aggregates
from wow_django.http import views
from wow_django.http.contract import MOUNTED_ALIASES
from wow_django.persistence.query import EVENT_STREAM, SNAPSHOT

app_name = "wow"

RESERVED = frozenset({"snapshot", "event", "state", "recover"})


@dataclass(frozen=True)
class ViewClasses:
    """The view class of each kind of route (subclass the views and pass your own)."""

    command: type[views.CommandView] = views.CommandView
    delete: type[views.DeleteAggregateView] = views.DeleteAggregateView
    recover: type[views.RecoverAggregateView] = views.RecoverAggregateView
    state: type[views.StateView] = views.StateView
    snapshot: type[views.SnapshotView] = views.SnapshotView
    status: type[views.CommandStatusView] = views.CommandStatusView
    event_range: type[views.EventRangeView] = views.EventRangeView
    query: type[views.QueryView] = views.QueryView
    not_found: type[views.NotFoundView] = views.NotFoundView


def aggregate_urlpatterns(cls: type[Aggregate], view_classes: ViewClasses | None = None) -> list:
    """The routes of one aggregate type (see the module table)."""
    view_classes = view_classes or ViewClasses()
    name = cls.aggregate_name
    for command_name, handler in cls.handlers.items():
        if command_name in RESERVED:
            raise ImproperlyConfigured(
                f"Command {command_name!r} of aggregate {name!r} ({handler.command.__module__}."
                f"{handler.command.__qualname__}) cannot be routed: {', '.join(sorted(RESERVED))} are API path "
                "segments. Give the command another name."
            )
    patterns = []
    for kind, segment in ((SNAPSHOT, "snapshot"), (EVENT_STREAM, "event")):
        for operation in view_classes.query.OPERATIONS[kind]:
            view = view_classes.query.as_view(aggregate=cls, kind=kind, operation=operation)
            patterns.append(path(f"{name}/{segment}/{operation}", view, name=f"{name}-{segment}-{operation}"))
    for operation in view_classes.query.STATE_OPERATIONS:
        view = view_classes.query.as_view(aggregate=cls, kind=SNAPSHOT, operation=operation, states=True)
        patterns.append(path(f"{name}/snapshot/{operation}/state", view, name=f"{name}-snapshot-{operation}-state"))
    creates = sorted(c for c, h in cls.handlers.items() if h.create)
    others = sorted(c for c, h in cls.handlers.items() if not h.create)
    for command_name in creates:
        view = view_classes.command.as_view(aggregate=cls, command=cls.handlers[command_name].command)
        patterns.append(path(f"{name}/{command_name}", view, name=f"{name}-{command_name}"))
    if cls.allow_delete:
        patterns.append(path(f"{name}/<str:id>", view_classes.delete.as_view(aggregate=cls), name=f"{name}-delete"))
        patterns.append(path(f"{name}/<str:id>/recover", view_classes.recover.as_view(aggregate=cls),
                             name=f"{name}-recover"))
    patterns.append(path(f"{name}/<str:id>/state", view_classes.state.as_view(aggregate=cls), name=f"{name}-state"))
    patterns.append(path(f"{name}/<str:id>/state/<int:version>", view_classes.state.as_view(aggregate=cls),
                         name=f"{name}-state-version"))
    patterns.append(path(f"{name}/<str:id>/state/time/<int:create_time>", view_classes.state.as_view(aggregate=cls),
                         name=f"{name}-state-time"))
    patterns.append(path(f"{name}/<str:id>/snapshot", view_classes.snapshot.as_view(aggregate=cls),
                         name=f"{name}-snapshot"))
    patterns.append(path(f"{name}/request/<str:request_id>/status", view_classes.status.as_view(aggregate=cls),
                         name=f"{name}-request-status"))
    patterns.append(path(f"{name}/<str:id>/event/<int:head>/<int:tail>",
                         view_classes.event_range.as_view(aggregate=cls), name=f"{name}-event-range"))
    for command_name in others:
        view = view_classes.command.as_view(aggregate=cls, command=cls.handlers[command_name].command)
        patterns.append(path(f"{name}/<str:id>/{command_name}", view, name=f"{name}-{command_name}"))
    return patterns


#: Wow's attribution prefixes, each its own namespace below ``wow`` (e.g. ``wow:tenant:order-state``).
ATTRIBUTION_PREFIXES = (
    ("tenant/<str:tenant_id>/", "tenant"),
    ("owner/<str:owner_id>/", "owner"),
    ("tenant/<str:tenant_id>/owner/<str:owner_id>/", "tenant-owner"),
)


def build_urlpatterns(view_classes: ViewClasses | None = None, *,
                      context_alias: str | None | EllipsisType = ...) -> list:
    """Routes for every registered aggregate — as they are, below Wow's attribution prefixes
    (``tenant/{tenantId}/``, ``owner/{ownerId}/``, both) and, with a context alias (``WOW["CONTEXT_ALIAS"]``
    unless given), all of those again below ``{alias}/`` — then the JSON 404 for any other path."""
    view_classes = view_classes or ViewClasses()
    if isinstance(context_alias, EllipsisType):  # not given
        from wow_django.conf import wow_settings

        setting: str | None = wow_settings.CONTEXT_ALIAS
        context_alias = setting
    routes = []
    for name, cls in sorted(aggregates().items()):
        if name in ("tenant", "owner") or name == context_alias:
            raise ImproperlyConfigured(
                f"Aggregate {name!r} cannot be routed: 'tenant', 'owner' and the context alias "
                f"({context_alias!r}) start Wow's attribution prefixes. Give the aggregate another name"
                + (" or WOW['CONTEXT_ALIAS'] another alias." if name == context_alias else "."))
        routes.extend(aggregate_urlpatterns(cls, view_classes))
    attributed = [*routes, *(path(prefix, include((routes, namespace))) for prefix, namespace in ATTRIBUTION_PREFIXES)]
    patterns = list(attributed)
    if context_alias:
        MOUNTED_ALIASES.add(context_alias)
        patterns.append(path(f"{context_alias}/", include((attributed, "alias"))))
    # Any character, line breaks included ("." would not match a %0A in an id, and Django's HTML 404 would answer).
    patterns.append(re_path(r"^(?P<path>[\s\S]*)\Z", view_classes.not_found.as_view(), name="not-found"))
    return patterns


urlpatterns = build_urlpatterns()

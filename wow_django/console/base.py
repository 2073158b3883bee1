"""What every console view shares: the permission check, the page context and the audit trail."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from wow_django.console.models import PERMISSIONS, ConsoleAudit
from wow_django.exceptions import RecoverableStoreError, TransportUnavailable

APP = "wow_django"


def allowed(user, codename: str) -> bool:
    """Whether ``user`` holds the console permission ``codename`` (``wow_django.<codename>``)."""
    return user.is_active and user.has_perm(f"{APP}.{codename}")


def console_perms(user) -> dict[str, bool]:
    """``{codename: held}`` for every console permission (what the templates show or hide)."""
    return {codename: allowed(user, codename) for codename in PERMISSIONS}


def requires(*codenames: str) -> Callable:
    """A view decorator: 403 unless the user holds every one of ``codenames`` (none: any console permission);
    a store or broker that does not answer is a 503 page saying so, not a server error."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def checked(request, *args, **kwargs):
            held = console_perms(request.user)
            if codenames and not all(held[c] for c in codenames) or not codenames and not any(held.values()):
                raise PermissionDenied
            try:
                return view(request, *args, **kwargs)
            except (RecoverableStoreError, TransportUnavailable) as exc:
                response = page(request, "unavailable.html", "Not available right now", error=str(exc))
                response.status_code = 503
                return response

        return checked

    return decorate


def page(request, template: str, title: str, **context: Any) -> TemplateResponse:
    """A console page: the admin's context (header, user links), the user's console permissions, ``context``."""
    return TemplateResponse(request, f"wow_django/console/{template}", {
        **admin.site.each_context(request), "title": title, "perms_console": console_perms(request.user),
        **context})


def audit(request, action: str, target: str, **detail: Any) -> ConsoleAudit:
    """Record one console action of the request's user."""
    user = request.user
    return ConsoleAudit.objects.create(user_pk=str(user.pk), username=user.get_username(), action=action,
                                       target=target[:500], detail=json.loads(json.dumps(detail, default=str)))


def pretty(value: Any) -> str:
    """A value as indented JSON for a <pre> block (times as ISO text)."""
    def default(item: Any) -> str:
        return item.isoformat() if isinstance(item, datetime) else str(item)

    return json.dumps(value, indent=2, sort_keys=True, default=default, ensure_ascii=False)

"""What every console view shares: the permission check, the page context and the audit trail."""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils import timezone

from wow_django.bus.envelope import parse_time
from wow_django.console.models import PERMISSIONS, ConsoleAudit
from wow_django.domain.values import decimal_text
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
    """A value as indented JSON for a <pre> block: decimals as numbers with their exact digits (never
    ``Decimal('12.50')``), times as ISO text, anything else as its text."""
    token = uuid.uuid4().hex  # marks where a decimal's digits go; no value holds it

    def default(item: Any) -> str:
        if isinstance(item, Decimal) and item.is_finite():
            return f"{token}{decimal_text(item)}{token}"
        return item.isoformat() if isinstance(item, datetime) else str(item)

    text = json.dumps(value, indent=2, sort_keys=True, default=default, ensure_ascii=False)
    return re.sub(f'"{token}([^"]*){token}"', r"\1", text)


#: Epoch milliseconds this far from 1970 and beyond are taken as such (≈ 2001-09-09 up to 5138); smaller
#: numbers are not times.
MIN_EPOCH_MS = 1_000_000_000_000
MAX_EPOCH_MS = 100_000_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def moment(value: Any, *, naive_is_local: bool = False) -> dict | None:
    """``{"text", "iso", "ms"}`` of a time (epoch milliseconds, a datetime, or ISO text): ``text`` in the
    current time zone with its name (``2024-01-01 18:00:00.000 CST``), ``iso`` in UTC, ``ms`` since the
    epoch; None for anything else, and for a time the current zone cannot show (past the years 1 to 9999).

    A naive datetime is UTC (what the stores keep), or with ``naive_is_local`` — a Django model's field
    under ``USE_TZ = False`` — in the default time zone.
    """
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            if not MIN_EPOCH_MS <= value < MAX_EPOCH_MS:
                return None
            at = EPOCH + timedelta(milliseconds=value)
        elif isinstance(value, datetime):
            if value.tzinfo is not None:
                at = value
            elif naive_is_local:
                at = timezone.make_aware(value, timezone.get_default_timezone())
            else:
                at = value.replace(tzinfo=UTC)
        elif isinstance(value, str) and value:
            at = parse_time(value).replace(tzinfo=UTC)
        else:
            return None
        utc = at.astimezone(UTC)
        local = timezone.localtime(utc)
    except (ValueError, OverflowError):
        return None
    millis = utc.microsecond // 1000
    zone = local.tzname() or local.strftime("%z")
    return {"text": f"{local.year:04d}-{local:%m-%d %H:%M:%S}.{millis:03d} {zone}",
            "iso": f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S}.{millis:03d}Z",
            "ms": (utc - EPOCH) // timedelta(milliseconds=1)}

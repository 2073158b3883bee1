"""The console's index and its audit trail."""

from __future__ import annotations

from django.core.paginator import Paginator

from wow_django.console.base import page, requires
from wow_django.console.models import ConsoleAudit

AUDIT_PAGE_SIZE = 50


@requires()
def index(request):
    """The sections the user may open, and the latest audit entries when allowed."""
    recent = list(ConsoleAudit.objects.all()[:10]) if request.user.has_perm("wow_django.view_console_audit") else []
    return page(request, "index.html", "Wow console", recent=recent)


@requires("view_console_audit")
def audit_log(request):
    """Every console action, newest first; filters: action, user, target (contains)."""
    entries = ConsoleAudit.objects.all()
    filters = {key: request.GET.get(key, "").strip() for key in ("action", "user", "target")}
    if filters["action"]:
        entries = entries.filter(action=filters["action"])
    if filters["user"]:
        entries = entries.filter(username=filters["user"])
    if filters["target"]:
        entries = entries.filter(target__contains=filters["target"])
    # A page number that is not one (or past the end) gives the nearest page, never an error.
    paged = Paginator(entries, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    actions = ConsoleAudit.objects.order_by("action").values_list("action", flat=True).distinct()
    return page(request, "audit.html", "Console audit", entries=paged, filters=filters, actions=list(actions))

"""The console's entry in the admin index (discovered by ``django.contrib.admin``).

The placeholder model :class:`~wow_django.console.models.Console` shows up for
staff holding any console permission; its "change list" is the console's index.
"""

from django.contrib import admin
from django.shortcuts import redirect
from django.urls import path

from wow_django.console.base import console_perms
from wow_django.console.models import Console


@admin.register(Console)
class ConsoleAdmin(admin.ModelAdmin):
    def has_module_permission(self, request) -> bool:
        return any(console_perms(request.user).values())

    def has_view_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        return redirect("wow_console:index")

    def get_urls(self):
        # Only the index entry: the placeholder has no rows to add, change or delete (nor a table).
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

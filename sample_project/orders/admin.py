"""The sample's own rows in Django's admin: which tenant each user acts for."""

from django.contrib import admin

from sample_project.orders.models import TenantMembership


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant_id")
    list_filter = ("tenant_id",)
    search_fields = ("user__username", "tenant_id")
    autocomplete_fields = ("user",)

"""The operators' console in Django admin (DESIGN part I): custom admin views over the contracts.

Mount it before the admin's own URLs, under ``admin/wow/``::

    urlpatterns = [
        path("admin/wow/", include("wow_django.console.urls")),
        path("admin/", admin.site.urls),
    ]

Every view is wrapped in ``admin.site.admin_view`` (staff login) and checks a
real permission of :class:`~wow_django.console.models.Console`; every action
is a confirmation page on GET and a CSRF-protected POST, recorded in
:class:`~wow_django.console.models.ConsoleAudit`.
"""

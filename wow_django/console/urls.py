"""The console's URLs; include them under ``admin/wow/`` before ``admin.site.urls``.

Every view is wrapped in ``admin.site.admin_view``: a staff login, no caching, CSRF.
"""

from django.contrib import admin
from django.urls import path

from wow_django.console import bus_views, views

app_name = "wow_console"


def _admin(view):
    return admin.site.admin_view(view)


urlpatterns = [
    path("", _admin(views.index), name="index"),
    path("audit/", _admin(views.audit_log), name="audit"),
    path("events/", _admin(bus_views.event_list), name="events"),
    path("events/<str:event_id>/", _admin(bus_views.event_detail), name="event"),
    path("events/<str:event_id>/repush/", _admin(bus_views.event_repush), name="event_repush"),
]

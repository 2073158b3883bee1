"""The console's URLs; include them under ``admin/wow/`` before ``admin.site.urls``.

Every view is wrapped in ``admin.site.admin_view``: a staff login, no caching, CSRF.
"""

from django.contrib import admin
from django.urls import path

from wow_django.console import aggregates, bus_views, insight, operations, views

app_name = "wow_console"


def _admin(view):
    return admin.site.admin_view(view)


urlpatterns = [
    path("", _admin(views.index), name="index"),
    path("audit/", _admin(views.audit_log), name="audit"),
    path("events/", _admin(bus_views.event_list), name="events"),
    path("not-consumed/", _admin(bus_views.not_consumed), name="not_consumed"),
    path("not-consumed/repush/", _admin(bus_views.not_consumed_repush), name="not_consumed_repush"),
    path("consumers/<str:consumer_id>/", _admin(bus_views.consumer_feedback), name="consumer_feedback"),
    path("events/<str:event_id>/", _admin(bus_views.event_detail), name="event"),
    path("events/<str:event_id>/repush/", _admin(bus_views.event_repush), name="event_repush"),
    path("traces/<str:trace_id>/", _admin(insight.trace), name="trace"),
    path("failures/", _admin(insight.failures), name="failures"),
    path("failures/<str:key>/repush/", _admin(insight.failures_repush), name="failures_repush"),
    path("failures/note/", _admin(insight.failure_note), name="failure_note"),
    path("dashboard/", _admin(insight.dashboard), name="dashboard"),
    path("topic-consumers/", _admin(operations.topic_consumers), name="topic_consumers"),
    path("topic-consumers/new/", _admin(operations.topic_consumer_create), name="topic_consumer_create"),
    path("topic-consumers/<str:topic>/<str:consumer_id>/edit/", _admin(operations.topic_consumer_edit),
         name="topic_consumer_edit"),
    path("topic-consumers/<str:topic>/<str:consumer_id>/enable/", _admin(operations.topic_consumer_toggle),
         {"enable": True}, name="topic_consumer_enable"),
    path("topic-consumers/<str:topic>/<str:consumer_id>/disable/", _admin(operations.topic_consumer_toggle),
         {"enable": False}, name="topic_consumer_disable"),
    path("aggregates/", _admin(aggregates.aggregate_list), name="aggregates"),
    path("aggregates/<str:name>/events/", _admin(aggregates.event_streams), name="event_streams"),
    path("aggregates/<str:name>/snapshots/", _admin(aggregates.snapshots), name="snapshots"),
    path("aggregates/<str:name>/id/<path:aggregate_id>", _admin(aggregates.aggregate_detail), name="aggregate"),
    path("followers/", _admin(operations.followers), name="followers"),
    path("followers/<str:name>/pause/", _admin(operations.follower_pause), {"pause": True}, name="follower_pause"),
    path("followers/<str:name>/resume/", _admin(operations.follower_pause), {"pause": False},
         name="follower_resume"),
    path("followers/rewind-to-stream/", _admin(operations.rewind_to_stream), name="rewind_to_stream"),
    path("followers/<str:name>/rewind/", _admin(operations.follower_rewind), name="follower_rewind"),
    path("followers/<str:name>/retry/", _admin(operations.follower_retry), name="follower_retry"),
    path("followers/<str:name>/skip/", _admin(operations.follower_skip), name="follower_skip"),
]

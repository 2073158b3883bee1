"""The bus endpoints; include them in the project's URLconf, e.g. ``path("bus/", include("wow_django.http.bus_urls"))``.

==========================================  ======  ===================================================
``events/``                                 GET     list (status, topic, service, since, until, traceId,
                                                    page, size) — ``wow_bus.view_busevent``
``events/``                                 POST    send an envelope — ``wow_bus.send_event``
``events/<eventId>/``                       GET     detail: feedback per consumer, parent, children
``events/<eventId>/repush/``                POST    re-push (``{"consumerId"}`` optional) —
                                                    ``wow_bus.repush_event``
``traces/<traceId>/``                       GET     time line and parent → child tree
``topic-consumers/``                        GET     configuration; POST to create or update one —
                                                    ``wow_bus.manage_topic_consumers``
``callback/``                               POST    consumer feedback, ``Authorization: Bearer <token>``
==========================================  ======  ===================================================
"""

from django.urls import path

from wow_django.http import bus_views as views

app_name = "wow_bus"

urlpatterns = [
    path("events/", views.EventListView.as_view(), name="events"),
    path("events/<str:event_id>/", views.EventDetailView.as_view(), name="event"),
    path("events/<str:event_id>/repush/", views.RepushView.as_view(), name="repush"),
    path("traces/<str:trace_id>/", views.TraceView.as_view(), name="trace"),
    path("topic-consumers/", views.TopicConsumersView.as_view(), name="topic-consumers"),
    path("callback/", views.CallbackView.as_view(), name="callback"),
]

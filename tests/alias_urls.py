"""The API mounted with a context alias (``WOW["CONTEXT_ALIAS"] = "sample"`` as a project would set it)."""

from django.urls import include, path

from wow_django.http.urls import build_urlpatterns

urlpatterns = [path("api/", include((build_urlpatterns(context_alias="sample"), "wow")))]

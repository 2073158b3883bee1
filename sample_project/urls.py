from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from sample_project.orders.views import home

urlpatterns = [
    path("", home, name="home"),  # links to what follows
    path("admin/wow/", include("wow_django.console.urls")),  # the operators' console, before the admin's own
    path("admin/", admin.site.urls),
    path("bus/", include("wow_django.http.bus_urls")),
    # Before the API include: its last route answers every other api/ path with a JSON 404.
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/", include("wow_django.http.urls")),
]

# What Django refuses before a view runs (e.g. a Host it does not allow) is a JSON 400 on the API's routes.
handler400 = "wow_django.http.handlers.bad_request"

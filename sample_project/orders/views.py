"""The sample's home page: where to go from ``/``."""

from django.conf import settings
from django.shortcuts import render
from django.urls import reverse


def home(request):
    """Links to the API docs, the console, the admin and the API."""
    api = reverse("schema").removesuffix("schema/")  # the API's prefix, wherever the project mounts it
    return render(request, "orders/home.html", {"api": api, "debug": settings.DEBUG})

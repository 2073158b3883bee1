"""Re-export of :mod:`wow_django.ids` for the modeling API."""

from wow_django.ids import generate_id

__all__ = ["generate_id"]

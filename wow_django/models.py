"""The ``wow_django`` app's models: the tables of the django storage backend.

They live in :mod:`wow_django.backends.django.models`; importing them here is
what makes Django see them (``manage.py migrate`` creates them; run it for the
database of ``WOW['DATABASE_ALIAS']``, e.g. ``migrate --database=events``).
"""

from wow_django.backends.django.models import EventStreamRow, PrepareKeyRow, SnapshotRow

__all__ = ["EventStreamRow", "PrepareKeyRow", "SnapshotRow"]

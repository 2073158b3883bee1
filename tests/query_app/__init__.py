"""A test-only Django app: tables shaped like the django backend's snapshot and event-stream tables.

The query services of ``wow_django.backends.django.queries`` read through a
store exposing ``using`` and ``queryset(aggregate_name)``; :class:`TableStore`
is that store over these tables, so the services are tested on SQLite
(``wow_sqlite``) and PostgreSQL (``wow_pg``) without the real stores.
"""

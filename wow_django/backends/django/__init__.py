"""The django backend: every contract on the project's own database through the Django ORM.

``WOW['STORAGE'] = "django"`` (or a per-store setting) selects it;
``WOW['DATABASE_ALIAS']`` names the database (PostgreSQL or SQLite), whose
tables come from the ``wow_django`` app's migrations (``manage.py migrate
--database=<alias>``). Every process of the project shares the data.

The stores are imported when first built, so importing this package (the
runtime does, for its backend table) loads no models.
"""

from __future__ import annotations

from wow_django.conf import wow_settings
from wow_django.persistence.backend import Backend


class DjangoBackend(Backend):
    """Stores and query services on database ``WOW['DATABASE_ALIAS']`` for one runtime."""

    name = "django"

    def __init__(self) -> None:
        self.using = wow_settings.DATABASE_ALIAS

    def event_store(self, *, request_id_index: str):
        from wow_django.backends.django.event_store import DjangoEventStore

        return DjangoEventStore(using=self.using, request_id_index=request_id_index,
                                combine=wow_settings.EVENT_STORE_COMBINE)

    def snapshot_store(self):
        from wow_django.backends.django.snapshot_store import DjangoSnapshotStore

        return DjangoSnapshotStore(using=self.using)

    def prepare_key(self, name: str):
        from wow_django.backends.django.prepare_key import DjangoPrepareKey

        return DjangoPrepareKey(name, using=self.using)

    def bus_store(self):
        from wow_django.backends.django.bus_store import DjangoBusStore

        return DjangoBusStore(using=self.using)

    def snapshot_queries(self, store, aggregate_name: str):
        from wow_django.backends.django.queries import DjangoSnapshotQueryService

        return DjangoSnapshotQueryService(store, aggregate_name, max_time_ms=wow_settings.DATABASE_QUERY_TIMEOUT_MS)

    def event_queries(self, store, aggregate_name: str):
        from wow_django.backends.django.queries import DjangoEventStreamQueryService

        return DjangoEventStreamQueryService(store, aggregate_name,
                                             max_time_ms=wow_settings.DATABASE_QUERY_TIMEOUT_MS)

    def stream_feed(self, store, context_name: str | None = None):
        from wow_django.backends.django.followers import DjangoStreamFeed

        return DjangoStreamFeed(store, context_name or wow_settings.CONTEXT_NAME)

    def follower_store(self):
        from wow_django.backends.django.followers import DjangoFollowerStore

        return DjangoFollowerStore(using=self.using)


__all__ = ["DjangoBackend"]

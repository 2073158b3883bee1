"""The console's bus event list: render time of the first page and of a deep page as the collection grows.

The ``events`` table of the django bus store is filled to each ``--sizes`` count (one topic, times one
millisecond apart), then the console's list view (``admin/wow/events/``, rendered in full with its
template) is timed:

* **first page** — no cursor;
* **deep page** — the page whose cursor is the event ``--depth`` before the oldest (keyset:
  ``BusStore.events_after``);
* **store: keyset** — the deep page's read alone (``events_after`` from the cursor);
* **store: offset (baseline)** — the offset paging of ``GET bus/events/?page=`` at the same depth
  (``find_events(skip=…)``, which also counts every match): the cost keyset paging avoids.

Each figure is the best of ``--repeat`` runs, in milliseconds, on SQLite (a new file) and on
PostgreSQL (a database created and dropped; ``WOW_BENCH_PG_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``,
default 127.0.0.1:5432 postgres; skipped when it does not answer).

    python bench/bench_console.py --sizes 1000,10000,100000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_django_store import PG, admin_connection  # noqa: E402

PAGE = 25
T0 = datetime(2024, 1, 1)
urlpatterns: list = []  # filled in main(): this module is the bench's URLconf


def fill(alias: str, start: int, stop: int) -> None:
    """Events number ``start`` … ``stop - 1`` straight into the table (rows as ``insert_event`` writes them)."""
    from wow_django.backends.django.bus_models import EventRecord
    from wow_django.backends.django.bus_store import EVENTS
    from wow_django.testing.bus_store import make_event

    for first in range(start, stop, 2000):
        rows = []
        for n in range(first, min(first + 2000, stop)):
            document = make_event(f"evt-{n:07d}", occurred_at=T0 + timedelta(milliseconds=n),
                                  consumers=("member-service", "message-service"), status="SENT")
            values = EVENTS.columns(document)
            values["initiatorService"] = "order-service"
            rows.append(EventRecord(**values))
        EventRecord.objects.using(alias).bulk_create(rows)


def render(view, request_factory, user, params: dict) -> float:
    from django.contrib.messages.storage.cookie import CookieStorage

    request = request_factory.get("/admin/wow/events/", params)
    request.user = user
    request._messages = CookieStorage(request)
    started = time.perf_counter()
    response = view(request)
    response.render()
    elapsed = time.perf_counter() - started
    assert response.status_code == 200 and b"evt-" in response.content
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--depth", type=int, default=None, help="events before the oldest (default: 60 %% of each size)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))

    directory = tempfile.mkdtemp(prefix="wow-bench-console-")
    engines = {"sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(directory, "wow.sqlite3")}}
    pg_name = f"wow_bench_console_{os.getpid()}"
    try:
        with admin_connection() as admin:
            admin.execute(f'CREATE DATABASE "{pg_name}"')
        engines["pg"] = {"ENGINE": "django.db.backends.postgresql", "NAME": pg_name, **PG}
    except Exception as exc:  # noqa: BLE001 - a bench without PostgreSQL still measures SQLite
        print(f"# PostgreSQL skipped: {exc}")

    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, **engines},
        INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions", "django.contrib.messages", "wow_django", "wow_django.bus"],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                    "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                       "django.contrib.auth.context_processors.auth",
                                                       "django.contrib.messages.context_processors.messages"]}}],
        ROOT_URLCONF="__main__", USE_TZ=True, SECRET_KEY="bench-only", ALLOWED_HOSTS=["testserver"],
        WOW={"STORAGE": "in_memory", "BUS_STORE": "django"},
    )
    django.setup()
    from django.contrib import admin
    from django.contrib.auth.models import AnonymousUser
    from django.core.management import call_command
    from django.db import connections
    from django.test import RequestFactory, override_settings
    from django.urls import include, path

    from wow_django.bus import get_bus
    from wow_django.bus.service import encode_cursor
    from wow_django.console import bus_views
    from wow_django.persistence.bus import EventQuery

    urlpatterns.extend([path("admin/wow/", include("wow_django.console.urls")), path("admin/", admin.site.urls)])

    class Operator(AnonymousUser):  # holds every permission, needs no table
        is_active = is_staff = True
        username = "bench"

        def has_perm(self, perm, obj=None):
            return True

        def has_module_perms(self, app_label):
            return True

    factory, user = RequestFactory(), Operator()
    print(f"# the console's bus event list (pages of {PAGE}), best of {args.repeat}, ms; "
          f"Python {sys.version.split()[0]}")
    print(f"{'engine':<12} {'events':>8} {'first page':>11} {'deep page':>10} {'depth':>8} "
          f"{'store: keyset':>14} {'store: offset (baseline)':>25}")
    try:
        for alias in engines:
            call_command("migrate", "wow_bus", database=alias, verbosity=0)
            with override_settings(WOW={"STORAGE": "in_memory", "BUS_STORE": "django", "DATABASE_ALIAS": alias}):
                store = get_bus().store
                filled = 0
                for size in sizes:
                    fill(alias, filled, size)
                    filled = size
                    depth = args.depth if args.depth is not None else size * 6 // 10
                    # Newest first: the event `depth` rows down has number size - 1 - depth.
                    n = size - 1 - depth
                    cursor = encode_cursor(T0 + timedelta(milliseconds=n), f"evt-{n:07d}")
                    first = min(render(bus_views.event_list, factory, user, {}) for _ in range(args.repeat))
                    deep = min(render(bus_views.event_list, factory, user, {"cursor": cursor})
                               for _ in range(args.repeat))
                    after = (T0 + timedelta(milliseconds=n), f"evt-{n:07d}")
                    keyset, offset = [], []
                    for _ in range(args.repeat):
                        started = time.perf_counter()
                        page = store.events_after(EventQuery(), after=after, limit=PAGE + 1)
                        keyset.append((time.perf_counter() - started) * 1000)
                        started = time.perf_counter()
                        total, same = store.find_events(EventQuery(), skip=depth + 1, limit=PAGE + 1)
                        offset.append((time.perf_counter() - started) * 1000)
                        assert total == size and [e["eventId"] for e in page] == [e["eventId"] for e in same]
                    name = "SQLite" if alias == "sqlite" else "PostgreSQL"
                    print(f"{name:<12} {size:>8,} {first:>11.1f} {deep:>10.1f} {depth:>8,} {min(keyset):>14.1f} "
                          f"{min(offset):>25.1f}")
    finally:
        connections.close_all()
        if "pg" in engines:
            with admin_connection() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()

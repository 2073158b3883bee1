"""Packaging: the runtime dependencies are exactly what the app imports at run time."""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from wow_django.backends.mongo.client import MongoConnection

from .support import imports_of, modules

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"
# Distribution name → the top-level modules it provides.
PROVIDES = {
    "django": {"django"}, "djangorestframework": {"rest_framework"}, "pymongo": {"pymongo", "bson", "gridfs"},
    "celery": {"celery"}, "kombu": {"kombu"}, "pydantic": {"pydantic"}, "drf-spectacular": {"drf_spectacular"},
    "mongomock": {"mongomock"}, "redis": {"redis"}, "jsonschema": {"jsonschema"}, "asgiref": {"asgiref"},
}
# Imported only where they are in use: mongomock behind mongomock:// URIs (with an error saying what to
# install); redis only by the coalesced rollup's drain, which runs only with Django's RedisCache as the
# default cache — a cache that needs redis-py installed itself.
OPTIONAL = {"mongomock", "redis"}


def requirements(section: str, key: str) -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    lines = [line.strip() for line in parser[section][key].splitlines() if line.strip()]
    return {re.split(r"[<>=!~ ]", line, maxsplit=1)[0].lower() for line in lines}


def third_party_imports(include_testing: bool) -> set[str]:
    stdlib = set(sys.stdlib_module_names)
    found = set()
    for name in modules():
        if not include_testing and name.startswith("wow_django.testing"):
            continue
        for target, _ in imports_of(name):
            top = target.split(".")[0]
            if top and top not in stdlib and top != "wow_django" and top != "__future__":
                found.add(top)
    return found


def test_install_requires_covers_every_runtime_import_and_nothing_else():
    required = requirements("options", "install_requires")
    provided = set().union(*(PROVIDES[dist] for dist in required))
    imported = third_party_imports(include_testing=False)
    assert imported - provided == OPTIONAL  # only the embedded engine and the Redis cache's client are optional
    unused = {dist for dist in required if not PROVIDES[dist] & imported}
    assert unused == set()


def test_the_embedded_engine_and_celerys_redis_client_are_extras():
    assert {"mongomock", "redis"}.isdisjoint(requirements("options", "install_requires"))
    assert requirements("options.extras_require", "mongomock") == {"mongomock"}
    assert {"mongomock", "redis"} <= requirements("options.extras_require", "sample")
    assert {"mongomock", "redis"} <= requirements("options.extras_require", "test")
    # Celery's Redis transport needs more than redis-py (packaging): celery[redis] declares it (issue 25).
    for extra in ("redis", "sample", "test"):
        assert "celery[redis]" in requirements("options.extras_require", extra)


def test_a_mongomock_uri_without_mongomock_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mongomock", None)  # as if it were not installed
    with pytest.raises(ImproperlyConfigured, match=r"pip install 'wow-django\[mongomock\]'"):
        MongoConnection("mongomock://localhost/wow")


def test_the_bench_extra_pulls_the_postgresql_baseline_with_psycopg_3():
    parser = configparser.ConfigParser()
    parser.read(SETUP_CFG)
    bench = [line.strip() for line in parser["options.extras_require"]["bench"].splitlines() if line.strip()]
    test = [line.strip() for line in parser["options.extras_require"]["test"].splitlines() if line.strip()]
    # pyeventsourcing's postgres extra brings psycopg_pool, which bench_django_store and bench_gateway_pg need.
    assert any(line.startswith("eventsourcing[postgres]") for line in bench)
    assert any(line.startswith("psycopg[binary]") and "<4" in line for line in test)

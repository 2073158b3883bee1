"""MongoDB backends, built only from pymongo (mongomock for the embedded engine)."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from wow_django.conf import DEFAULT_MONGO_URI, wow_settings
from wow_django.mongo.client import MongoConnection, check_database_name, connect, parse_uri, redact

PURPOSES = ("EVENT_STREAM", "SNAPSHOT", "PREPARE", "BUS")


def configured_uri() -> str:
    return wow_settings.MONGO_URI or DEFAULT_MONGO_URI


def database_name(purpose: str) -> str:
    """The database for ``purpose`` (EVENT_STREAM, SNAPSHOT, PREPARE or BUS)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    setting = f"{purpose}_DATABASE"
    explicit = getattr(wow_settings, setting)
    if explicit:
        return check_database_name(explicit, f"WOW[{setting!r}]")
    uri = configured_uri()
    _, default = parse_uri(uri)
    if default is None:
        raise ImproperlyConfigured(
            f"No MongoDB database for {purpose.lower().replace('_', ' ')} data: WOW['MONGO_URI'] "
            f"({redact(uri)}) names no database and WOW[{setting!r}] is not set. Add the database to "
            "the URI (mongodb://host:27017/my_db) or set the database setting."
        )
    return default


def get_connection() -> MongoConnection:
    return connect(configured_uri())


__all__ = ["MongoConnection", "connect", "configured_uri", "database_name", "get_connection", "PURPOSES"]

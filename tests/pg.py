"""Where the tests' PostgreSQL is (``WOW_TEST_PG_HOST``/``_PORT``/``_USER``/``_PASSWORD``), for settings
modules and tests alike: plain ``os.environ`` reads, importable before Django is configured."""

import contextlib
import os


def pg_database(name: str) -> dict:
    """A ``settings.DATABASES`` entry for database ``name`` on the tests' PostgreSQL."""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "HOST": os.environ.get("WOW_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("WOW_TEST_PG_PORT", "5432"),
        "USER": os.environ.get("WOW_TEST_PG_USER", "postgres"),
        "PASSWORD": os.environ.get("WOW_TEST_PG_PASSWORD", ""),
    }


def pg_connect_kwargs() -> dict:
    """The same server as keyword arguments of ``psycopg.connect`` (without a database)."""
    entry = pg_database("")
    return {"host": entry["HOST"], "port": int(entry["PORT"]), "user": entry["USER"], "password": entry["PASSWORD"]}


@contextlib.contextmanager
def scratch_database(prefix: str):
    """A new, empty PostgreSQL database on the tests' server for processes a test starts: its name, dropped
    (with any session still on it) when the block ends."""
    import uuid

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **pg_connect_kwargs()) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **pg_connect_kwargs()) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

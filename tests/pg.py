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


def pg_connect_kwargs(entry: dict | None = None) -> dict:
    """The server of a ``settings.DATABASES`` entry (default: the tests' own, :func:`pg_database`) as keyword
    arguments of ``psycopg.connect`` (without a database)."""
    entry = entry or pg_database("")
    return {"host": entry["HOST"], "port": int(entry["PORT"] or 5432), "user": entry["USER"],
            "password": entry["PASSWORD"]}


@contextlib.contextmanager
def scratch_database(prefix: str):
    """A new, empty PostgreSQL database on the tests' server for processes a test starts: its name, dropped
    (with any session still on it) when the block ends, without waiting (:func:`drop_database_later`)."""
    import uuid

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **pg_connect_kwargs()) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        drop_database_later(name)


#: What drops a database in a process of its own (argv: the database, the server as JSON): a few tries, then
#: it leaves the database (named ``…_drop_…``) for the next run's :func:`drop_leftovers`.
_DROPPER = """
import json, sys, time
import psycopg
name, server = sys.argv[1], json.loads(sys.argv[2])
for attempt in range(20):
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **server) as admin:
            admin.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name.replace('"', '""'))
        break
    except psycopg.Error:
        time.sleep(3)
"""

#: What a database waiting for its drop is renamed to: ``<its name, cut>_drop_<8 hex>``.
DOOMED_INFIX = "_drop_"


def drop_database_later(name: str, server: dict | None = None) -> None:
    """End the sessions on database ``name``, rename it out of the way, and drop it from a process of its own
    that nobody waits for.

    PostgreSQL's ``DROP DATABASE`` forces a checkpoint and waits for it (the checkpointer must forget the
    database's files), and that checkpoint syncs every file written since the last one. After the suite's
    transactional tests (each truncates every table: new files) that is tens of thousands of files: 31 s on
    an idle 2-core machine, 394 s on a busy one, in one test's tear-down or in the session's end (pytest-django
    drops its test databases there). The rename takes no checkpoint, so the name is free at once for the
    next run that wants it (the test databases are named after the process id). New connections are refused
    first, so that a client that reconnects cannot keep the rename waiting. ``server``: the
    ``psycopg.connect`` keywords of the server (default :func:`pg_connect_kwargs`)."""
    import time
    import uuid

    import psycopg
    from psycopg import errors

    server = server or pg_connect_kwargs()
    doomed = f"{name[:40]}{DOOMED_INFIX}{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        try:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        except errors.InvalidCatalogName:
            return  # no such database
        deadline = time.monotonic() + 30
        while True:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                          "AND pid <> pg_backend_pid()", (name,))
            try:
                admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{doomed}"')
                break
            except errors.InvalidCatalogName:
                return  # no such database
            except errors.ObjectInUse:  # a terminated session has not exited yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    _spawn_dropper(doomed, server)


def _spawn_dropper(name: str, server: dict) -> None:
    """Start :data:`_DROPPER` for ``name`` through sh and "&": nobody's child to wait for (no zombie, no
    ResourceWarning), it outlives the test process if it must. The password goes in its environment
    (``PGPASSWORD``), not on its command line, where ``ps`` would show it."""
    import json
    import subprocess
    import sys

    shown = {key: value for key, value in server.items() if key != "password"}
    env = {**os.environ, "PGPASSWORD": str(server.get("password") or "")}
    subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" "$3" </dev/null >/dev/null 2>&1 &', sys.executable, _DROPPER,
                    name, json.dumps(shown)], check=True, env=env)


#: The names :func:`drop_database_later` gives: every database the suite makes starts with ``test_wow``.
DOOMED_NAME = "^test_wow.*" + DOOMED_INFIX + "[0-9a-f]{8}$"


def drop_leftovers() -> None:
    """Drop (later) what earlier runs left waiting for its drop: databases named as :data:`DOOMED_NAME` (a
    concurrent run's dropper may be at one already: a second ``DROP DATABASE IF EXISTS`` of it does nothing).
    No other database is touched."""
    import psycopg

    server = pg_connect_kwargs()
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **server) as admin:
            found = admin.execute("SELECT datname FROM pg_database WHERE datname ~ %s", (DOOMED_NAME,)).fetchall()
    except psycopg.Error:
        return  # no server: the tests that need it say so
    for (name,) in found:
        _spawn_dropper(name, server)

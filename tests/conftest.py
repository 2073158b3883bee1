"""Fixtures: a fresh wow_django environment per test, on each local backend."""

from __future__ import annotations

import os
import uuid

import pytest
from django.test import override_settings

from wow_django.backends.mongo.client import disconnect
from wow_django.testing import isolated_registry


def fresh_wow(storage: str, **extra) -> dict:
    uri = f"mongomock://localhost/t_{uuid.uuid4().hex[:10]}"
    return {"CONTEXT_NAME": "order-service", "STORAGE": storage, "MONGO_URI": uri,
            "COMMAND_RETRY_BACKOFF_MS": 0.5, **extra}


@pytest.fixture(params=["in_memory", "mongo"])
def wow(request):
    """Settings with a fresh store on the in-memory backend and on mongomock://."""
    settings = fresh_wow(request.param)
    with override_settings(WOW=settings):
        yield settings
    disconnect(settings["MONGO_URI"])


@pytest.fixture(params=["mongo", "in_memory"])
def bus_store(request):
    """WOW['BUS_STORE'] of a bus test: the Mongo store (on mongomock://) and the in-memory store."""
    return request.param


@pytest.fixture
def wow_memory():
    settings = fresh_wow("in_memory")
    with override_settings(WOW=settings):
        yield settings


@pytest.fixture
def wow_mongo():
    settings = fresh_wow("mongo")
    with override_settings(WOW=settings):
        yield settings
    disconnect(settings["MONGO_URI"])


@pytest.fixture
def queued_commands(monkeypatch):
    """Commands sent with wait stage SENT: recorded, then run in-line instead of through Celery.

    An eager Celery call would leave a broker pool and a result backend cached
    on the app, pointing later tests that reconfigure Celery at the wrong Redis.
    """
    from wow_django.tasks import process_command

    queued: list[dict] = []

    def enqueue(message: dict):
        queued.append(message)
        return process_command.run(message)

    monkeypatch.setattr(process_command, "delay", enqueue)
    return queued


def in_forked_child(probe) -> tuple[bool, ...]:
    """Run ``probe()`` (returning a tuple of bools) in a forked child; its answer, read back in the parent."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child answers, then leaves at once (no test teardown runs twice)
        try:
            os.write(write, b"".join(b"1" if flag else b"0" for flag in probe()))
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    return tuple(c == ord("1") for c in answer)


@pytest.fixture(autouse=True)
def _isolated_declarations():
    """Aggregates, events, projections and consumers a test declares vanish after it."""
    with isolated_registry():
        yield

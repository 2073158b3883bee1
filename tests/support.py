"""Helpers shared by the test modules (not a test module: no test imports another test module)."""

from __future__ import annotations

import ast
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

import wow_django
from wow_django.application.runtime import get_runtime
from wow_django.backends.mongo.bus_store import MongoBusStore
from wow_django.exceptions import EventVersionConflict
from wow_django.persistence.followers import PoisonEvent


def fresh_wow(storage: str, **extra) -> dict:
    uri = f"mongomock://localhost/t_{uuid.uuid4().hex[:10]}"
    return {"CONTEXT_NAME": "order-service", "STORAGE": storage, "MONGO_URI": uri,
            "COMMAND_RETRY_BACKOFF_MS": 0.5, **extra}


def wait_for(predicate, timeout: float = 20.0, what: str = "condition", interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned); ``AssertionError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:g}s")


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


# --- reading the package's imports without importing it ------------------------------------

ROOT = Path(wow_django.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in the module, at any depth."""
    path = modules()[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # "from pkg import module" imports the module; "from module import name" the module.
                candidate = f"{base}.{alias.name}"
                found.append((candidate if candidate in modules() else base, node.lineno))
    return found


# --- the bus over HTTP --------------------------------------------------------------------

TOKENS = {"member-service": "member-token-0123456789abcdef", "message-service": "message-token-0123456789abcd"}
CONSUMERS = tuple(TOKENS)


def client_with(*codenames, staff=False, superuser=False, name="user"):
    user = get_user_model().objects.create_user(name, f"{name}@example.com", "pw", is_staff=staff,
                                                is_superuser=superuser)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="wow_bus", codename=codename))
    client = APIClient()
    client.force_authenticate(user)
    return client


def callback(token, body, client=None):
    client = client or APIClient()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return (client or APIClient()).post("/bus/callback/", body, format="json", **headers)


def stored_counts(store) -> tuple[int, int]:
    """``(events, feedback rows)`` the bus store holds, read past the store contract (which counts neither)."""
    if isinstance(store, MongoBusStore):
        return store.events.count_documents({}), store.consumptions.count_documents({})
    return len(store._events), sum(len(attempts) for attempts in store._attempts.values())


def in_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread of its own, as consumer workers run; its result, or its exception."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), f"{fn} did not return"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class RivalReads:
    """One gateway's view of the shared event store.

    Once armed, its next read waits at a barrier shared with the other
    gateway's view: both have read the same version before either appends,
    so their appends of the next version conflict, whatever the scheduling.
    """

    def __init__(self, inner, barrier: threading.Barrier, conflicts: list[int]):
        self.inner = inner
        self.barrier = barrier
        self.conflicts = conflicts
        self.armed = False

    def load(self, *args, **kwargs):
        streams = self.inner.load(*args, **kwargs)
        if self.armed:  # read under the gateway's aggregate lock: one reader at a time per view
            self.armed = False
            self.barrier.wait()
        return streams

    def append(self, stream):
        try:
            self.inner.append(stream)
        except EventVersionConflict:
            self.conflicts.append(stream.version)
            raise

    def __getattr__(self, name):
        return getattr(self.inner, name)


def poisoned_follower(name: str = "order-summaries", position: int = 4):
    """A follower stopped on a poison event at ``position`` (checkpoint just before it)."""
    store = get_runtime().follower_store
    now = datetime.now(UTC)
    store.acquire(name, "test-owner", 30, now=now)
    store.advance(name, "test-owner", position - 1, now=now)
    error = "InvalidOperation: [<class 'decimal.ConversionSyntax'>]\n\nTraceback (most recent call last):\n  x"
    store.set_poison(name, "test-owner", PoisonEvent(position=position, stream_id="s-4", aggregate="order/o-4",
                                                     error=error, at=now), now=now)
    store.release(name, "test-owner")
    return store

"""Helpers shared by the test modules (not a test module: no test imports another test module)."""

from __future__ import annotations

import os
import uuid


def fresh_wow(storage: str, **extra) -> dict:
    uri = f"mongomock://localhost/t_{uuid.uuid4().hex[:10]}"
    return {"CONTEXT_NAME": "order-service", "STORAGE": storage, "MONGO_URI": uri,
            "COMMAND_RETRY_BACKOFF_MS": 0.5, **extra}


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

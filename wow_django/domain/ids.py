"""Identifier generation: sortable by creation time, unique without coordination.

The one id generator of wow_django: ids of commands, event streams, events
and records. Plain Python. After ``fork()`` the child reseeds (its own
``os.register_at_fork`` hook: the domain is used with or without a runtime),
so parent and child never share a sequence.
"""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0
# Ids need uniqueness, not secrecy: a fast generator seeded from the OS.
_random = random.Random(os.urandom(32))


def reseed_after_fork() -> None:
    """In a forked child: a new lock (the parent's may be held) and a new random sequence."""
    global _lock
    _lock = threading.Lock()
    _random.seed(os.urandom(32))


def generate_id() -> str:
    """A 32-character hex id: 48-bit milliseconds, 16-bit counter, 64 random bits.

    Ids made later in one process sort after earlier ones; ids from different
    processes collide with probability ~2⁻⁶⁴ per millisecond.
    """
    global _last_ms, _counter
    with _lock:
        now = time.time_ns() // 1_000_000
        if now <= _last_ms:
            _counter = (_counter + 1) & 0xFFFF
            if _counter == 0:  # 65,536 ids in one millisecond: borrow the next one
                _last_ms += 1
            now = _last_ms
        else:
            _counter = 0
            _last_ms = now
        counter = _counter
        noise = _random.getrandbits(64)
    return _encode((now << 80) | (counter << 64) | noise)


def _encode(value: int) -> str:
    return format(value, "032x")  # fixed width: sorts like the value


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reseed_after_fork)

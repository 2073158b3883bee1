"""Identifier generation: sortable by creation time, unique without coordination.

Plain Python (no Django): records, the domain and the stores all use it.
"""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0
# Ids need uniqueness, not secrecy: a fast generator seeded from the OS, and
# reseeded in a forked child so parent and child never share a sequence.
_random = random.Random(os.urandom(32))


def _reseed() -> None:
    global _lock
    _lock = threading.Lock()
    _random.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


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

"""Identifier generation: sortable by creation time, unique without coordination."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def generate_id() -> str:
    """A 26-character id: 48-bit milliseconds, 16-bit counter, 64 random bits, base32.

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
    value = (now << 80) | (counter << 64) | int.from_bytes(os.urandom(8), "big")
    return _encode(value)


_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))

"""A clock that tests move by hand, for stores that take a ``clock`` (e.g. the PrepareKey stores)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A clock that stands still until :meth:`advance` moves it; call it for now (aware UTC).

    It starts at ``start`` (aware), or at the real now cut to whole
    milliseconds, so every time it gives survives a BSON round trip unchanged
    and a test can compare stored times exactly.
    """

    def __init__(self, start: datetime | None = None):
        if start is None:
            start = datetime.now(UTC)
            start = start.replace(microsecond=start.microsecond // 1000 * 1000)
        elif start.tzinfo is None:
            raise ValueError("a FakeClock starts at an aware datetime")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0, **delta: float) -> datetime:
        """Move the clock on by ``seconds`` plus any :class:`~datetime.timedelta` arguments; the new now.

        It never goes back.
        """
        step = timedelta(seconds=seconds, **delta)
        if step < timedelta(0):
            raise ValueError(f"a FakeClock does not go back (advance by {step})")
        with self._lock:
            self._now += step
            return self._now

    def __repr__(self) -> str:
        return f"FakeClock({self().isoformat()})"

"""Deriving an event's status from its consumers' feedback (seed 004 §2.5, §2.6). Pure functions."""

from __future__ import annotations

from collections.abc import Iterable

from wow_django.bus.envelope import FEEDBACK_STATUSES, EventStatus


def latest_by_consumer(rows: Iterable[dict]) -> dict[str, dict]:
    """The row with the highest ``attemptNo`` for each consumer."""
    latest: dict[str, dict] = {}
    for row in rows:
        current = latest.get(row["consumerId"])
        if current is None or row["attemptNo"] > current["attemptNo"]:
            latest[row["consumerId"]] = row
    return latest


def outcome(row: dict | None) -> bool | None:
    """True (consumed), False (failed for good) or None (waiting, or failed and being retried)."""
    if row is None or row.get("success") is None:
        return None
    if row["success"] is False and row.get("retrying"):
        return None
    return bool(row["success"])


def expected_consumers(event: dict, latest: dict[str, dict]) -> list[str]:
    return list(event.get("consumers") or sorted(latest))


def compute_status(expected: list[str], latest: dict[str, dict], current: str) -> str:
    """The status the latest feedback gives; ``current`` when feedback says nothing new.

    All succeeded → CONSUMED; a final failure → PARTIAL when another consumer
    succeeded, else FAILED; otherwise someone is still working on it: SENT,
    unless the event is still PENDING or RETRYING (send-side statuses the
    rollup leaves alone).
    """
    outcomes = [outcome(latest.get(consumer)) for consumer in expected]
    if outcomes and all(o is True for o in outcomes):
        return EventStatus.CONSUMED.value
    if any(o is False for o in outcomes):
        return (EventStatus.PARTIAL if any(o is True for o in outcomes) else EventStatus.FAILED).value
    if current in FEEDBACK_STATUSES:
        return EventStatus.SENT.value
    return current


def consumed_summary(expected: list[str], latest: dict[str, dict]) -> dict:
    """``{"consumed": 1, "expected": 2, "failed": 1, "text": "1/2 consumed"}``."""
    outcomes = [outcome(latest.get(consumer)) for consumer in expected]
    consumed = sum(1 for o in outcomes if o is True)
    failed = sum(1 for o in outcomes if o is False)
    return {"consumed": consumed, "expected": len(expected), "failed": failed,
            "text": f"{consumed}/{len(expected)} consumed"}

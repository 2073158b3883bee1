"""Deriving an event's status from its consumers' feedback (seed 004 §2.5, §2.6). Pure functions."""

from __future__ import annotations

from collections.abc import Iterable

from wow_django.bus.envelope import FEEDBACK_STATUSES, EventStatus
from wow_django.log import first_line


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
    """``{"consumed": 1, "expected": 2, "failed": 1, "text": "1/2 consumed", "lastFailure": {...}}``.

    ``lastFailure`` is the most recent of the expected consumers' latest rows that report a failure (dead-lettered
    or being retried): ``consumerId``, ``attemptNo``, ``error`` (its first line), ``at``; None when no
    consumer's latest attempt failed.
    """
    outcomes = [outcome(latest.get(consumer)) for consumer in expected]
    consumed = sum(1 for o in outcomes if o is True)
    failed = sum(1 for o in outcomes if o is False)
    failures = [latest[consumer] for consumer in expected
                if consumer in latest and latest[consumer].get("success") is False]
    last = max(failures, key=lambda row: (row.get("consumedAt") is not None, row.get("consumedAt") or 0,
                                          row["consumerId"]), default=None)
    return {"consumed": consumed, "expected": len(expected), "failed": failed,
            "text": f"{consumed}/{len(expected)} consumed",
            "lastFailure": None if last is None else {
                "consumerId": last["consumerId"], "attemptNo": last.get("attemptNo"),
                "error": first_line(last.get("error") or "failed"), "at": last.get("consumedAt")}}


def last_error(event: dict, summary: dict | None) -> str | None:
    """The event's ``lastError``: the last send error, else the failure of the consumer that failed last
    (``"consumer <id>, attempt <n>: <error>"``), else None."""
    if event.get("lastError"):
        return event["lastError"]
    failure = (summary or {}).get("lastFailure")
    if not failure:
        return None
    return f"consumer {failure['consumerId']}, attempt {failure['attemptNo']}: {failure['error']}"

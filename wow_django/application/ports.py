"""What the application hands to background workers, as a port the edges implement.

The gateway and the bus never import Celery: they call a :class:`TaskQueue`.
``WOW['TASK_QUEUE']`` names the implementation (default
:class:`wow_django.tasks.CeleryTaskQueue`), a class built without arguments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class TaskQueue(ABC):
    """Queues work by id. Each method returns once the work is queued (or done, inline)."""

    @abstractmethod
    def process_command(self, message: dict) -> None:
        """Queue a command sent with wait stage SENT (a ``CommandMessage.to_dict()``)."""

    @abstractmethod
    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        """Queue a snapshot refresh of one aggregate; False when one is already pending (coalesced)."""

    @abstractmethod
    def rollup(self, event_id: str) -> bool:
        """Queue the status rollup of one bus event (serially, on its own queue).

        False: not queued — the bus that asked rolls it up itself, inline
        (e.g. Celery in eager mode).
        """

    def rollup_many(self, event_ids: list[str]) -> list[str]:
        """Queue the rollups of several bus events (a burst of feedback); the ids not queued, which the
        bus rolls up inline. This default asks :meth:`rollup` for each; a queue that can take them in
        one request does."""
        return [event_id for event_id in event_ids if not self.rollup(event_id)]

"""What the application hands to background workers, as a port the edges implement.

The gateway and the bus never import Celery: they call a :class:`TaskQueue`.
``WOW['TASK_QUEUE']`` names the implementation (default
:class:`wow_django.tasks.CeleryTaskQueue`); :class:`InlineTaskQueue` runs the
work at once in the calling process (tests, scripts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable


class TaskQueue(ABC):
    """Queues work by id. Each method returns once the work is queued (or done, inline)."""

    @abstractmethod
    def process_command(self, message: dict) -> None:
        """Queue a command sent with wait stage SENT (a ``CommandMessage.to_dict()``)."""

    @abstractmethod
    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        """Queue a snapshot refresh of one aggregate; False when one is already pending (coalesced)."""

    @abstractmethod
    def rollup(self, event_id: str) -> None:
        """Queue the status rollup of one bus event (serially, on its own queue)."""


class InlineTaskQueue(TaskQueue):
    """Runs each piece of work at once, in this process, through the given callables."""

    def __init__(self, *, process_command: Callable[[dict], object], refresh_snapshot: Callable[[str, str], object],
                 rollup: Callable[[str], object]):
        self._process_command = process_command
        self._refresh_snapshot = refresh_snapshot
        self._rollup = rollup

    def process_command(self, message: dict) -> None:
        self._process_command(message)

    def request_snapshot(self, aggregate_name: str, aggregate_id: str) -> bool:
        self._refresh_snapshot(aggregate_name, aggregate_id)
        return True

    def rollup(self, event_id: str) -> None:
        self._rollup(event_id)

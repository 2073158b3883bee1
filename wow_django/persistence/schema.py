"""What a backend's schema reconciliation (``manage.py wow_init_schema``) reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SchemaReport:
    """What reconciliation found: one ``(database, collection, subject, state)`` per line
    (for the django backend: database alias, table or app, subject, state).

    ``state`` is ``created``, ``verified``, ``missing`` (check mode) or
    ``conflict``; ``conflicts`` and ``ownership`` hold the messages.
    """

    lines: list[tuple[str, str, str, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    ownership: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.ownership + self.conflicts

    def add(self, database: str, collection: str, subject: str, state: str) -> None:
        self.lines.append((database, collection, subject, state))

    @property
    def matches(self) -> bool:
        return not self.problems and all(state in ("verified", "created") for *_, state in self.lines)

    def merge(self, other: SchemaReport) -> None:
        self.lines.extend(other.lines)
        self.conflicts.extend(other.conflicts)
        self.ownership.extend(other.ownership)



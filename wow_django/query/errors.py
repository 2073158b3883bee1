"""The error every query parser and backend raises for a bad query."""

from __future__ import annotations

from wow_django.exceptions import WowError


class QueryValidationError(WowError):
    """A query or condition breaks a rule; nothing was run.

    ``path`` points at the offending node in the request body, for example
    ``condition.children[1].value`` or ``pagination.size``; ``rule`` is the
    message without the path. ``str(error)`` is ``"<path>: <rule>"``.
    """

    error_code = "INVALID_QUERY"

    def __init__(self, path: str, rule: str):
        self.path = path
        self.rule = rule
        super().__init__(f"{path}: {rule}" if path else rule)

    @property
    def binding_errors(self) -> list[dict[str, str]]:
        """The error in the ``bindingErrors`` shape of the HTTP API: ``[{name, msg}]``."""
        return [{"name": self.path, "msg": self.rule}]

"""The error every query parser and backend raises for a bad query."""

from __future__ import annotations

from wow_django.exceptions import WowError


class QueryValidationError(WowError):
    """A query or condition breaks a rule; nothing was run.

    ``path`` points at the offending node in the request body, for example
    ``condition.children[1].value`` or ``pagination.size``; ``rule`` is the
    message without the path. ``str(error)`` is ``"<path>: <rule>"``.
    """

    error_code = "IllegalArgument"

    def __init__(self, path: str, rule: str):
        self.path = path
        self.rule = rule
        super().__init__(f"{path}: {rule}" if path else rule)

    @property
    def binding_errors(self) -> list[dict[str, str]]:
        """The error in the ``bindingErrors`` shape of the HTTP API: ``[{name, msg}]``."""
        return [{"name": self.path, "msg": self.rule}]


class QueryTooExpensive(QueryValidationError):
    """The database stopped the query at its time limit (``MONGO_MAX_TIME_MS`` on MongoDB, the
    ``DATABASE_QUERY_TIMEOUT_MS`` statement timeout on PostgreSQL). Not transient: the same query would
    be stopped again, so it is not retried and gets no Retry-After; narrow it or add an index."""

    error_code = "QueryTooExpensive"

    def __init__(self, limit_setting: str, limit_ms: int | None):
        limit = f"{limit_ms} ms" if limit_ms else "its time limit"
        super().__init__("", f"the query ran longer than {limit} (WOW['{limit_setting}']) and was stopped; narrow "
                             "the condition, ask for fewer documents, or add an index that serves it")


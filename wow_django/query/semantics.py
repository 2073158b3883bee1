"""What every compiler of the condition DSL agrees on: field renaming, text patterns, date windows.

The Mongo compiler (:mod:`wow_django.backends.mongo.compiler`), the Python evaluator
(:mod:`wow_django.query.evaluator`) and the ORM compiler use these, so one
condition means the same on every backend.
"""

from __future__ import annotations

import re
from datetime import datetime

from wow_django.query import dates
from wow_django.query.condition import Condition, Operator

Op = Operator

# A word of MATCH (full-text search): a run of letters, digits and '_'.
WORD = re.compile(r"\w+")

# End of subject. Not "$": in both PCRE (the server) and Python, "$" also
# matches before a final newline, so "abc$" would match "abc\n".
END_OF_TEXT = r"(?![\s\S])"

def text_pattern(operator: Operator, text: str) -> str:
    """The regular expression (PCRE and Python alike) for a text operator over literal ``text``.

    CONTAINS: anywhere; STARTS_WITH: at the start; ENDS_WITH: at the end;
    EQ / NE: the whole string (used for ``ignoreCase``).
    """
    escaped = re.escape(text)
    if operator is Op.CONTAINS:
        return escaped
    if operator is Op.STARTS_WITH:
        return "^" + escaped
    if operator is Op.ENDS_WITH:
        return escaped + END_OF_TEXT
    if operator in (Op.EQ, Op.NE):
        return "^" + escaped + END_OF_TEXT
    raise ValueError(f"{operator} is not a text operator")


def words(text: str) -> list[str]:
    """The words MATCH sees in ``text``: runs of ``\\w`` in its case-folded form."""
    return WORD.findall(text.casefold())


def search_terms(text: str) -> frozenset[str]:
    """The terms of a MATCH search text: a document matches when one of its words is one of them."""
    return frozenset(words(text))


def map_field(path: str, field_map: dict[str, str] | None) -> str:
    """``path`` with its first segment renamed by ``field_map`` (``id`` -> ``_id``)."""
    if not field_map:
        return path
    head, dot, rest = path.partition(".")
    return field_map.get(head, head) + dot + rest


def date_bounds(condition: Condition, now: datetime) -> tuple[int | str | None, int | str]:
    """``(low, high)`` of a date condition at ``now``: ``low <= field < high`` (a ``None`` low: unbounded below)."""
    window = dates.date_window(condition.operator.value, now=now, zone=condition.options.zone, days=condition.value)
    return dates.window_bounds(window, condition.options.parsed_date_pattern)

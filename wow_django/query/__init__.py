"""The query condition DSL: its model, its parsers, its semantics and the in-memory evaluator.

* :mod:`wow_django.query.condition` — the model and the parsers;
* :mod:`wow_django.query.semantics` — the rules every engine follows (field
  mapping, text patterns, date bounds, full-text words);
* :mod:`wow_django.query.evaluator` — those semantics on plain dicts (the
  in-memory backend, and the reference the compilers are tested against);
* :mod:`wow_django.query.dates` — the date windows;
* :mod:`wow_django.query.typed` — values typed from an aggregate's model.

The compilers live with their backends: :mod:`wow_django.backends.mongo.compiler`
(filters, projections and sorts for pymongo) and
:mod:`wow_django.backends.django.compiler` (``Q`` and ``order_by`` for Django
querysets over a table of document columns, on SQLite and PostgreSQL). A new
backend brings its own compiler in its own folder under ``wow_django.backends``.

Nothing here imports Django, pymongo or bson.
"""

from wow_django.query.condition import (
    ALL_CONDITION,
    Condition,
    ConditionOptions,
    DeletionState,
    Direction,
    ListQuery,
    Operator,
    PagedQuery,
    Pagination,
    Projection,
    SingleQuery,
    SortField,
    and_conditions,
    parse_condition,
    parse_count_query,
    parse_list_query,
    parse_paged_query,
    parse_single_query,
)
from wow_django.query.errors import QueryValidationError

__all__ = [
    "ALL_CONDITION",
    "Condition",
    "ConditionOptions",
    "DeletionState",
    "Direction",
    "ListQuery",
    "Operator",
    "PagedQuery",
    "Pagination",
    "Projection",
    "QueryValidationError",
    "SingleQuery",
    "SortField",
    "and_conditions",
    "parse_condition",
    "parse_count_query",
    "parse_list_query",
    "parse_paged_query",
    "parse_single_query",
]

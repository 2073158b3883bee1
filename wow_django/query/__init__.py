"""The query condition DSL: parse client JSON, then compile it for MongoDB or evaluate it in Python.

* :mod:`wow_django.query.condition` — the model and the parsers;
* :mod:`wow_django.query.mongo` — filters, projections and sorts for pymongo;
* :mod:`wow_django.query.evaluator` — the same semantics on plain dicts;
* :mod:`wow_django.query.dates` — the date windows both use;
* :mod:`wow_django.query.orm` — ``Q`` and ``order_by`` for Django querysets over
  a table of document columns (the django backend), on SQLite and PostgreSQL.

Nothing here imports Django except :mod:`wow_django.query.orm`, which this
package does not import.
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

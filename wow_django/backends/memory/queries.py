"""Query services over the in-memory stores, answered by the Python evaluator.

The stores hold records; each query sees them as the documents the Mongo
adapters would store (the adapters own that shape), so a condition means the
same on both backends. Every query scans the aggregate type: this backend is
for tests and demos.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from wow_django.backends.memory.stores import InMemoryEventStore, InMemorySnapshotStore
from wow_django.persistence.documents import snapshot_to_document, stream_to_document
from wow_django.persistence.query import EVENT_STREAM, SNAPSHOT, QueryService
from wow_django.query.condition import Condition, Operator, Projection, SortField, uses_operator
from wow_django.query.errors import QueryValidationError
from wow_django.query.evaluator import count_matching, evaluate


class InMemoryQueryService(QueryService):
    """Evaluates queries over ``documents()``, a fresh iterable of stored-shape documents per call."""

    def __init__(self, aggregate_name: str, kind: str, documents: Callable[[], Iterable[dict]]):
        super().__init__(aggregate_name, kind)
        self._documents = documents

    @staticmethod
    def _refuse_raw(condition: Condition) -> None:
        # Refused up front, so the answer does not depend on whether any document exists.
        if uses_operator(condition, Operator.RAW):
            raise QueryValidationError(
                "condition", "RAW conditions need the Mongo backend; the in-memory store cannot run MongoDB filters"
            )

    def find_documents(
        self, condition: Condition, *, projection: Projection, sort: tuple[SortField, ...], skip: int, limit: int
    ) -> list[dict]:
        self._refuse_raw(condition)
        return evaluate(
            self._documents(), condition, field_map=self.field_map, projection=projection, sort=sort,
            skip=skip, limit=limit,
        )

    def count_documents(self, condition: Condition) -> int:
        self._refuse_raw(condition)
        return count_matching(self._documents(), condition, field_map=self.field_map)


class InMemorySnapshotQueryService(InMemoryQueryService):
    def __init__(self, store: InMemorySnapshotStore, aggregate_name: str):
        super().__init__(
            aggregate_name, SNAPSHOT, lambda: (snapshot_to_document(s) for s in store.all(aggregate_name))
        )


class InMemoryEventStreamQueryService(InMemoryQueryService):
    def __init__(self, store: InMemoryEventStore, aggregate_name: str):
        super().__init__(
            aggregate_name, EVENT_STREAM, lambda: (stream_to_document(s) for s in store.all_streams(aggregate_name))
        )

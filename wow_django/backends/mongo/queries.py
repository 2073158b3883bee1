"""Query services on MongoDB: compiled filters, ``maxTimeMS`` on every query.

They read through the Mongo stores (``MongoSnapshotStore`` /
``MongoEventStore``), which own the collections, their schema and the
connection. Every ``find`` and ``count_documents`` carries the store's
``max_time_ms``; on the embedded engine every read runs under
``connection.guard(collection)``.

MATCH compiles to ``$text``, which needs a text index on a real server (the
server's refusal becomes a 400 naming the missing index). The embedded engine
has no ``$text`` at all: there, and only there, the rest of the condition
runs as a filter and the MATCH part, the sort, the page and the projection are
applied in Python with the evaluator (whose MATCH is documented in
:mod:`wow_django.query.evaluator`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

from bson import Binary, Decimal128, ObjectId
from bson import errors as bson_errors
from pymongo import errors as pymongo_errors

from wow_django.backends.mongo.compiler import compile_filter, compile_projection, compile_sort, needs_text_search
from wow_django.backends.mongo.errors import recoverable_errors
from wow_django.domain.values import canonical_time
from wow_django.exceptions import RecoverableStoreError
from wow_django.persistence.query import (
    EVENT_STREAM,
    SNAPSHOT,
    QueryService,
    refuse_misplaced_text_search,
    split_text_search,
)
from wow_django.query.condition import Condition, Operator, Projection, SortField, uses_operator
from wow_django.query.errors import QueryTooExpensive, QueryValidationError
from wow_django.query.evaluator import count_matching, evaluate

INDEX_NOT_FOUND = 27  # the server's code for "text index required for $text query"
# Failures about the caller's rights or the deployment, not about the query: never reported as a bad query.
MAX_TIME_MS_EXPIRED = 50  # the server stopped the query at maxTimeMS: the query's cost, not a transient fault
NOT_THE_QUERY = {13, 18, 8000}  # Unauthorized, AuthenticationFailed, AtlasError


def jsonable(value: Any) -> Any:
    """``value`` with ``Decimal128`` as Decimal and other BSON-only types (written by other tools) as JSON values."""
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [jsonable(item) for item in value]
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, dt.datetime):  # BSON dates come back naive, in UTC
        return canonical_time(value)
    if isinstance(value, Binary | bytes):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


class MongoQueryService(QueryService):
    def __init__(self, store, aggregate_name: str, kind: str):
        super().__init__(aggregate_name, kind)
        self.store = store
        self.connection = store.connection
        self.max_time_ms = store.max_time_ms

    @property
    def collection(self):
        # The store ensures the collection's schema once, then caches it. Queries are reads only: they
        # follow the URI's read preference (the stores always read the primary).
        return self.store.collection(self.aggregate_name).with_options(
            read_preference=self.connection.read_preference)

    @contextlib.contextmanager
    def _reading(self, collection) -> Iterator[None]:
        try:
            with recoverable_errors(f"querying {collection.name}"), self.connection.guard(collection):
                yield
        except RecoverableStoreError as exc:
            if getattr(exc.__cause__, "code", None) == MAX_TIME_MS_EXPIRED:
                raise QueryTooExpensive("MONGO_MAX_TIME_MS", self.max_time_ms) from exc.__cause__
            raise
        except pymongo_errors.OperationFailure as exc:
            if exc.code == INDEX_NOT_FOUND and "text" in str(exc):
                raise QueryValidationError(
                    "condition",
                    f"MATCH needs a text index on {collection.name}; create one, e.g. "
                    f"db.{collection.name}.createIndex({{\"$**\": \"text\"}}) (a wildcard text index)",
                ) from exc
            if exc.code in NOT_THE_QUERY:
                raise
            message = (exc.details or {}).get("errmsg") or str(exc)
            raise QueryValidationError("", f"MongoDB refused the query: {message}") from exc
        except NotImplementedError as exc:
            if not self.connection.embedded:
                raise
            raise QueryValidationError("", f"the embedded engine (mongomock) cannot run this query: {exc}") from exc
        except (bson_errors.BSONError, OverflowError) as exc:
            # A backstop: the parser refuses what BSON cannot encode, but the driver has the last word.
            raise QueryValidationError("", f"the query cannot be encoded for MongoDB: {exc}") from exc

    def _fetch(self, collection, filter_: dict, projection: dict | None, sort: list, skip: int, limit: int) -> list[dict]:
        with self._reading(collection):
            cursor = collection.find(filter_, projection, max_time_ms=self.max_time_ms)
            if sort:
                cursor = cursor.sort(sort)
            if skip:
                cursor = cursor.skip(skip)
            if limit:
                cursor = cursor.limit(limit)
            return [jsonable(doc) for doc in cursor]

    def _text_search_in_python(self, condition: Condition) -> tuple[list[dict], Condition]:
        """Embedded engine: the documents matching everything but MATCH, and the MATCH node."""
        rest, text = split_text_search(condition)
        if text is None or needs_text_search(rest):
            raise refuse_misplaced_text_search()
        collection = self.collection
        documents = self._fetch(collection, compile_filter(rest, field_map=self.field_map), None, [], 0, 0)
        return documents, text

    def _in_python(self, collection, condition: Condition) -> bool:
        """Embedded engine: whether this query runs in Python (MATCH, or Decimal128 values mongomock cannot
        compare). Never a RAW filter: it is MongoDB's own language, which only the engine runs."""
        if not self.connection.embedded:
            return False
        return needs_text_search(condition) or self._evaluate_all(collection, condition)

    def _evaluate_all(self, collection, condition: Condition) -> bool:
        return self.connection.holds_decimals(collection) and not uses_operator(condition, Operator.RAW)

    def _all_in_python(self, collection, condition: Condition) -> tuple[list[dict], Condition]:
        """Embedded engine: the documents to evaluate ``condition`` over, and the condition to evaluate.

        With Decimal128 in the collection, every document (the evaluator compares Decimals as
        MongoDB compares Decimal128); otherwise the documents matching everything but MATCH.
        """
        if not self._evaluate_all(collection, condition):
            return self._text_search_in_python(condition)
        if needs_text_search(condition):
            rest, text = split_text_search(condition)  # the same refusal of a misplaced MATCH as elsewhere
            if text is None or needs_text_search(rest):
                raise refuse_misplaced_text_search()
        return self._fetch(collection, {}, None, [], 0, 0), condition

    def find_documents(
        self, condition: Condition, *, projection: Projection, sort: tuple[SortField, ...], skip: int, limit: int
    ) -> list[dict]:
        collection = self.collection
        if self._in_python(collection, condition):
            documents, rest = self._all_in_python(collection, condition)
            return evaluate(
                documents, rest, field_map=self.field_map, projection=projection, sort=sort, skip=skip, limit=limit
            )
        return self._fetch(
            collection,
            compile_filter(condition, field_map=self.field_map),
            compile_projection(projection, field_map=self.field_map),
            compile_sort(sort, field_map=self.field_map),
            skip,
            limit,
        )

    def count_documents(self, condition: Condition) -> int:
        collection = self.collection
        if self._in_python(collection, condition):
            documents, rest = self._all_in_python(collection, condition)
            return count_matching(documents, rest, field_map=self.field_map)
        with self._reading(collection):
            return collection.count_documents(
                compile_filter(condition, field_map=self.field_map), maxTimeMS=self.max_time_ms
            )


class MongoSnapshotQueryService(MongoQueryService):
    """Queries over ``{aggregateName}_snapshot`` through a ``MongoSnapshotStore``."""

    def __init__(self, store, aggregate_name: str):
        super().__init__(store, aggregate_name, SNAPSHOT)


class MongoEventStreamQueryService(MongoQueryService):
    """Queries over ``{aggregateName}_event_stream`` through a ``MongoEventStore``."""

    def __init__(self, store, aggregate_name: str):
        super().__init__(store, aggregate_name, EVENT_STREAM)

    def find_documents(self, condition: Condition, **kwargs) -> list[dict]:
        documents = super().find_documents(condition, **kwargs)
        for document in documents:
            # The followers' global position is storage bookkeeping, not part of Wow's stream document
            # (the django backend keeps it in a column of its own and never shows it either).
            document.pop("position", None)
        return documents

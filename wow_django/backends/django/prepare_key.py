"""PrepareKey on the Django ORM: ``wow_prepare_key`` rows (DESIGN part D).

Every operation is one conditional statement; the number of rows it changed
is the answer. Expiry is judged inside the statement by ``ttl_at`` against the
store's clock (the real one unless a ``clock`` is given), never the server's
time, so an expired reservation needs no clean-up to be free again:

* ``prepare``: ``INSERT … ON CONFLICT (name, key) DO UPDATE … WHERE ttl_at <= now``
  inserts a free key or takes over an expired reservation; a live one wins
  (no row changed). Concurrent prepares queue on the unique index: one wins.
* ``rollback``: ``DELETE … WHERE ttl_at > now [AND value = old]``.
* ``reprepare``: ``UPDATE … WHERE ttl_at > now [AND value = old]``.

Values compare as JSON: ``jsonb`` equality on PostgreSQL, the canonical text
(sorted keys, no spaces) on SQLite, where 1 and 1.0 therefore differ.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from wow_django.backends.django.connection import database, prepare_database
from wow_django.backends.django.errors import store_errors
from wow_django.backends.django.meta import concrete_field
from wow_django.backends.django.models import CanonicalJSONEncoder, PrepareKeyRow
from wow_django.persistence.contracts import (
    NOT_GIVEN,
    Clock,
    PrepareKey,
    check_key,
    from_micros,
    resolve_ttl,
    to_micros,
)
from wow_django.persistence.records import PreparedValue


class DjangoPrepareKey(PrepareKey):
    """The reservations of PrepareKey store ``name`` in ``wow_prepare_key`` of database ``using``."""

    def __init__(self, name: str, using: str = "default", *, clock: Clock | None = None):
        super().__init__(name, clock=clock)
        connection = prepare_database(using)
        self.using = using
        quote = connection.ops.quote_name
        meta = PrepareKeyRow._meta
        table = quote(meta.db_table)
        name_, key, value, ttl_at = (quote(concrete_field(PrepareKeyRow, f).column)
                                     for f in ("name", "key", "value", "ttl_at"))
        live = f"{name_} = %s AND {key} = %s AND {ttl_at} > %s"
        self._prepare_sql = (
            f"INSERT INTO {table} ({name_}, {key}, {value}, {ttl_at}) VALUES (%s, %s, %s, %s) "
            f"ON CONFLICT ({name_}, {key}) DO UPDATE SET {value} = excluded.{value}, {ttl_at} = excluded.{ttl_at} "
            f"WHERE {table}.{ttl_at} <= %s"
        )
        self._rollback_sql = f"DELETE FROM {table} WHERE {live}"
        self._reprepare_sql = f"UPDATE {table} SET {value} = %s, {ttl_at} = %s WHERE {live}"
        self._value_sql = f" AND {value} = %s"

    def _rows(self):
        return PrepareKeyRow.objects.using(self.using).filter(name=self.name)

    def _execute(self, action: str, sql: str, params: list) -> int:
        connection = database(self.using)
        with store_errors(connection, f"{action} {self.name} key"):
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.rowcount

    def _json(self, value: Any):
        # JSON null is stored as JSON, not as SQL NULL, so that it compares equal to itself.
        return database(self.using).ops.adapt_json_value(value, CanonicalJSONEncoder)

    def prepare(self, key: str, value: Any, ttl: timedelta | datetime | None = None) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = resolve_ttl(ttl, now)
        params = [self.name, key, self._json(value), to_micros(ttl_at), to_micros(now)]
        return self._execute("preparing", self._prepare_sql, params) == 1

    def get(self, key: str) -> PreparedValue | None:
        check_key(key)
        rows = self._rows().filter(key=key, ttl_at__gt=to_micros(self.now())).values_list("value", "ttl_at")
        connection = database(self.using)
        with store_errors(connection, f"reading {self.name} key"):
            found = list(rows[:1])
        if not found:
            return None
        value, ttl_at = found[0]
        return PreparedValue(value, from_micros(ttl_at))

    def rollback(self, key: str, value: Any = NOT_GIVEN) -> bool:
        check_key(key)
        sql, params = self._rollback_sql, [self.name, key, to_micros(self.now())]
        if value is not NOT_GIVEN:
            sql, params = sql + self._value_sql, [*params, self._json(value)]
        return self._execute("rolling back", sql, params) == 1

    def reprepare(
        self, key: str, new_value: Any, *, old_value: Any = NOT_GIVEN, ttl: timedelta | datetime | None = None
    ) -> bool:
        check_key(key)
        now = self.now()
        ttl_at = resolve_ttl(ttl, now)
        sql = self._reprepare_sql
        params = [self._json(new_value), to_micros(ttl_at), self.name, key, to_micros(now)]
        if old_value is not NOT_GIVEN:
            sql, params = sql + self._value_sql, [*params, self._json(old_value)]
        return self._execute("repreparing", sql, params) == 1

"""The bus records in the project's SQL database through the Django ORM (PostgreSQL, SQLite).

The tables are the models of :mod:`wow_django.backends.django.bus_models`
(app ``wow_bus``: ``wow_django.bus`` in ``INSTALLED_APPS``, its migrations
applied). The promises are the Mongo store's, with SQL doing the work:

- every conditional write is one ``UPDATE … WHERE <condition>`` (or ``DELETE``)
  and its row count says whether it happened; counters move with ``F()``.
  PostgreSQL re-checks the condition of a waiting ``UPDATE`` on the row a
  concurrent writer committed, SQLite runs writes one at a time: of two
  writers whose condition holds, exactly one wins;
- "exists already" is the unique constraint's answer: an insert that hits it
  raises IntegrityError, confirmed by reading the key (so that another
  constraint's error is not taken for a duplicate);
- a write that returns the record (relay lease, re-push claim, topic consumer)
  reads it back in the same transaction, while its write lock holds the row.

Records are dicts as the other backends give them (seed-004 camelCase keys,
naive-UTC datetimes at millisecond precision, keys the record never had stay
absent; see ``bus_models``). Values the record keeps in a column must fit it
(a datetime for a time, an int for a count, a string for an id) and get a
TypeError naming the key otherwise; JSON parts (``payload``, ``initiator``,
``consumers``, keys without a column) keep dicts, lists, strings, numbers,
booleans, None and datetimes. Text is ordered by code point, as in MongoDB
and Python (``COLLATE "C"`` on PostgreSQL).

As every store of the backend, it works on the calling thread's connection of
:func:`~wow_django.backends.django.connection.database` (closed when a worker
thread ends; SQLite in WAL mode with a busy timeout) and maps database errors
with :func:`~wow_django.backends.django.errors.store_errors`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, overload

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, models, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce, Collate

from wow_django.backends.django.bus_models import (
    ID_LENGTH,
    KEY_LENGTH,
    ConsumptionRecord,
    EventKeyRecord,
    EventRecord,
    InboxEntry,
    RecordFields,
    RepushRecord,
    SequenceRecord,
    TopicConsumerRecord,
)
from wow_django.backends.django.connection import database, prepare_database
from wow_django.backends.django.errors import store_errors
from wow_django.backends.django.meta import concrete_field
from wow_django.persistence.bus import (
    SEARCH_KEYS,
    STATUS_REVISION,
    BusStore,
    EventQuery,
    EventStatus,
    check_revision,
    to_bson_time,
    utcnow,
)

BUS_APP = "wow_django.bus"
PENDING = EventStatus.PENDING.value
SENT = EventStatus.SENT.value
RETRYING = EventStatus.RETRYING.value
PROCESSING = "processing"
DONE = "done"
IN_CHUNK = 500  # event ids per "IN (…)" (SQLite limits the parameters of a statement)

# --- values: records ↔ columns ------------------------------------------------------------

DATE_TAG = "$date"
LITERAL_TAG = "$literal"
_TAGS = frozenset({DATE_TAG, LITERAL_TAG})
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def db_time(moment: datetime) -> datetime:
    """``moment`` as the database keeps it: UTC at millisecond precision, aware when ``USE_TZ`` is on."""
    moment = to_bson_time(moment)
    return moment.replace(tzinfo=UTC) if settings.USE_TZ else moment


def record_time(moment: datetime | None) -> datetime | None:
    """A datetime read from the database as the records have it: naive UTC."""
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


def to_json(value: Any, where: str) -> Any:
    """``value`` as JSON: tuples become lists, enum members their values, datetimes ``{"$date": iso}``.

    A dict whose only key is ``$date`` or ``$literal`` is wrapped in ``{"$literal": …}`` so that it
    reads back as itself.
    """
    kind = type(value)
    if kind in _JSON_SCALARS:
        return value
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: JSON keys are strings, got {key!r}")
            encoded[str.__str__(key)] = to_json(item, where)
        if len(encoded) == 1 and next(iter(encoded)) in _TAGS:
            return {LITERAL_TAG: encoded}
        return encoded
    if isinstance(value, (list, tuple)):
        return [to_json(item, where) for item in value]
    if isinstance(value, datetime):
        return {DATE_TAG: to_bson_time(value).isoformat(timespec="milliseconds")}
    if isinstance(value, enum.Enum):
        return to_json(value.value, where)
    for base in (str, int, float):
        if isinstance(value, base):
            return base(value)
    raise TypeError(f"{where} holds a {kind.__name__}; the django bus store keeps JSON values, datetimes and "
                    f"enum members")


def from_json(value: Any) -> Any:
    """The value :func:`to_json` was given (tuples and enum members read back as lists and values)."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, item),) = value.items()
            if key == DATE_TAG and isinstance(item, str):
                return datetime.fromisoformat(item)
            if key == LITERAL_TAG and isinstance(item, dict):
                return {k: from_json(v) for k, v in item.items()}
        return {key: from_json(item) for key, item in value.items()}
    return value


@overload
def text(value: str, where: str) -> str: ...
@overload
def text(value: object, where: str) -> str | None: ...
def text(value: Any, where: str) -> str | None:
    """A string for a text column (an enum member is its value)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a string or None, got {type(value).__name__}")
    return str.__str__(value)


def _column_kind(field: models.Field) -> str:
    if isinstance(field, models.JSONField):
        return "json"
    if isinstance(field, models.DateTimeField):
        return "time"
    if isinstance(field, models.BooleanField):
        return "bool"
    if isinstance(field, models.IntegerField):
        return "int"
    return "text"


def to_column(kind: str, value: Any, where: str) -> Any:
    if kind == "json":
        return to_json(value, where)
    if kind == "text":
        return text(value, where)
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return None
    if kind == "time":
        if not isinstance(value, datetime):
            raise TypeError(f"{where} must be a datetime or None, got {type(value).__name__}")
        return db_time(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{where} must be true, false or None, got {type(value).__name__}")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be an integer or None, got {type(value).__name__}")
    return int(value)


def from_column(kind: str, value: Any) -> Any:
    if kind == "json":
        return from_json(value)
    if kind == "time":
        return record_time(value)
    return value


class Layout:
    """How the records of one table map to its columns: ``RECORD_KEYS`` in columns, the rest in ``extra``."""

    def __init__(self, model: type[RecordFields], what: str, required: tuple[str, ...]):
        self.model = model
        self.what = what
        self.required = required
        self.keys = model.RECORD_KEYS
        self.kinds = {key: _column_kind(concrete_field(model, key)) for key in self.keys}
        self.bits = {key: 1 << index for index, key in enumerate(self.keys)}
        self.full = (1 << len(self.keys)) - 1
        self.fields = (*self.keys, "absent", "extra")

    def columns(self, record: dict) -> dict:
        """The model's field values for ``record``."""
        missing = [key for key in self.required if record.get(key) is None]
        if missing:
            raise ValueError(f"a {self.what} record needs {', '.join(map(repr, missing))}")
        where = f"{self.what} {record[self.required[0]]!r}"
        values: dict[str, Any] = {}
        absent = 0
        for key in self.keys:
            if key in record:
                values[key] = to_column(self.kinds[key], record[key], f"{where}: {key!r}")
            else:
                absent |= self.bits[key]
        values["absent"] = absent
        values["extra"] = {str.__str__(key): to_json(value, f"{where}: {key!r}")
                           for key, value in record.items() if key not in self.kinds}
        return values

    def record(self, row: dict) -> dict:
        """The record of a row read with ``values(*self.fields)`` (or some of the keys, absent and extra)."""
        absent = row["absent"]
        found = {key: from_column(self.kinds[key], row[key])
                 for key in self.keys if key in row and not absent & self.bits[key]}
        if row["extra"]:
            found.update(from_json(row["extra"]))
        return found

    def absent_after(self, written: Iterable[str] = (), removed: Iterable[str] = ()) -> Any:
        """The ``absent`` of an update that writes the keys ``written`` and removes ``removed``."""
        expression: Any = F("absent")
        written_bits = sum(self.bits[key] for key in written)
        removed_bits = sum(self.bits[key] for key in removed)
        if written_bits:
            expression = expression.bitand(self.full & ~written_bits)
        if removed_bits:
            expression = expression.bitor(removed_bits)
        return expression


EVENTS = Layout(EventRecord, "event", ("eventId",))
CONSUMPTIONS = Layout(ConsumptionRecord, "feedback", ("eventId", "consumerId", "attemptNo"))
REPUSHES = Layout(RepushRecord, "re-push", ("eventId",))
TOPIC_CONSUMER_FIELDS = TopicConsumerRecord.RECORD_KEYS



def next_revision() -> Any:
    """``statusRevision`` + 1, an event without one being at 0."""
    return Coalesce(F(STATUS_REVISION), Value(0), output_field=models.BigIntegerField()) + 1


def revision_is(revision: int) -> Q:
    """The condition of a ``statusRevision``: revision 0 is also an event without one."""
    if check_revision(revision) == 0:
        return Q(statusRevision__isnull=True) | Q(statusRevision=0)
    return Q(statusRevision=revision)


def event_filter(query: EventQuery) -> Q:
    """The condition of an :class:`EventQuery`."""
    found = Q()
    statuses = query.statuses
    if statuses is not None:
        found &= (Q(status=text(statuses[0], "status")) if len(statuses) == 1
                  else Q(status__in=[text(status, "status") for status in statuses]))
    if query.topic is not None:
        found &= Q(topic=query.topic)
    if query.service is not None:
        found &= Q(initiatorService=query.service)
    if query.user_id is not None:
        found &= Q(initiatorUserId=query.user_id)
    if query.client_request_id is not None:
        found &= Q(initiatorRequestId=query.client_request_id)
    if query.trace_id is not None:
        found &= Q(traceId=query.trace_id)
    if query.since is not None:
        found &= Q(occurredAt__gte=db_time(query.since))
    if query.until is not None:
        found &= Q(occurredAt__lt=db_time(query.until))
    if query.sent_before is not None:
        found &= Q(lastSentAt__lte=db_time(query.sent_before))
    if query.keys is not None:  # wow_bus_event_key_listing
        keys = [key for key in query.keys if len(key) <= KEY_LENGTH]  # a longer one is stored by no event
        found &= Q(eventId__in=EventKeyRecord.objects.filter(key__in=keys).values("eventId"))
    return found


def search_keys(document: dict) -> list[str]:
    """The search keys of an event document, each once (a text longer than the column is refused: the
    envelope never makes one)."""
    keys = document.get(SEARCH_KEYS)
    if keys is None:
        return []
    if not isinstance(keys, list) or not all(isinstance(key, str) and len(key) <= KEY_LENGTH for key in keys):
        raise TypeError(f"{SEARCH_KEYS}: a list of texts of at most {KEY_LENGTH} characters, got {keys!r}")
    return list(dict.fromkeys(keys))


#: The initiator's fields the listing filters on, each copied into a column of its own on insert.
INITIATOR_COLUMNS = {"initiatorService": "service", "initiatorUserId": "userId",
                     "initiatorRequestId": "clientRequestId"}


def initiator_columns(initiator: object) -> dict:
    """The initiator columns of an event: None where the initiator has no text for one, or text longer than
    the column (the JSON keeps it; the filter cannot find it)."""
    fields = initiator if isinstance(initiator, dict) else {}
    return {column: str.__str__(fields[key]) if isinstance(fields.get(key), str) and len(fields[key]) <= ID_LENGTH
            else None for column, key in INITIATOR_COLUMNS.items()}


def _topic_consumer(row: dict) -> dict:
    return {key: record_time(row[key]) if key in ("createdAt", "updatedAt") else row[key]
            for key in TOPIC_CONSUMER_FIELDS}


class DjangoBusStore(BusStore):
    """The bus store on the Django database ``using`` (an alias of ``DATABASES``)."""

    def __init__(self, using: str = "default"):
        if not apps.is_installed(BUS_APP):
            raise ImproperlyConfigured(
                f"The django bus store keeps the bus records in the tables of the {BUS_APP} app: add "
                f"{BUS_APP!r} to INSTALLED_APPS and run `manage.py migrate wow_bus`."
            )
        self.using = using
        self.vendor = prepare_database(using).vendor

    def __repr__(self) -> str:
        return f"DjangoBusStore(using={self.using!r})"

    # --- helpers -------------------------------------------------------------------------------

    def rows(self, model: type[models.Model]) -> models.QuerySet:
        return model._default_manager.using(self.using)

    def errors(self, action: str):
        """Map the database errors of one operation; its queries run on this thread's connection."""
        return store_errors(database(self.using), action)

    def atomic(self):
        return transaction.atomic(using=self.using)

    def text_order(self, field: str) -> Any:
        """Ordering by a text column in code-point order (PostgreSQL's default collation may differ)."""
        return (Collate(F(field), "C") if self.vendor == "postgresql" else F(field)).asc()

    def time_order(self, field: str, *, descending: bool = False) -> Any:
        """Ordering by a time column where a missing time is the smallest, as in MongoDB (SQLite's own order)."""
        if self.vendor == "sqlite":  # it sorts NULL before any value
            return F(field).desc() if descending else F(field).asc()
        return F(field).desc(nulls_last=True) if descending else F(field).asc(nulls_first=True)

    def insert_unique(self, model: type[models.Model], values: dict, key: dict) -> bool:
        """Insert a row; False when the unique ``key`` is taken (the insert changed nothing)."""
        try:
            with self.atomic():
                self.rows(model).create(**values)
        except IntegrityError:
            if self.rows(model).filter(**key).exists():
                return False
            raise  # another constraint
        return True

    @staticmethod
    def first(queryset: models.QuerySet) -> Any:
        return next(iter(queryset[:1]), None)

    # --- topic consumers ---------------------------------------------------------

    def enabled_consumers(self, topic: str) -> list[str]:
        with self.errors(f"reading consumers of {topic}"):
            found = set(self.rows(TopicConsumerRecord).filter(topic=topic, enabled=True)
                        .values_list("consumerId", flat=True))
        return sorted(found)

    def set_topic_consumer(self, topic: str, consumer_id: str, *, enabled: bool, description: str | None,
                           updated_by: str | None) -> dict:
        topic, consumer_id = text(topic, "topic"), text(consumer_id, "consumerId")
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be true or false, got {type(enabled).__name__}")
        now = db_time(utcnow())
        changes: dict[str, Any] = {"enabled": enabled, "updatedAt": now,
                                   "updatedBy": text(updated_by, "updatedBy")}
        if description is not None:
            changes["description"] = text(description, "description")
        key = {"topic": topic, "consumerId": consumer_id}
        with self.errors(f"saving topic consumer {topic}/{consumer_id}"), self.atomic():
            # Create the record if there is none (a concurrent creation wins: nothing happens), then set
            # what this call sets; the transaction holds the row until the record is read back.
            self.rows(TopicConsumerRecord).bulk_create([TopicConsumerRecord(
                **key, description="" if description is None else changes["description"], createdAt=now,
                **{k: v for k, v in changes.items() if k != "description"})], ignore_conflicts=True)
            self.rows(TopicConsumerRecord).filter(**key).update(**changes)
            row = self.first(self.rows(TopicConsumerRecord).filter(**key).values(*TOPIC_CONSUMER_FIELDS))
        return _topic_consumer(row)

    def list_topic_consumers(self, *, topic: str | None = None, consumer_id: str | None = None) -> list[dict]:
        found = self.rows(TopicConsumerRecord).all()
        if topic:
            found = found.filter(topic=topic)
        if consumer_id:
            found = found.filter(consumerId=consumer_id)
        with self.errors("listing topic consumers"):
            records = [_topic_consumer(row) for row in found.values(*TOPIC_CONSUMER_FIELDS)]
        records.sort(key=lambda r: (r["topic"], r["consumerId"]))
        return records

    # --- events ------------------------------------------------------------------------

    def events(self) -> models.QuerySet:
        return self.rows(EventRecord)

    def insert_event(self, document: dict) -> bool:
        values = EVENTS.columns(document)
        values.update(initiator_columns(document.get("initiator")))
        event_id = values["eventId"]
        keys = search_keys(document)
        with self.errors(f"storing event {event_id}"):
            if not keys:
                return self.insert_unique(EventRecord, values, {"eventId": event_id})
            with self.atomic():  # the event and its keys, or neither
                if not self.insert_unique(EventRecord, values, {"eventId": event_id}):
                    return False
                self.rows(EventKeyRecord).bulk_create([
                    EventKeyRecord(eventId=event_id, key=key, occurredAt=values.get("occurredAt")) for key in keys])
            return True

    def insert_event_with_consumptions(self, document: dict, now: datetime) -> bool:
        event_id = document.get("eventId")
        with self.errors(f"storing event {event_id}"), self.atomic():  # one transaction, one commit
            if not self.insert_event(document):
                return False
            self.init_consumptions(document["eventId"], document.get("consumers") or (), now)
        return True

    def get_events(self, event_ids: Iterable[str], fields: Iterable[str] | None = None) -> dict[str, dict]:
        ids = list(dict.fromkeys(event_ids))
        wanted = None if fields is None else list(dict.fromkeys(fields))
        columns = (list(EVENTS.fields) if wanted is None
                   else [*(key for key in EVENTS.keys if key in wanted or key == "eventId"), "absent", "extra"])
        rows: list[dict] = []
        with self.errors("reading events"):
            for start in range(0, len(ids), IN_CHUNK):
                rows.extend(self.events().filter(eventId__in=ids[start:start + IN_CHUNK]).values(*columns))
        found: dict[str, dict] = {}
        for row in rows:
            record = EVENTS.record(row)
            found[row["eventId"]] = record if wanted is None else {
                field: record[field] for field in wanted if field in record}
        return found

    def read_event(self, event_id: str) -> dict | None:
        row = self.first(self.events().filter(eventId=event_id).values(*EVENTS.fields))
        return None if row is None else EVENTS.record(row)

    def get_event(self, event_id: str, fields: Iterable[str] | None = None) -> dict | None:
        if fields is not None:
            return self.get_events([event_id], fields).get(event_id)
        with self.errors(f"reading event {event_id}"):
            return self.read_event(event_id)

    def mark_sent(self, event_id: str, sent_at: datetime) -> bool:
        sent_at = db_time(sent_at)
        with self.errors(f"marking {event_id} sent"):
            if self.events().filter(eventId=event_id, status=PENDING).update(
                    status=SENT, statusAt=sent_at, sentAt=sent_at, lastSentAt=sent_at, lastError=None,
                    statusRevision=next_revision(), relayLeaseUntil=None,
                    absent=EVENTS.absent_after(("status", "statusAt", "sentAt", "lastSentAt", "lastError",
                                                STATUS_REVISION), ("relayLeaseUntil",))):
                return True
            # Feedback was faster than this update (the rollup already moved it on):
            # record the send time, leave the status alone.
            self.events().filter(eventId=event_id, sentAt__isnull=True).update(
                sentAt=sent_at, lastSentAt=sent_at, absent=EVENTS.absent_after(("sentAt", "lastSentAt")))
        return False

    def record_send_error(self, event_id: str, error: str) -> None:
        with self.errors(f"recording send error of {event_id}"):
            self.events().filter(eventId=event_id).update(
                lastError=error[:2000], relayLeaseUntil=None,
                absent=EVENTS.absent_after(("lastError",), ("relayLeaseUntil",)))

    def stale_pending(self, older_than: datetime, limit: int) -> list[str]:
        if limit <= 0:
            return []
        with self.errors("finding pending events"):
            return list(self.events().filter(status=PENDING, statusAt__lte=db_time(older_than))
                        .order_by(self.time_order("occurredAt"), self.text_order("eventId"))
                        .values_list("eventId", flat=True)[:limit])

    def purge_events(self, *, consumed_before: datetime | None, expired_before: datetime | None,
                     limit: int) -> list[str]:
        if limit <= 0 or (consumed_before is None and expired_before is None):
            return []
        rules = Q()
        if consumed_before is not None:  # served by wow_bus_event_status_at
            rules |= Q(status=EventStatus.CONSUMED.value, statusAt__lte=db_time(consumed_before))
        if expired_before is not None:  # served by wow_bus_event_expire_at
            rules |= Q(expireAt__lte=db_time(expired_before))
        with self.errors("finding events to purge"):
            candidates = list(self.events().filter(rules).order_by("statusAt", self.text_order("eventId"))
                              .values_list("eventId", flat=True)[:limit])
        deleted = []
        for event_id in candidates:
            # One transaction per event, opened by its (conditional) delete: an event re-pushed since it was
            # listed is kept with its history, and no transaction reads before it writes (SQLite cannot
            # upgrade a reading transaction that another writer overtook).
            with self.errors(f"purging {event_id}"), self.atomic():
                if self.events().filter(rules, eventId=event_id).delete()[0]:
                    for model in (ConsumptionRecord, InboxEntry, RepushRecord, EventKeyRecord):
                        self.rows(model).filter(eventId=event_id).delete()
                    deleted.append(event_id)
        return deleted

    def lease_for_relay(self, event_id: str, now: datetime, until: datetime) -> dict | None:
        now, until = db_time(now), db_time(until)
        with self.errors(f"leasing {event_id} for the relay"), self.atomic():
            if not self.events().filter(
                    Q(relayLeaseUntil__isnull=True) | Q(relayLeaseUntil__lte=now), eventId=event_id,
                    status=PENDING).update(relayLeaseUntil=until,
                                           absent=EVENTS.absent_after(("relayLeaseUntil",))):
                return None
            return self.read_event(event_id)

    def claim_repush(self, event_id: str, *, now: datetime, max_count: int, statuses: Iterable[str],
                     sent_before: datetime) -> dict | None:
        now, sent_before = db_time(now), db_time(sent_before)
        statuses = [text(status, "statuses") for status in statuses]
        allowed = (Q(eventId=event_id, retryCount__lt=max_count)
                   & (Q(status__in=statuses) | Q(status=SENT, lastSentAt__lte=sent_before))
                   & (Q(expireAt__isnull=True) | Q(expireAt__gt=now)))
        with self.errors(f"claiming a re-push of {event_id}"), self.atomic():
            if not self.events().filter(allowed).update(
                    retryCount=F("retryCount") + 1, statusRevision=next_revision(), lastSentAt=now,
                    status=RETRYING, statusAt=now,
                    absent=EVENTS.absent_after(("retryCount", STATUS_REVISION, "lastSentAt", "status",
                                                "statusAt"))):
                return None
            return self.read_event(event_id)

    def set_status_if(self, event_id: str, expected_status: str, expected_revision: int, status: str,
                      now: datetime) -> bool:
        unchanged = revision_is(expected_revision) & Q(eventId=event_id,
                                                        status=text(expected_status, "expected_status"))
        status, now = text(status, "status"), db_time(now)
        with self.errors(f"rolling up {event_id}"):
            return bool(self.events().filter(unchanged).update(
                status=status, statusAt=now, statusRevision=next_revision(),
                absent=EVENTS.absent_after(("status", "statusAt", STATUS_REVISION))))

    #: Unfiltered, a PostgreSQL table past this many rows (by the planner's estimate) is counted by that
    #: estimate: an exact count reads every row on each page. Smaller tables, filters and SQLite count exactly.
    ESTIMATE_COUNT_OVER = 100_000

    def _estimated_events(self) -> int | None:
        """The planner's row estimate of the events table on PostgreSQL (None elsewhere, or unknown)."""
        if self.vendor != "postgresql":
            return None
        connection = database(self.using)
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                           [EventRecord._meta.db_table])
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None

    def find_events(self, query: EventQuery, *, skip: int, limit: int) -> tuple[int, list[dict]]:
        condition = event_filter(query)
        found = self.events().filter(condition)
        with self.errors("listing events"):
            estimate = self._estimated_events() if not condition else None
            total = estimate if estimate is not None and estimate > self.ESTIMATE_COUNT_OVER else found.count()
            if limit <= 0 or skip >= total:
                return total, []
            rows = list(found.order_by(self.time_order("occurredAt", descending=True), self.text_order("eventId"))
                        .values(*EVENTS.fields)[skip:skip + limit])
        return total, [EVENTS.record(row) for row in rows]

    def events_after(self, query: EventQuery, *, after: tuple[datetime, str] | None, limit: int) -> list[dict]:
        if limit <= 0:
            return []
        found = event_filter(query) & Q(occurredAt__isnull=False)
        if after is not None:
            # "At or before the key's time, less the key's own time up to its id": a range the listing
            # index seeks to (an OR of the two cases would scan it from the start).
            moment, event_id = db_time(after[0]), after[1]
            up_to_id = (Q(eventId__lte=Collate(Value(event_id), "C")) if self.vendor == "postgresql"
                        else Q(eventId__lte=event_id))
            found &= Q(occurredAt__lte=moment) & ~(Q(occurredAt=moment) & up_to_id)
        with self.errors("listing events"):
            rows = list(self.events().filter(found)
                        .order_by(self.time_order("occurredAt", descending=True), self.text_order("eventId"))
                        .values(*EVENTS.fields)[:limit])
        return [EVENTS.record(row) for row in rows]

    def count_events(self, query: EventQuery, *, up_to: int) -> int:
        if up_to <= 0:
            return 0
        with self.errors("counting events"):  # SELECT COUNT(*) FROM (SELECT … LIMIT up_to)
            return self.events().filter(event_filter(query))[:up_to].count()

    def events_before(self, query: EventQuery, *, before: tuple[datetime, str], limit: int) -> list[dict]:
        if limit <= 0:
            return []
        moment, event_id = db_time(before[0]), before[1]
        from_id = (Q(eventId__gte=Collate(Value(event_id), "C")) if self.vendor == "postgresql"
                   else Q(eventId__gte=event_id))
        found = (event_filter(query) & Q(occurredAt__isnull=False) & Q(occurredAt__gte=moment)
                 & ~(Q(occurredAt=moment) & from_id))
        text_desc = (Collate(F("eventId"), "C") if self.vendor == "postgresql" else F("eventId")).desc()
        with self.errors("listing events"):
            # The listing index read backwards from the key (the nearest first), then put back in its order.
            time_asc = F("occurredAt").asc(nulls_first=True) if self.vendor == "postgresql" else F("occurredAt").asc()
            rows = list(self.events().filter(found).order_by(time_asc, text_desc)
                        .values(*EVENTS.fields)[:limit])
        return [EVENTS.record(row) for row in reversed(rows)]

    def in_time_order(self, condition: Q, limit: int, action: str) -> list[dict]:
        if limit <= 0:
            return []
        with self.errors(action):
            rows = list(self.events().filter(condition)
                        .order_by(self.time_order("occurredAt"), self.text_order("eventId"))
                        .values(*EVENTS.fields)[:limit])
        return [EVENTS.record(row) for row in rows]

    def trace_events(self, trace_id: str, limit: int) -> list[dict]:
        return self.in_time_order(Q(traceId=trace_id), limit, f"reading trace {trace_id}")

    def children(self, event_id: str, limit: int) -> list[dict]:
        return self.in_time_order(Q(parentEventId=event_id), limit, f"reading children of {event_id}")

    # --- consumptions ------------------------------------------------------------------

    def consumptions(self) -> models.QuerySet:
        return self.rows(ConsumptionRecord)

    def init_consumptions(self, event_id: str, consumers: Iterable[str], now: datetime) -> None:
        rows = [ConsumptionRecord(**CONSUMPTIONS.columns({
            "eventId": event_id, "consumerId": consumer, "attemptNo": 0, "success": None, "consumedAt": None,
            "error": None, "source": "send", "createdAt": now})) for consumer in consumers]
        if not rows:
            return
        with self.errors(f"initialising feedback of {event_id}"):
            # Rows that exist already (a relay after a crash) are kept.
            self.consumptions().bulk_create(rows, ignore_conflicts=True)

    def latest_consumption(self, event_id: str, consumer_id: str) -> dict | None:
        with self.errors(f"reading feedback of {event_id}"):
            row = self.first(self.consumptions().filter(eventId=event_id, consumerId=consumer_id)
                             .order_by("-attemptNo").values(*CONSUMPTIONS.fields))
        return None if row is None else CONSUMPTIONS.record(row)

    def latest_consumptions(self, event_id: str) -> dict[str, dict]:
        latest: dict[str, dict] = {}
        for row in self.consumption_rows([event_id]):  # ascending attemptNo: the last one per consumer wins
            latest[row["consumerId"]] = row
        return latest

    def consumption_rows(self, event_ids: Iterable[str]) -> list[dict]:
        ids = sorted(set(event_ids))
        rows: list[dict] = []
        with self.errors("reading feedback"):
            for start in range(0, len(ids), IN_CHUNK):
                rows.extend(self.consumptions().filter(eventId__in=ids[start:start + IN_CHUNK])
                            .values(*CONSUMPTIONS.fields))
        records = [CONSUMPTIONS.record(row) for row in rows]
        records.sort(key=lambda r: (r["eventId"], r["consumerId"], r["attemptNo"]))  # code-point order
        return records

    def consumer_feedback(self, consumer_id: str, *, success: bool | None = None,
                          after: tuple[datetime, str, int] | None = None, limit: int) -> list[dict]:
        if limit <= 0:
            return []
        found = Q(consumerId=text(consumer_id, "consumerId")) & Q(consumedAt__isnull=False)
        if success is not None:
            found &= Q(success=bool(success))
        if after is not None:
            # A range of the (consumerId, consumedAt DESC) index, less the rows at the key's time up to the key.
            moment, event_id, attempt_no = db_time(after[0]), after[1], after[2]
            key = Collate(Value(event_id), "C") if self.vendor == "postgresql" else Value(event_id)
            found &= Q(consumedAt__lte=moment) & ~(Q(consumedAt=moment) & (
                Q(eventId__lt=key) | (Q(eventId=event_id) & Q(attemptNo__gte=attempt_no))))
        with self.errors(f"reading the feedback of {consumer_id}"):
            rows = list(self.consumptions().filter(found)
                        .order_by(F("consumedAt").desc(), self.text_order("eventId"), F("attemptNo").desc())
                        .values(*CONSUMPTIONS.fields)[:limit])
        return [CONSUMPTIONS.record(row) for row in rows]

    def insert_attempt(self, row: dict) -> bool:
        values = CONSUMPTIONS.columns(row)
        key = {name: values[name] for name in ("eventId", "consumerId", "attemptNo")}
        with self.errors(f"recording feedback of {key['eventId']}"):
            return self.insert_unique(ConsumptionRecord, values, key)

    # --- inbox -----------------------------------------------------------------------------

    def inbox(self, consumer_id: str, event_id: str) -> models.QuerySet:
        return self.rows(InboxEntry).filter(consumerId=consumer_id, eventId=event_id)

    def inbox_insert(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                     lease_until: datetime) -> bool:
        key = {"consumerId": text(consumer_id, "consumerId"), "eventId": text(event_id, "eventId")}
        values = {**key, "state": PROCESSING, "owner": text(owner, "owner"), "leaseUntil": db_time(lease_until),
                  "claimedAt": db_time(now)}
        with self.errors(f"claiming {event_id}"):
            return self.insert_unique(InboxEntry, values, key)

    def inbox_take_over(self, consumer_id: str, event_id: str, *, owner: str, now: datetime,
                        lease_until: datetime) -> bool:
        now = db_time(now)
        with self.errors(f"taking over {event_id}"):
            return bool(self.inbox(consumer_id, event_id).filter(state=PROCESSING, leaseUntil__lte=now).update(
                owner=owner, leaseUntil=db_time(lease_until), claimedAt=now))

    def inbox_state(self, consumer_id: str, event_id: str) -> str | None:
        with self.errors(f"reading inbox of {event_id}"):
            return self.first(self.inbox(consumer_id, event_id).values_list("state", flat=True))

    def inbox_done(self, consumer_id: str, event_id: str, *, owner: str, now: datetime) -> bool:
        with self.errors(f"completing {event_id}"):
            return bool(self.inbox(consumer_id, event_id).filter(owner=owner).update(
                state=DONE, doneAt=db_time(now), leaseUntil=None))

    def inbox_release(self, consumer_id: str, event_id: str, *, owner: str) -> None:
        with self.errors(f"releasing {event_id}"):
            held = self.inbox(consumer_id, event_id).filter(owner=owner, state=PROCESSING)
            # One DELETE … WHERE with the condition. QuerySet.delete() may select the rows first and
            # delete them by id (when a delete signal has receivers), which would drop the condition.
            held._raw_delete(self.using)

    # --- sequences -------------------------------------------------------------------------
    # A sequence row is never deleted (NULL: none stored): once it exists, one conditional
    # UPDATE decides. A first writer creates it with INSERT … ON CONFLICT DO NOTHING first.

    def sequence_of(self, consumer_id: str, partition_key: str) -> models.QuerySet:
        return self.rows(SequenceRecord).filter(consumerId=consumer_id, partitionKey=partition_key)

    def ensure_sequence_row(self, consumer_id: str, partition_key: str, now: datetime) -> None:
        self.rows(SequenceRecord).bulk_create([SequenceRecord(
            consumerId=text(consumer_id, "consumerId"), partitionKey=text(partition_key, "partitionKey"),
            sequence=None, updatedAt=now)], ignore_conflicts=True)

    def last_sequence(self, consumer_id: str, partition_key: str) -> int | None:
        with self.errors(f"reading sequence of {partition_key}"):
            return self.first(self.sequence_of(consumer_id, partition_key).values_list("sequence", flat=True))

    def advance_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> None:
        now = db_time(now)
        raised = Case(When(Q(sequence__isnull=True) | Q(sequence__lt=sequence), then=Value(sequence)),
                      default=F("sequence"), output_field=models.BigIntegerField())
        with self.errors(f"advancing {partition_key}"):
            if self.sequence_of(consumer_id, partition_key).update(sequence=raised, updatedAt=now):
                return
            self.ensure_sequence_row(consumer_id, partition_key, now)
            self.sequence_of(consumer_id, partition_key).update(sequence=raised, updatedAt=now)

    def accept_sequence(self, consumer_id: str, partition_key: str, sequence: int, now: datetime) -> bool:
        now = db_time(now)

        def accept() -> bool:
            return bool(self.sequence_of(consumer_id, partition_key)
                        .filter(Q(sequence__isnull=True) | Q(sequence__lt=sequence))
                        .update(sequence=sequence, updatedAt=now))

        with self.errors(f"accepting {partition_key}#{sequence}"):
            if accept():
                return True
            self.ensure_sequence_row(consumer_id, partition_key, now)
            return accept()

    def restore_sequence(self, consumer_id: str, partition_key: str, *, accepted: int, previous: int | None,
                         now: datetime) -> bool:
        with self.errors(f"restoring {partition_key}"):
            return bool(self.sequence_of(consumer_id, partition_key).filter(sequence=accepted).update(
                sequence=previous, updatedAt=db_time(now)))

    # --- re-push audit -----------------------------------------------------------------

    def insert_repush(self, record: dict) -> None:
        values = REPUSHES.columns(record)
        with self.errors(f"recording a re-push of {values['eventId']}"):
            self.rows(RepushRecord).create(**values)

    def repush_history(self, event_id: str, limit: int = 100) -> list[dict]:
        if limit <= 0:
            return []
        with self.errors(f"reading re-pushes of {event_id}"):
            rows = list(self.rows(RepushRecord).filter(eventId=event_id)
                        .order_by(self.time_order("requestedAt", descending=True), "-id").values(*REPUSHES.fields)[:limit])
        return [REPUSHES.record(row) for row in rows]

"""The integration-event envelope (seed 004 §1.2): metadata apart from the payload.

On the wire (AMQP body, HTTP) the envelope is a JSON object with camelCase
keys and ISO 8601 UTC times; in MongoDB the same keys with BSON dates.
:func:`build_envelope` validates input and fills what is missing from the
current :mod:`~wow_django.bus.context`.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from wow_django.bus.context import current_context
from wow_django.conf import KEY_NAME_RE, MAX_KEYS
from wow_django.domain.values import NUL_RULE, nul_path
from wow_django.exceptions import EnvelopeValidationError
from wow_django.persistence.bus import SEARCH_KEYS, EventStatus, to_bson_time, utcnow

#: Statuses derived from consumer feedback by the rollup.
FEEDBACK_STATUSES = (EventStatus.CONSUMED, EventStatus.PARTIAL, EventStatus.FAILED)

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
CONSUMER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_TOPIC_LENGTH = 200
MAX_TEXT_LENGTH = 200
MAX_PAYLOAD_BYTES = 1_048_576
MAX_PAYLOAD_DEPTH = 32
MAX_SEQUENCE = 2**63 - 1

WIRE_FIELDS = (
    "eventId", "traceId", "spanId", "parentEventId", "topic", "payload", "payloadType", "initiator",
    "occurredAt", "sentAt", "contractVersion", "partitionKey", "sequence", "expireAt", "keys",
)

INITIATOR_FIELDS = ("service", "operation", "userId", "clientRequestId")
WIRE_NAMES = frozenset(WIRE_FIELDS)  # the envelope fields this version knows
_INITIATOR_NAMES = frozenset(INITIATOR_FIELDS)


def iso(moment: datetime | None) -> str | None:
    """``2024-02-28T10:00:00.000Z`` for a naive-UTC or aware datetime; ``None`` stays ``None``."""
    if moment is None:
        return None
    m = to_bson_time(moment)
    return (f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}."
            f"{m.microsecond // 1000:03d}Z")


def parse_time(value: Any) -> datetime:
    """A datetime or an ISO 8601 string as naive UTC; naive input is taken as UTC."""
    if isinstance(value, datetime):
        return to_bson_time(value)
    if not isinstance(value, str) or not value:
        raise ValueError("must be an ISO 8601 date-time string")
    if value[-1] == "Z":  # what iso() writes: UTC, read as a naive time without converting it
        try:
            parsed = datetime.fromisoformat(value[:-1])
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is None:
            return to_bson_time(parsed)
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise ValueError("must be an ISO 8601 date-time such as 2024-02-28T10:00:00Z") from None
    try:
        return to_bson_time(parsed)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ValueError("must be a date-time between the years 1 and 9999 in UTC") from None


def new_event_id() -> str:
    return f"evt-{uuid.uuid4()}"


def new_trace_id() -> str:
    return f"trace-{uuid.uuid4().hex}"


def new_span_id() -> str:
    return f"span-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class Initiator:
    """Who started the event (seed 004 §6.1)."""

    service: str
    operation: str | None = None
    user_id: str | None = None
    client_request_id: str | None = None

    def to_json(self) -> dict:
        return {"service": self.service, "operation": self.operation, "userId": self.user_id,
                "clientRequestId": self.client_request_id}

    @classmethod
    def from_json(cls, data: dict) -> Initiator:
        return cls(service=data.get("service") or "", operation=data.get("operation"),
                   user_id=data.get("userId"), client_request_id=data.get("clientRequestId"))


@dataclass(frozen=True)
class Envelope:
    """One integration event: metadata plus an opaque JSON payload."""

    event_id: str
    trace_id: str
    span_id: str
    topic: str
    payload: Any
    initiator: Initiator
    occurred_at: datetime
    parent_event_id: str | None = None
    payload_type: str = "application/json"
    sent_at: datetime | None = None
    contract_version: int = 1
    partition_key: str | None = None
    sequence: int | None = None
    expire_at: datetime | None = None
    keys: tuple[tuple[str, str], ...] = ()  # search keys: (name, value) pairs, sorted by name

    def to_json(self) -> dict:
        """The wire form: camelCase keys, ISO times."""
        return {
            "eventId": self.event_id, "traceId": self.trace_id, "spanId": self.span_id,
            "parentEventId": self.parent_event_id, "topic": self.topic, "payload": self.payload,
            "payloadType": self.payload_type, "initiator": self.initiator.to_json(),
            "occurredAt": iso(self.occurred_at), "sentAt": iso(self.sent_at),
            "contractVersion": self.contract_version, "partitionKey": self.partition_key,
            "sequence": self.sequence, "expireAt": iso(self.expire_at),
            # Only when there are keys: a consumer of an earlier version refuses a field it does not know.
            **({"keys": dict(self.keys)} if self.keys else {}),
        }

    def to_document(self) -> dict:
        """The stored form: the wire keys with BSON dates."""
        return {
            "eventId": self.event_id, "traceId": self.trace_id, "spanId": self.span_id,
            "parentEventId": self.parent_event_id, "topic": self.topic, "payload": self.payload,
            "payloadType": self.payload_type, "initiator": self.initiator.to_json(),
            "occurredAt": self.occurred_at, "sentAt": self.sent_at,
            "contractVersion": self.contract_version, "partitionKey": self.partition_key,
            "sequence": self.sequence, "expireAt": self.expire_at, "keys": dict(self.keys),
            SEARCH_KEYS: [search_key(name, value) for name, value in self.keys],
        }

    @classmethod
    def from_document(cls, doc: dict) -> Envelope:
        return cls(
            event_id=doc["eventId"], trace_id=doc["traceId"], span_id=doc.get("spanId") or "",
            topic=doc["topic"], payload=doc.get("payload"), initiator=Initiator.from_json(doc.get("initiator") or {}),
            occurred_at=parse_time(doc["occurredAt"]), parent_event_id=doc.get("parentEventId"),
            payload_type=doc.get("payloadType") or "application/json",
            sent_at=parse_time(doc["sentAt"]) if doc.get("sentAt") else None,
            contract_version=doc.get("contractVersion") or 1, partition_key=doc.get("partitionKey"),
            sequence=doc.get("sequence"),
            expire_at=parse_time(doc["expireAt"]) if doc.get("expireAt") else None,
            keys=tuple(sorted((doc.get("keys") or {}).items())),
        )

    def with_sent_at(self, moment: datetime) -> Envelope:
        return replace(self, sent_at=moment)


# --- validation -------------------------------------------------------------------


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def add(self, name: str, msg: str) -> None:
        self.items.append({"name": name, "msg": msg})


def _text(errors: _Errors, name: str, value: Any, *, required: bool, pattern: re.Pattern | None = None,
          max_length: int = MAX_TEXT_LENGTH, rule: str = "") -> str | None:
    if value is None or value == "":
        if required:
            errors.add(name, "is required")
        return None
    if not isinstance(value, str):
        errors.add(name, f"must be a string, got {type(value).__name__}")
        return None
    if len(value) > max_length or not value.isprintable():
        errors.add(name, f"must be printable text of at most {max_length} characters")
        return None
    if pattern is not None and not pattern.match(value):
        errors.add(name, rule or f"must match {pattern.pattern}")
        return None
    return value


def check_topic(value: Any, name: str = "topic") -> str:
    """Return ``value`` if it is a valid topic, else raise :class:`EnvelopeValidationError`."""
    errors = _Errors()
    topic = _text(errors, name, value, required=True, pattern=TOPIC_RE, max_length=MAX_TOPIC_LENGTH,
                  rule="must be words of letters, digits, '_' or '-' separated by '.' (e.g. order.purchased)")
    if errors.items:
        raise EnvelopeValidationError.from_errors(name, errors.items)
    return cast(str, topic)  # required: _text reported a None


def search_key(name: str, value: str) -> str:
    """The stored text of one search key: ``orderId=o-1``."""
    return f"{name}={value}"


def check_search_key(value: Any, name: str = "key") -> str:
    """``value`` if it is a search key's text (``name=value``: a key name, then text of at most 200
    printable characters), else :class:`EnvelopeValidationError` naming ``name``."""
    key_name, _, key_value = value.partition("=") if isinstance(value, str) else ("", "", "")
    if not KEY_NAME_RE.fullmatch(key_name) or not key_value or len(key_value) > MAX_TEXT_LENGTH \
            or not key_value.isprintable():
        raise EnvelopeValidationError.from_errors(name, [{"name": name, "msg": (
            "must be name=value: a name of letters, digits, '_', '.' or '-' starting with a letter (at most 64), "
            f"then printable text of at most {MAX_TEXT_LENGTH} characters (e.g. orderId=o-1)")}])
    return value


def aggregate_keys(aggregate: str, aggregate_id: str) -> dict[str, str]:
    """The search keys that tie an integration event to the aggregate it comes from: ``aggregate``
    (``<aggregate name>/<id>``, what the console links to the aggregate's page) and ``aggregateId``."""
    return {"aggregate": f"{aggregate}/{aggregate_id}", "aggregateId": aggregate_id}


def _key_value(value: Any) -> str | None:
    """``value`` as a search key's value: text of 1 to 200 printable characters without space at either end (an
    integer as its digits); None if it cannot be one."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT_LENGTH or not value.isprintable() \
            or value != value.strip():
        return None
    return value


def _keys(errors: _Errors, given: Any, payload: Any, search_fields: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The envelope's search keys: those given (at most 16), then each of ``search_fields`` the payload has at
    its top level as text or an integer, while there is room (a given key wins; a payload field that cannot be a
    key, or finds no room, is left out: the operator's settings never make a send fail)."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        errors.add("keys", "must be an object of name: text (the event's search keys)")
        return ()
    keys: dict[str, str] = {}
    for name, value in given.items():
        where = f"keys.{name}"
        if not isinstance(name, str) or not KEY_NAME_RE.fullmatch(name):
            errors.add(where, "a key name is letters, digits, '_', '.' or '-', starting with a letter, at most 64")
        elif not isinstance(value, str) or _key_value(value) is None:
            errors.add(where, f"must be printable text of 1 to {MAX_TEXT_LENGTH} characters without space at "
                              "either end")
        else:
            keys[name] = value
    if len(keys) > MAX_KEYS:
        errors.add("keys", f"at most {MAX_KEYS} search keys; got {len(keys)}")
    if isinstance(payload, dict):
        for name in search_fields:
            value = _key_value(payload.get(name))
            if name not in keys and value is not None and len(keys) < MAX_KEYS:
                keys[name] = value
    return tuple(sorted(keys.items()))


def check_consumer_id(value: Any, name: str = "consumerId") -> str:
    errors = _Errors()
    consumer = _text(errors, name, value, required=True, pattern=CONSUMER_ID_RE, max_length=100,
                     rule="must start with a letter or digit and hold only letters, digits, '.', '_' or '-'")
    if errors.items:
        raise EnvelopeValidationError.from_errors(name, errors.items)
    return cast(str, consumer)  # required: _text reported a None


def _payload_problem(value: Any, depth: int = 0) -> str | None:
    if depth > MAX_PAYLOAD_DEPTH:
        return f"nests deeper than {MAX_PAYLOAD_DEPTH} levels"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"has a non-string key {key!r}"
            if key.startswith("$") or "\0" in key:
                return f"has key {key!r}: keys must not start with '$' or contain NUL"
            problem = _payload_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list):
        for item in value:
            problem = _payload_problem(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, float) and not math.isfinite(value):  # NaN and Infinity are not JSON
        return "holds NaN or Infinity, which is not JSON"
    elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return "holds an integer that does not fit in 64 bits (send it as a string)"
    elif not isinstance(value, (str, int, float, bool, type(None))):
        return f"holds a {type(value).__name__}, which is not JSON (convert it, e.g. Decimal to str)"
    return None


def _time(errors: _Errors, name: str, value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        errors.add(name, str(exc))
        return None


def build_envelope(data: dict, *, default_service: str, search_fields: tuple[str, ...] = ()) -> Envelope:
    """Validate wire-form ``data`` and fill what is missing (ids, times, trace, initiator).

    ``search_fields``: the payload's top-level fields copied into the search keys (``WOW['BUS_SEARCH_FIELDS']``).

    Raises :class:`EnvelopeValidationError` naming every bad field.
    """
    if not isinstance(data, dict):
        raise EnvelopeValidationError.from_errors("envelope", [{"name": "(body)", "msg": "must be a JSON object"}])
    errors = _Errors()
    for key in data:
        if key not in WIRE_NAMES:
            errors.add(str(key), "unknown field: not part of the envelope")
    nul = nul_path(data)
    if nul is not None:  # PostgreSQL stores none: refused on every bus store alike
        errors.add(nul.replace("\x00", "\\u0000"), NUL_RULE)
    ctx = current_context()
    event_id = _text(errors, "eventId", data.get("eventId"), required=False, pattern=ID_RE, max_length=128,
                     rule="must be 1-128 letters, digits or . _ : @ - and start with a letter or digit")
    trace_id = _text(errors, "traceId", data.get("traceId"), required=False, pattern=ID_RE, max_length=128,
                     rule="must be 1-128 letters, digits or . _ : @ -")
    span_id = _text(errors, "spanId", data.get("spanId"), required=False, pattern=ID_RE, max_length=128,
                    rule="must be 1-128 letters, digits or . _ : @ -")
    parent = _text(errors, "parentEventId", data.get("parentEventId"), required=False, pattern=ID_RE,
                   max_length=128, rule="must be an eventId")
    topic = _text(errors, "topic", data.get("topic"), required=True, pattern=TOPIC_RE, max_length=MAX_TOPIC_LENGTH,
                  rule="must be words of letters, digits, '_' or '-' separated by '.' (e.g. order.purchased)")
    payload_type = _text(errors, "payloadType", data.get("payloadType"), required=False, max_length=100)
    payload_type = payload_type or "application/json"
    if "payload" not in data:
        errors.add("payload", "is required (use null for an event without data)")
    payload = data.get("payload")
    problem = _payload_problem(payload)
    if problem:
        errors.add("payload", problem)
    else:
        size = len(json.dumps(payload, ensure_ascii=False, allow_nan=False).encode())
        if size > MAX_PAYLOAD_BYTES:
            errors.add("payload", f"is {size} bytes as JSON; at most {MAX_PAYLOAD_BYTES} are allowed")
    if payload_type != "application/json" and not (payload is None or isinstance(payload, str)):
        errors.add("payload", f"must be a string when payloadType is {payload_type!r}")

    initiator_in = data.get("initiator")
    if initiator_in is None:
        initiator_in = {}
    if not isinstance(initiator_in, dict):
        errors.add("initiator", "must be an object with service, operation, userId, clientRequestId")
        initiator_in = {}
    for key in initiator_in:
        if key not in _INITIATOR_NAMES:
            errors.add(f"initiator.{key}", "unknown field: not part of the initiator")
    service = _text(errors, "initiator.service", initiator_in.get("service"), required=False)
    operation = _text(errors, "initiator.operation", initiator_in.get("operation"), required=False)
    user_id = _text(errors, "initiator.userId", initiator_in.get("userId"), required=False)
    request_id = _text(errors, "initiator.clientRequestId", initiator_in.get("clientRequestId"), required=False)

    occurred_at = _time(errors, "occurredAt", data.get("occurredAt"))
    sent_at = _time(errors, "sentAt", data.get("sentAt"))
    expire_at = _time(errors, "expireAt", data.get("expireAt"))

    contract_version = data.get("contractVersion", 1)
    if contract_version is None:
        contract_version = 1
    if isinstance(contract_version, bool) or not isinstance(contract_version, int) or not 1 <= contract_version <= 10_000:
        errors.add("contractVersion", "must be an integer from 1 to 10000")
    partition_key = _text(errors, "partitionKey", data.get("partitionKey"), required=False)
    sequence = data.get("sequence")
    if sequence is not None:
        if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence <= MAX_SEQUENCE:
            errors.add("sequence", "must be an integer ≥ 0")
        elif partition_key is None and "partitionKey" not in {e["name"] for e in errors.items}:
            errors.add("sequence", "needs a partitionKey: sequences order the events of one partition")

    keys = _keys(errors, data.get("keys"), payload if not problem else None, search_fields)

    occurred_at = occurred_at or utcnow()
    if expire_at is not None and expire_at <= occurred_at:
        errors.add("expireAt", "must be later than occurredAt")
    if errors.items:
        raise EnvelopeValidationError.from_errors("envelope", errors.items)

    initiator = Initiator(
        service=service or ctx.service or default_service,
        operation=operation or ctx.operation,
        user_id=user_id or ctx.user_id,
        client_request_id=request_id or ctx.client_request_id,
    )
    return Envelope(
        event_id=event_id or new_event_id(),
        trace_id=trace_id or ctx.trace_id or new_trace_id(),
        span_id=span_id or new_span_id(),
        parent_event_id=parent or ctx.parent_event_id,
        topic=cast(str, topic),  # required: _text reported a None
        payload=payload,
        payload_type=payload_type,
        initiator=initiator,
        occurred_at=occurred_at,
        sent_at=sent_at,
        contract_version=contract_version,
        partition_key=partition_key,
        sequence=sequence,
        expire_at=expire_at,
        keys=keys,
    )

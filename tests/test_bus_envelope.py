"""The bus envelope, its validation and defaults, and the pure helpers: status rollup, trees, ordering."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import override_settings

from wow_django.bus import EnvelopeValidationError, EventStatus, bus_context, current_context, is_stale
from wow_django.bus.envelope import Envelope, build_envelope, iso, parse_time
from wow_django.bus.rollup import compute_status, consumed_summary, last_error, latest_by_consumer
from wow_django.bus.trace import build_tree, render_tree
from wow_django.http.errors import error_response


def names(exc: EnvelopeValidationError) -> set[str]:
    return {e["name"] for e in exc.binding_errors}


def test_defaults_fill_ids_times_and_initiator():
    envelope = build_envelope({"topic": "order.purchased", "payload": {"orderId": "o-1"}}, default_service="orders")
    assert envelope.event_id.startswith("evt-") and envelope.trace_id.startswith("trace-")
    assert envelope.span_id.startswith("span-") and envelope.parent_event_id is None
    assert envelope.initiator.service == "orders" and envelope.initiator.user_id is None
    assert envelope.payload_type == "application/json" and envelope.contract_version == 1
    assert abs(envelope.occurred_at - datetime.now(UTC).replace(tzinfo=None)) < timedelta(seconds=5)
    other = build_envelope({"topic": "order.purchased", "payload": None}, default_service="orders")
    assert other.event_id != envelope.event_id and other.trace_id != envelope.trace_id


def test_given_fields_are_kept_as_given():
    data = {
        "eventId": "evt-1", "traceId": "trace-001", "spanId": "span-001", "parentEventId": "evt-0",
        "topic": "order.created", "payload": {"orderId": "ORD-2024-001", "amount": 99.0},
        "initiator": {"service": "order-service", "operation": "createOrder", "userId": "user-123",
                      "clientRequestId": "req-abc-001"},
        "occurredAt": "2024-02-28T10:00:00Z", "contractVersion": 2, "partitionKey": "ORD-2024-001",
        "sequence": 4, "expireAt": "2024-03-28T10:00:00+00:00",
    }
    envelope = build_envelope(data, default_service="ignored")
    wire = envelope.to_json()
    assert wire == {**data, "payloadType": "application/json", "sentAt": None,
                    "occurredAt": "2024-02-28T10:00:00.000Z", "expireAt": "2024-03-28T10:00:00.000Z"}
    assert Envelope.from_document(envelope.to_document()) == envelope


def test_the_context_fills_what_is_missing_and_yields_to_given_values():
    with bus_context(trace_id="trace-ctx", parent_event_id="evt-parent", user_id="u-1", client_request_id="r-1",
                     service="member-service", operation="addPoints"):
        assert current_context().trace_id == "trace-ctx"
        envelope = build_envelope({"topic": "points.added", "payload": {}}, default_service="orders")
        explicit = build_envelope({"topic": "points.added", "payload": {}, "traceId": "trace-own",
                                   "initiator": {"userId": "u-2"}}, default_service="orders")
    assert (envelope.trace_id, envelope.parent_event_id) == ("trace-ctx", "evt-parent")
    assert envelope.initiator.to_json() == {"service": "member-service", "operation": "addPoints",
                                            "userId": "u-1", "clientRequestId": "r-1"}
    assert explicit.trace_id == "trace-own" and explicit.initiator.user_id == "u-2"
    assert current_context().trace_id is None
    with pytest.raises(TypeError, match="unknown fields"):
        with bus_context(traceId="x"):
            pass


@pytest.mark.parametrize("data, bad", [
    ({"payload": {}}, {"topic"}),
    ({"topic": "order purchased", "payload": {}}, {"topic"}),
    ({"topic": "order.*", "payload": {}}, {"topic"}),
    ({"topic": "a.b"}, {"payload"}),
    ({"topic": "a.b", "payload": {"amount": Decimal("1.5")}}, {"payload"}),
    ({"topic": "a.b", "payload": {"$where": "1"}}, {"payload"}),
    ({"topic": "a.b", "payload": {"x": float("nan")}}, {"payload"}),
    ({"topic": "a.b", "payload": {}, "eventId": "has space"}, {"eventId"}),
    ({"topic": "a.b", "payload": {}, "occurredAt": "yesterday"}, {"occurredAt"}),
    ({"topic": "a.b", "payload": {}, "sequence": 3}, {"sequence"}),
    ({"topic": "a.b", "payload": {}, "sequence": -1, "partitionKey": "p"}, {"sequence"}),
    ({"topic": "a.b", "payload": {}, "contractVersion": 0}, {"contractVersion"}),
    ({"topic": "a.b", "payload": {}, "initiator": "svc"}, {"initiator"}),
    ({"topic": "a.b", "payload": {}, "initiator": {"service": "s", "role": "x"}}, {"initiator.role"}),
    ({"topic": "a.b", "payload": {}, "payloadType": "text/plain"}, {"payload"}),
    ({"topic": "a.b", "payload": {}, "occurredAt": "2024-01-02T00:00:00Z", "expireAt": "2024-01-01T00:00:00Z"},
     {"expireAt"}),
    ({"topic": "a.b", "payload": {}, "status": "SENT"}, {"status"}),
    ({"topic": "a.b", "payload": {}, "keys": ["orderId"]}, {"keys"}),
    ({"topic": "a.b", "payload": {}, "keys": {"order id": "o-1"}}, {"keys.order id"}),
    ({"topic": "a.b", "payload": {}, "keys": {"1st": "o-1", "ok": "o-1"}}, {"keys.1st"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": 5}}, {"keys.orderId"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": ""}}, {"keys.orderId"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": "x" * 201}}, {"keys.orderId"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": "a\nb"}}, {"keys.orderId"}),
    ({"topic": "a.b", "payload": {}, "keys": {f"k{n}": "v" for n in range(17)}}, {"keys"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId\n": "o-1"}}, {"keys.orderId\n"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": " o-1"}}, {"keys.orderId"}),
    ({"topic": "a.b", "payload": {}, "keys": {"orderId": "o-1 "}}, {"keys.orderId"}),
])
def test_invalid_envelopes_name_every_bad_field(data, bad):
    with pytest.raises(EnvelopeValidationError) as caught:
        build_envelope(data, default_service="orders")
    assert names(caught.value) == bad
    assert caught.value.error_code == "BusValidation"
    assert error_response(caught.value).status_code == 400
    assert str(caught.value).startswith("Invalid envelope: ")


def test_search_keys_are_the_given_keys_then_the_payload_fields_named_by_the_settings():
    from wow_django.bus.envelope import aggregate_keys, check_search_key

    payload = {"orderId": "o-1", "userId": 42, "flag": True, "nested": {"orderId": "o-2"}, "note": "x" * 201,
               "customerId": "c-9"}
    envelope = build_envelope({"topic": "a.b", "payload": payload, "keys": aggregate_keys("orders.order", "o-1")},
                              default_service="s", search_fields=("orderId", "userId", "flag", "note", "nested",
                                                                  "missing"))
    # Text and integers at the top level; never a bool, an object, or text a key cannot hold; the given key wins.
    assert envelope.keys == (("aggregate", "orders.order/o-1"), ("aggregateId", "o-1"), ("orderId", "o-1"),
                             ("userId", "42"))
    document = envelope.to_document()
    assert document["searchKeys"] == ["aggregate=orders.order/o-1", "aggregateId=o-1", "orderId=o-1", "userId=42"]
    assert envelope.to_json()["keys"] == {"aggregate": "orders.order/o-1", "aggregateId": "o-1", "orderId": "o-1",
                                          "userId": "42"}
    assert Envelope.from_document(document) == envelope
    given = build_envelope({"topic": "a.b", "payload": payload, "keys": {"orderId": "mine"}}, default_service="s",
                           search_fields=("orderId",))
    assert given.keys == (("orderId", "mine"),)
    assert build_envelope({"topic": "a.b", "payload": payload}, default_service="s").keys == ()  # no setting
    assert build_envelope({"topic": "a.b", "payload": ["orderId"], "keys": None}, default_service="s",
                          search_fields=("orderId",)).keys == ()
    assert check_search_key("orderId=o=1") == "orderId=o=1"  # the value may hold '='
    # Payload fields that cannot be keys are left out; so are those beyond the 16 keys an event has: the
    # operator's settings never make a send fail.
    odd = {"orderId": "a\nb", "userId": " u-1", "n": 7}
    assert build_envelope({"topic": "a.b", "payload": odd}, default_service="s",
                          search_fields=("orderId", "userId", "n")).keys == (("n", "7"),)
    many = {f"f{n:02d}": f"v{n}" for n in range(20)}
    full = build_envelope({"topic": "a.b", "payload": many, "keys": {"aggregate": "order/o-1"}}, default_service="s",
                          search_fields=tuple(many))
    assert len(full.keys) == 16 and ("aggregate", "order/o-1") in full.keys and ("f14", "v14") in full.keys
    assert ("f15", "v15") not in full.keys
    assert "keys" not in build_envelope({"topic": "a.b", "payload": {}}, default_service="s").to_json()
    for bad in ("orderId", "=o-1", "orderId=", "order id=o-1", "orderId=" + "x" * 201, "a=b\x00", 5, None,
                "orderId\n=o-1"):
        with pytest.raises(EnvelopeValidationError) as caught:
            check_search_key(bad)
        assert names(caught.value) == {"key"}


@pytest.mark.parametrize("data, where", [
    ({"payload": {"note": "a\x00b"}}, "payload.note"),
    ({"payload": {"items": [{"sku": "s\x00"}]}}, "payload.items[0].sku"),
    ({"payload": {"k\x00": 1}}, "payload"),
    ({"payload": "\x00"}, "payload"),
    ({"payload": {}, "initiator": {"userId": "u\x00"}}, "initiator.userId"),
    ({"payload": {}, "keys": {"orderId": "o\x00"}}, "keys.orderId"),
    ({"payload": {}, "partitionKey": "p\x00"}, "partitionKey"),
])
def test_a_nul_anywhere_is_refused_by_where_it_is(data, where):
    with pytest.raises(EnvelopeValidationError) as caught:
        build_envelope({"topic": "a.b", **data}, default_service="s")
    assert {"name": where, "msg": "must not contain NUL characters (\\u0000)"} in caught.value.binding_errors


@pytest.mark.parametrize("payload", [{"path": "C:\\u0000"}, {"C:\\u0000": "\\"}, ["\\u0000", "\\\\u0000"]])
def test_a_backslash_before_u0000_is_not_a_nul(payload):
    """What a NUL looks like in JSON text (\\u0000) written out by hand, with a real backslash, is text."""
    envelope = build_envelope({"topic": "a.b", "payload": payload}, default_service="s")
    assert envelope.payload == payload


def test_a_payload_json_cannot_write_is_refused_by_its_rule():
    for payload, rule in (({"at": datetime(2024, 1, 1)}, "datetime"), ({1: "a"}, "non-string key"),
                          ({"x": float("nan")}, "NaN")):
        with pytest.raises(EnvelopeValidationError, match=rule):
            build_envelope({"topic": "a.b", "payload": payload}, default_service="s")


def test_payload_size_is_limited():
    with pytest.raises(EnvelopeValidationError, match="bytes as JSON"):
        build_envelope({"topic": "a.b", "payload": "x" * 1_100_000}, default_service="s")


def test_times_are_utc_milliseconds():
    moment = parse_time("2024-02-28T18:00:00.123456+08:00")
    assert moment == datetime(2024, 2, 28, 10, 0, 0, 123000) and moment.tzinfo is None
    assert iso(moment) == "2024-02-28T10:00:00.123Z"
    assert parse_time(datetime(2024, 1, 1, 12, tzinfo=UTC)) == datetime(2024, 1, 1, 12)


@pytest.mark.parametrize("text, expected", [
    ("2024-02-28T10:00:00.123Z", datetime(2024, 2, 28, 10, 0, 0, 123000)),  # what iso() writes
    ("2024-02-28T10:00:00.123456Z", datetime(2024, 2, 28, 10, 0, 0, 123000)),
    ("2024-02-28T10:00:00Z", datetime(2024, 2, 28, 10)),
    ("2024-02-28T10:00:00.5z", datetime(2024, 2, 28, 10, 0, 0, 500000)),
    ("2024-02-28T10:00:00+01:00", datetime(2024, 2, 28, 9)),
    ("2024-02-28", datetime(2024, 2, 28)),
    ("0999-12-31T23:59:59.999Z", datetime(999, 12, 31, 23, 59, 59, 999000)),  # four digits, as ISO 8601 says
    ("0001-01-01T00:00:00Z", datetime(1, 1, 1)),
])
def test_iso_times_read_back_as_naive_utc(text, expected):
    moment = parse_time(text)
    assert moment == expected and moment.tzinfo is None
    assert parse_time(iso(moment)) == moment


@pytest.mark.parametrize("text", ["2024-02-28T10:00:00+01:00Z", "Z", "2024-13-01T00:00:00Z", "0001-01-01T00:00:00+01:00"])
def test_malformed_times_are_refused(text):
    with pytest.raises(ValueError, match="must be"):
        parse_time(text)


def row(consumer, attempt, success, **extra):
    return {"consumerId": consumer, "attemptNo": attempt, "success": success, **extra}


@pytest.mark.parametrize("rows, current, expected", [
    ([row("a", 0, None), row("b", 0, None)], "SENT", "SENT"),
    ([row("a", 0, None), row("a", 1, True), row("b", 0, None)], "SENT", "SENT"),
    ([row("a", 1, True), row("b", 1, True)], "SENT", "CONSUMED"),
    ([row("a", 1, True), row("b", 1, False)], "SENT", "PARTIAL"),
    ([row("a", 1, False), row("b", 1, False)], "SENT", "FAILED"),
    ([row("a", 1, False), row("b", 0, None)], "SENT", "FAILED"),
    # the latest row per consumer counts, not the order of rows
    ([row("a", 2, True), row("a", 1, False), row("b", 3, True), row("b", 2, False)], "PARTIAL", "CONSUMED"),
    # a failure that will be retried is still waiting
    ([row("a", 1, True), row("b", 1, False, retrying=True)], "SENT", "SENT"),
    # send-side statuses are kept while consumers are still working
    ([row("a", 0, None), row("b", 1, True)], "PENDING", "PENDING"),
    ([row("a", 1, False), row("b", 1, True), row("a", 2, None)], "RETRYING", "RETRYING"),
    ([row("a", 1, True), row("b", 1, True)], "PENDING", "CONSUMED"),
])
def test_status_from_the_latest_row_per_consumer(rows, current, expected):
    latest = latest_by_consumer(rows)
    assert compute_status(["a", "b"], latest, current) == expected


def test_consumed_summary_counts_expected_consumers_only():
    latest = latest_by_consumer([row("a", 1, True), row("b", 1, False), row("x", 1, True)])
    assert consumed_summary(["a", "b"], latest) == {
        "consumed": 1, "expected": 2, "failed": 1, "text": "1/2 consumed",
        "lastFailure": {"consumerId": "b", "attemptNo": 1, "error": "failed", "at": None}}
    assert consumed_summary(["a", "b", "c"], {})["text"] == "0/3 consumed"
    assert consumed_summary(["a", "b", "c"], {})["lastFailure"] is None


def test_the_last_failure_is_the_latest_failed_attempt_and_names_its_first_line():
    early, late = datetime(2026, 1, 1, 10), datetime(2026, 1, 1, 11)
    latest = latest_by_consumer([
        row("a", 2, False, retrying=True, consumedAt=late, error="KeyError: 'sku'\n\nTraceback ..."),
        row("b", 3, False, deadLettered=True, consumedAt=early, error="ValueError: bad"),
        row("c", 1, False, consumedAt=early, error="old"), row("c", 2, True, consumedAt=late)])
    summary = consumed_summary(["a", "b", "c"], latest)
    # a retried failure counts too (the event is still SENT, yet a consumer is failing); a consumer that
    # failed and then succeeded does not
    assert summary["lastFailure"] == {"consumerId": "a", "attemptNo": 2, "error": "KeyError: 'sku'", "at": late}
    assert last_error({"lastError": None}, summary) == "consumer a, attempt 2: KeyError: 'sku'"
    assert last_error({"lastError": "broker down"}, summary) == "broker down"  # the send error comes first
    assert last_error({"lastError": None}, consumed_summary(["c"], latest)) is None


def ev(event_id, parent=None):
    return {"eventId": event_id, "parentEventId": parent, "topic": f"t.{event_id}"}


def test_trace_tree_parents_children_and_outsiders():
    events = [ev("root"), ev("points", "root"), ev("notice-2", "points"), ev("notice-1", "root"),
              ev("orphan", "not-in-trace")]
    tree = build_tree(events)
    assert [n.event["eventId"] for n in tree] == ["root", "orphan"]
    assert [c.event["eventId"] for c in tree[0].children] == ["points", "notice-1"]
    assert [c.event["eventId"] for c in tree[0].children[0].children] == ["notice-2"]
    assert render_tree(tree, lambda e: e["eventId"]) == [
        "root", "├── points", "│   └── notice-2", "└── notice-1", "orphan",
    ]
    as_json = tree[0].to_json(lambda e: {"id": e["eventId"]})
    assert as_json == {"id": "root", "children": [{"id": "points", "children": [{"id": "notice-2", "children": []}]},
                                                  {"id": "notice-1", "children": []}]}


def test_a_cyclic_chain_does_not_loop():
    tree = build_tree([ev("a", "b"), ev("b", "a"), ev("c", "c")])
    placed = []

    def walk(node):
        placed.append(node.event["eventId"])
        for child in node.children:
            walk(child)

    for node in tree:
        walk(node)
    assert sorted(placed) == ["a", "b", "c"]


def test_stale_by_sequence():
    assert not is_stale(None, 1)
    assert is_stale(5, 4) and is_stale(5, 5)
    assert not is_stale(5, 6)


def test_statuses_are_the_seeds():
    assert [s.value for s in EventStatus] == ["PENDING", "SENT", "CONSUMED", "PARTIAL", "FAILED", "RETRYING"]


def test_bus_settings_are_validated():
    from django.core.exceptions import ImproperlyConfigured

    from wow_django.conf import wow_settings

    with override_settings(WOW={"BUS_INBOX_LEASE_S": 0}):
        with pytest.raises(ImproperlyConfigured, match="BUS_INBOX_LEASE_S"):
            _ = wow_settings.BUS_INBOX_LEASE_S
    for bad in ("orderId", ["order id"], [1], [f"f{n}" for n in range(17)], ["orderId\n"]):
        with override_settings(WOW={"BUS_SEARCH_FIELDS": bad}):
            with pytest.raises(ImproperlyConfigured, match="BUS_SEARCH_FIELDS"):
                _ = wow_settings.BUS_SEARCH_FIELDS
    with override_settings(WOW={"BUS_CONSUMER_PREFETCH": 4, "BUS_PUBLISH_TIMEOUT_S": 1.5}):
        assert (wow_settings.BUS_CONSUMER_PREFETCH, wow_settings.BUS_PUBLISH_TIMEOUT_S) == (4, 1.5)

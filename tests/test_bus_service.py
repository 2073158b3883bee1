"""The bus on each bus store (Mongo on the embedded engine, in memory) and the in-process transport: send,
relay, feedback, rollup, re-push, trace, listing, topic consumers, inbox, sequences, and the pinned index names."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from wow_django.backends.mongo.client import disconnect
from wow_django.bus import (
    ConsumerNotExpected,
    EnvelopeValidationError,
    EventNotFound,
    RepushRefused,
    SequenceTracker,
    TraceNotFound,
    TransportUnavailable,
    get_bus,
)
from wow_django.bus import service as bus_service
from wow_django.bus.envelope import utcnow
from wow_django.bus.inbox import BUSY, CLAIMED, DONE, Inbox
from wow_django.http.errors import error_response
from wow_django.testing.bus import delete_amqp_entities, take_messages, unique_exchange

from .support import fresh_wow, stored_counts

CONSUMERS = ("member-service", "message-service")


def bus_settings(bus_store: str, **extra) -> dict:
    return fresh_wow("mongo", SERVICE_NAME="order-service", BUS_EXCHANGE=unique_exchange(), BUS_STORE=bus_store,
                     **extra)


@pytest.fixture
def bus_env(bus_store):
    settings = bus_settings(bus_store)
    with override_settings(WOW=settings):
        yield settings
        delete_amqp_entities("memory://", settings["BUS_EXCHANGE"], CONSUMERS + ("other-service",))
    disconnect(settings["MONGO_URI"])


@pytest.fixture
def bus(bus_env):
    bus = get_bus()
    for consumer in CONSUMERS:
        bus.set_topic_consumer("order.purchased", consumer)
    return bus


def messages(bus_env, consumer):
    return take_messages("memory://", bus_env["BUS_EXCHANGE"], consumer)


def rows(bus, event_id):
    return bus.store.consumption_rows([event_id])


# --- send ----------------------------------------------------------------------------


def test_send_with_no_enabled_consumer_logs_an_error_and_stores_and_publishes_nothing(bus_env, caplog, monkeypatch):
    bus = get_bus()
    bus.set_topic_consumer("order.refunded", "member-service", enabled=False)
    published = []
    monkeypatch.setattr(bus.transport, "publish", lambda *a, **k: published.append(a))
    with caplog.at_level(logging.ERROR, logger="wow_django.bus"):
        result = bus.send("order.refunded", {"orderId": "o-1"}, event_id="evt-refund-1")
        unknown = bus.send("never.configured", {})
    assert (result.status, result.stored, unknown.stored) == (None, False, False)
    assert published == []
    assert stored_counts(bus.store) == (0, 0)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "'order.refunded' has no enabled consumer" in errors[0].getMessage()
    assert "evt-refund-1" in errors[0].getMessage()


def test_send_stores_pending_with_pending_rows_then_publishes_then_marks_sent(bus, bus_env, monkeypatch):
    seen_at_publish = {}
    publish = bus.transport.publish

    def spy(message, **kwargs):
        seen_at_publish["status"] = bus.store.get_event(message["eventId"])["status"]
        seen_at_publish["rows"] = len(rows(bus, message["eventId"]))
        publish(message, **kwargs)

    monkeypatch.setattr(bus.transport, "publish", spy)
    result = bus.send("order.purchased", {"orderId": "o-1", "amount": "19.90"}, event_id="evt-p-1",
                      trace_id="trace-1", initiator={"operation": "pay_order", "userId": "user-A"})
    assert result.to_json() == {"eventId": "evt-p-1", "status": "SENT", "stored": True, "duplicate": False,
                                "consumers": list(CONSUMERS), "error": None}
    assert seen_at_publish == {"status": "PENDING", "rows": 2}
    event = bus.store.get_event("evt-p-1")
    assert event["status"] == "SENT" and event["retryCount"] == 0 and event["lastError"] is None
    assert event["sentAt"] == event["lastSentAt"] == event["statusAt"]
    assert event["consumers"] == list(CONSUMERS)
    assert event["initiator"] == {"service": "order-service", "operation": "pay_order", "userId": "user-A",
                                  "clientRequestId": None}
    assert [(r["consumerId"], r["attemptNo"], r["success"], r["consumedAt"]) for r in rows(bus, "evt-p-1")] == [
        ("member-service", 0, None, None), ("message-service", 0, None, None)]
    for consumer in CONSUMERS:
        [message] = messages(bus_env, consumer)
        assert message.payload["eventId"] == "evt-p-1" and message.payload["traceId"] == "trace-1"
        assert message.payload["sentAt"] is not None
        assert message.properties["delivery_mode"] == 2 and message.content_type == "application/json"


def test_the_same_event_id_twice_keeps_one_record(bus, bus_env):
    first = bus.send("order.purchased", {"n": 1}, event_id="evt-dup")
    second = bus.send("order.purchased", {"n": 2}, event_id="evt-dup")
    assert (first.duplicate, second.duplicate, second.status) == (False, True, "SENT")
    assert stored_counts(bus.store) == (1, 2)
    assert bus.store.get_event("evt-dup")["payload"] == {"n": 1}
    assert len(rows(bus, "evt-dup")) == 2
    assert len(messages(bus_env, "member-service")) == 1


def test_an_invalid_envelope_raises_and_stores_nothing(bus):
    with pytest.raises(EnvelopeValidationError) as caught:
        bus.send("order purchased", {"amount": object()}, sequence=-1)
    assert {e["name"] for e in caught.value.binding_errors} == {"topic", "payload", "sequence"}
    with pytest.raises(EnvelopeValidationError):
        bus.send_envelope({"topic": "order.purchased", "payload": {}, "status": "CONSUMED"})
    assert stored_counts(bus.store) == (0, 0)


def test_broker_down_leaves_pending_with_the_error_and_the_relay_publishes_later(bus, bus_env, monkeypatch):
    publish = bus.transport.publish

    def down(*args, **kwargs):
        raise TransportUnavailable("broker unreachable (test)")

    monkeypatch.setattr(bus.transport, "publish", down)
    result = bus.send("order.purchased", {"orderId": "o-9"}, event_id="evt-down")
    assert result.status == "PENDING" and result.stored and "unreachable" in result.error
    event = bus.store.get_event("evt-down")
    assert event["status"] == "PENDING" and "unreachable" in event["lastError"]
    assert bus.relay_pending().published == ()  # younger than BUS_RELAY_AFTER_S
    assert bus.relay_pending(older_than_s=0).failed == ("evt-down",)  # still down
    monkeypatch.setattr(bus.transport, "publish", publish)
    assert bus.relay_pending(older_than_s=0).published == ("evt-down",)
    event = bus.store.get_event("evt-down")
    assert event["status"] == "SENT" and event["lastError"] is None and event["retryCount"] == 0
    assert [m.payload["eventId"] for m in messages(bus_env, "message-service")] == ["evt-down"]
    assert bus.relay_pending(older_than_s=0).published == ()


def test_the_relay_restores_pending_rows_lost_in_a_crash_and_leases_each_event(bus, bus_env, monkeypatch):
    now = utcnow()
    document = {"eventId": "evt-crash", "traceId": "trace-c", "spanId": "span-c", "parentEventId": None,
                "topic": "order.purchased", "payload": {}, "payloadType": "application/json",
                "initiator": {"service": "order-service"}, "occurredAt": now, "sentAt": None,
                "contractVersion": 1, "partitionKey": None, "sequence": None, "expireAt": None,
                "status": "PENDING", "statusAt": now - timedelta(minutes=5), "retryCount": 0, "lastSentAt": None,
                "lastError": None, "consumers": list(CONSUMERS), "createdAt": now}
    assert bus.store.insert_event(document)  # stored, then the process died before its rows
    assert bus.store.lease_for_relay("evt-crash", now, now + timedelta(seconds=60)) is not None
    assert bus.relay_pending().published == ()  # leased by another relay
    assert bus.store.lease_for_relay("evt-crash", now, now + timedelta(seconds=60)) is None
    monkeypatch.setattr(bus_service, "utcnow", lambda: now + timedelta(seconds=61))  # the lease is over
    assert bus.relay_pending().published == ("evt-crash",)
    assert [(r["consumerId"], r["attemptNo"]) for r in rows(bus, "evt-crash")] == [
        ("member-service", 0), ("message-service", 0)]
    assert "relayLeaseUntil" not in bus.store.get_event("evt-crash")


# --- feedback and rollup -----------------------------------------------------------------


def test_concurrent_feedback_gets_distinct_attempt_numbers(bus):
    bus.send("order.purchased", {}, event_id="evt-race")
    store = bus.store
    collisions = []
    latest, insert = store.latest_consumption, store.insert_attempt

    def slow_latest(*args):
        found = latest(*args)
        time.sleep(0.001)  # widen the read → insert window so writers collide
        return found

    def counting(row):
        inserted = insert(row)
        if not inserted:  # the attempt number was taken
            collisions.append(row["attemptNo"])
        return inserted

    store.latest_consumption, store.insert_attempt = slow_latest, counting
    barrier = threading.Barrier(12, timeout=60)
    results, errors = [], []

    def report():
        barrier.wait(5)
        for n in range(4):
            try:
                results.append(bus.record_feedback("evt-race", "member-service", n % 2 == 0, "boom")["attemptNo"])
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=report) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(results) == list(range(1, 49))
    assert collisions, "the writers never collided: the test did not exercise the unique attempt number"
    numbers = [r["attemptNo"] for r in rows(bus, "evt-race") if r["consumerId"] == "member-service"]
    assert sorted(numbers) == list(range(0, 49))


def test_feedback_for_an_unknown_event_or_an_unexpected_consumer_stores_nothing(bus):
    bus.send("order.purchased", {}, event_id="evt-fb")
    with pytest.raises(EventNotFound):
        bus.record_feedback("evt-missing", "member-service", True)
    with pytest.raises(ConsumerNotExpected):
        bus.record_feedback("evt-fb", "other-service", True)
    with pytest.raises(EnvelopeValidationError):
        bus.record_feedback("evt-fb", "member-service", "yes")
    assert len(rows(bus, "evt-fb")) == 2


def test_rollup_writes_only_status_and_is_idempotent(bus, monkeypatch):
    bus.send("order.purchased", {}, event_id="evt-roll")
    before = bus.store.get_event("evt-roll")
    assert (before["status"], before["statusRevision"]) == ("SENT", 1)
    rolled_at = before["statusAt"] + timedelta(milliseconds=1)
    monkeypatch.setattr(bus_service, "utcnow", lambda: rolled_at)  # the bus's clock from here on
    bus.record_feedback("evt-roll", "member-service", True)
    assert bus.store.get_event("evt-roll") == before  # still SENT: nothing written
    bus.record_feedback("evt-roll", "message-service", False, "template missing")
    partial = bus.store.get_event("evt-roll")
    assert partial == {**before, "status": "PARTIAL", "statusAt": rolled_at, "statusRevision": 2}
    for _ in range(3):
        assert bus.rollup("evt-roll") == "PARTIAL"
    assert bus.store.get_event("evt-roll") == partial  # statusAt and statusRevision too
    bus.record_feedback("evt-roll", "message-service", True)
    assert bus.store.get_event("evt-roll")["status"] == "CONSUMED"
    assert bus.rollup("evt-missing") is None


def test_a_rollup_that_read_a_stale_status_cannot_overwrite(bus):
    bus.send("order.purchased", {}, event_id="evt-cas")
    event = bus.store.get_event("evt-cas")
    assert bus.store.set_status_if("evt-cas", "SENT", event["statusRevision"] - 1, "FAILED", utcnow()) is False
    assert bus.store.set_status_if("evt-cas", "PARTIAL", event["statusRevision"], "FAILED", utcnow()) is False
    assert bus.store.get_event("evt-cas") == event


def test_a_rollup_that_read_before_a_status_write_of_the_same_millisecond_reads_again(bus, monkeypatch):
    frozen = utcnow()
    monkeypatch.setattr(bus_service, "utcnow", lambda: frozen)  # every status write below: one statusAt
    failed_event(bus, "evt-same-ms")
    bus.repush("evt-same-ms", requested_by="alice")
    read = bus.store.get_event("evt-same-ms")
    assert (read["status"], read["statusAt"], read["statusRevision"]) == ("RETRYING", frozen, 3)
    store = bus.store
    read_rows, write_status = store.latest_consumptions, store.set_status_if
    writes = []

    def rows_then_a_repush(event_id):
        latest = read_rows(event_id)
        if not writes:  # between the rollup's reads and its write: RETRYING again, at the statusAt it read
            bus.repush(event_id, requested_by="bob")
        return latest

    def recorded(event_id, expected_status, expected_revision, status, now):
        done = write_status(event_id, expected_status, expected_revision, status, now)
        writes.append((expected_status, expected_revision, status, done))
        return done

    monkeypatch.setattr(store, "latest_consumptions", rows_then_a_repush)
    monkeypatch.setattr(store, "set_status_if", recorded)
    assert bus.rollup("evt-same-ms") == "FAILED"
    assert writes == [("RETRYING", 3, "FAILED", False), ("RETRYING", 4, "FAILED", True)]
    event = bus.store.get_event("evt-same-ms")
    assert (event["status"], event["statusAt"], event["statusRevision"], event["retryCount"]) == (
        "FAILED", frozen, 5, 2)


def test_the_resweep_repairs_statuses_a_lost_rollup_left_behind(bus, monkeypatch):
    """Feedback stored but its rollup lost (a queue that took it and a worker that died): the status stays
    SENT until the resweep rolls it up; settled and recent events are left alone."""
    from wow_django.tasks import resweep_statuses

    bus.send("order.purchased", {}, event_id="evt-lost-rollup")
    bus.send("order.purchased", {}, event_id="evt-untouched")
    monkeypatch.setattr(bus, "queue_rollup", lambda event_id: None)  # every rollup is lost
    bus.record_feedback("evt-lost-rollup", "member-service", True)
    bus.record_feedback("evt-lost-rollup", "message-service", True)
    assert bus.store.get_event("evt-lost-rollup")["status"] == "SENT"
    assert bus.resweep(older_than_s=3600)["checked"] == 0  # too recent: its rollup may be in flight
    later = utcnow() + timedelta(seconds=1)
    monkeypatch.setattr(bus_service, "utcnow", lambda: later)  # both events are a second old now
    report = bus.resweep(older_than_s=0.5)
    assert report["changed"] == {"evt-lost-rollup": "CONSUMED"} and report["checked"] == 2
    assert bus.store.get_event("evt-lost-rollup")["status"] == "CONSUMED"
    assert bus.store.get_event("evt-untouched")["status"] == "SENT"
    assert resweep_statuses.run(older_than_s=0.5) == {"checked": 1, "changed": {}}  # the task: the same call


def test_retention_purges_settled_and_expired_events_with_their_history(bus_store, monkeypatch):
    """BUS_RETENTION_DAYS / BUS_EXPIRED_RETENTION_DAYS: the purge (Python API, Celery task, management
    command) deletes CONSUMED events and expired ones past retention, with their feedback and re-push
    audit; events in flight or failed stay. No retention set: nothing is purged and the command says so."""
    from wow_django.tasks import beat_schedule, purge_events

    settings = bus_settings(bus_store, BUS_RETENTION_DAYS=7, BUS_EXPIRED_RETENTION_DAYS=1)
    with override_settings(WOW=settings):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        start = utcnow()
        bus.send("order.purchased", {}, event_id="evt-done")
        bus.send("order.purchased", {}, event_id="evt-waiting")
        bus.send("order.purchased", {}, event_id="evt-failed")
        bus.send("order.purchased", {}, event_id="evt-expires", expire_at=start + timedelta(hours=1))
        for consumer in CONSUMERS:
            bus.record_feedback("evt-done", consumer, True)
            bus.record_feedback("evt-failed", consumer, False, error="boom")
        bus.repush("evt-failed", requested_by="alice")
        assert [bus.store.get_event(e)["status"] for e in ("evt-done", "evt-waiting", "evt-failed")] == [
            "CONSUMED", "SENT", "RETRYING"]
        assert bus.purge() == []  # nothing is old enough yet
        assert "wow-bus-purge" in beat_schedule()

        monkeypatch.setattr(bus_service, "utcnow", lambda: start + timedelta(days=1, hours=2))
        assert purge_events.run() == 1  # the task: the expired event only (1 day after its expireAt)
        assert bus.store.get_event("evt-expires") is None and bus.store.consumption_rows(["evt-expires"]) == []

        monkeypatch.setattr(bus_service, "utcnow", lambda: start + timedelta(days=8))
        out = StringIO()
        call_command("wow_bus_purge", stdout=out)
        assert out.getvalue().strip() == "purged 1 event(s)"
        assert bus.store.get_event("evt-done") is None and bus.store.consumption_rows(["evt-done"]) == []
        for event_id in ("evt-waiting", "evt-failed"):  # in flight or failed: kept, with their history
            assert bus.store.get_event(event_id) is not None and bus.store.consumption_rows([event_id])
        assert len(bus.store.repush_history("evt-failed")) == 1

        # The command's options override the settings for one run; bad ones are refused.
        with pytest.raises(CommandError, match="is not a number of days"):
            call_command("wow_bus_purge", "--retention-days", "soon")
    with override_settings(WOW=bus_settings(bus_store)):
        assert get_bus().purge() == [] and "wow-bus-purge" not in beat_schedule()
        with pytest.raises(CommandError, match="no retention is set"):
            call_command("wow_bus_purge")
        out = StringIO()
        call_command("wow_bus_purge", "--retention-days", "0", stdout=out)
        assert out.getvalue().strip() == "purged 0 event(s)"  # nothing settled here


def test_each_feedback_queues_the_rollup_on_its_queue_and_rolls_up_inline_if_it_cannot(bus, monkeypatch):
    from wow_django.tasks import rollup_event

    bus.send("order.purchased", {}, event_id="evt-queue")
    monkeypatch.setitem(rollup_event.app.conf, "task_always_eager", False)  # as with a real broker
    queued = []
    monkeypatch.setattr(rollup_event, "apply_async", lambda args, **options: queued.append((args, options)))
    bus.record_feedback("evt-queue", "member-service", True)
    bus.record_feedback("evt-queue", "message-service", True)
    assert queued == [(("evt-queue",), {"queue": "wow.bus.rollup"})] * 2
    assert bus.store.get_event("evt-queue")["status"] == "SENT"  # the worker has not run yet

    def broker_down(args, **options):
        raise ConnectionError("redis down")

    monkeypatch.setattr(rollup_event, "apply_async", broker_down)
    bus.record_feedback("evt-queue", "message-service", True)
    assert bus.store.get_event("evt-queue")["status"] == "CONSUMED"


# --- re-push --------------------------------------------------------------------------------


def failed_event(bus, event_id="evt-r"):
    bus.send("order.purchased", {"orderId": "o"}, event_id=event_id)
    bus.record_feedback(event_id, "member-service", False, "db down", dead_lettered=True)
    bus.record_feedback(event_id, "message-service", False, "smtp down", dead_lettered=True)
    assert bus.store.get_event(event_id)["status"] == "FAILED"
    return event_id


def test_repush_a_failed_event_to_every_consumer(bus, bus_env, monkeypatch):
    failed_event(bus)
    for consumer in CONSUMERS:
        messages(bus_env, consumer)
    before = bus.store.get_event("evt-r")
    repushed_at = before["lastSentAt"] + timedelta(milliseconds=1)
    monkeypatch.setattr(bus_service, "utcnow", lambda: repushed_at)  # the bus's clock for the re-push
    result = bus.repush("evt-r", requested_by="alice")
    assert (result.retry_count, result.status, result.consumer_id, result.requested_at) == (
        1, "RETRYING", None, repushed_at)
    event = bus.store.get_event("evt-r")
    assert event == {**before, "retryCount": 1, "status": "RETRYING", "statusAt": repushed_at,
                     "lastSentAt": repushed_at, "statusRevision": before["statusRevision"] + 1}
    for consumer in CONSUMERS:
        [message] = messages(bus_env, consumer)
        assert message.payload["eventId"] == "evt-r" and "wow-target-consumer" not in message.headers
    [audit] = bus.store.repush_history("evt-r")
    assert audit == {"eventId": "evt-r", "consumerId": None, "requestedBy": "alice",
                     "requestedAt": result.requested_at, "retryCount": 1, "previousStatus": "FAILED",
                     "outcome": "published", "error": None}


def test_repush_to_one_consumer_goes_only_to_its_queue(bus, bus_env):
    bus.send("order.purchased", {}, event_id="evt-one")
    bus.record_feedback("evt-one", "member-service", True)
    bus.record_feedback("evt-one", "message-service", False, "smtp down", dead_lettered=True)
    assert bus.store.get_event("evt-one")["status"] == "PARTIAL"
    for consumer in CONSUMERS:
        messages(bus_env, consumer)
    with pytest.raises(RepushRefused) as caught:
        bus.repush("evt-one", requested_by="alice", consumer_id="member-service")
    assert caught.value.error_code == "AlreadyConsumed"
    with pytest.raises(RepushRefused) as caught:
        bus.repush("evt-one", requested_by="alice", consumer_id="other-service")
    assert caught.value.error_code == "ConsumerNotExpected"
    result = bus.repush("evt-one", requested_by="bob", consumer_id="message-service")
    assert (result.consumer_id, result.retry_count, result.status) == ("message-service", 1, "RETRYING")
    assert messages(bus_env, "member-service") == []
    [message] = messages(bus_env, "message-service")
    assert message.headers["wow-target-consumer"] == "message-service"
    assert bus.store.repush_history("evt-one")[0]["consumerId"] == "message-service"


def test_repush_conditions(bus_env):
    with override_settings(WOW={**bus_env, "BUS_REPUSH_TIMEOUT_S": 3600, "BUS_REPUSH_MAX_COUNT": 2}):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        with pytest.raises(EventNotFound):
            bus.repush("evt-none", requested_by="alice")
        bus.send("order.purchased", {}, event_id="evt-sent")
        with pytest.raises(RepushRefused) as caught:
            bus.repush("evt-sent", requested_by="alice")
        assert caught.value.error_code == "RepushTooEarly" and "3600s" in str(caught.value)
        bus.record_feedback("evt-sent", "member-service", True)
        bus.record_feedback("evt-sent", "message-service", True)
        with pytest.raises(RepushRefused, match="every consumer has consumed it") as caught:
            bus.repush("evt-sent", requested_by="alice")
        assert caught.value.error_code == "RepushNotAllowed" and error_response(caught.value).status_code == 409
        failed_event(bus, "evt-limit")
        bus.repush("evt-limit", requested_by="alice")
        bus.repush("evt-limit", requested_by="alice")  # RETRYING may be re-pushed again
        with pytest.raises(RepushRefused) as caught:
            bus.repush("evt-limit", requested_by="alice")
        assert caught.value.error_code == "RepushLimitReached"
        assert bus.store.get_event("evt-limit")["retryCount"] == 2
        bus.send("order.purchased", {}, event_id="evt-exp", expire_at=utcnow() + timedelta(milliseconds=300))
        bus.record_feedback("evt-exp", "member-service", False, "x", dead_lettered=True)
        time.sleep(0.35)
        with pytest.raises(RepushRefused) as caught:
            bus.repush("evt-exp", requested_by="alice")
        assert caught.value.error_code == "EventExpired"
        with pytest.raises(ValueError, match="requested_by"):
            bus.repush("evt-limit", requested_by="")
    with override_settings(WOW={**bus_env, "BUS_REPUSH_TIMEOUT_S": 0}):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        bus.send("order.purchased", {}, event_id="evt-slow")
        assert bus.repush("evt-slow", requested_by="alice").status == "RETRYING"  # SENT past the timeout


def test_concurrent_repushes_never_exceed_the_maximum(bus_env):
    with override_settings(WOW={**bus_env, "BUS_REPUSH_MAX_COUNT": 3}):
        bus = get_bus()
        for consumer in CONSUMERS:
            bus.set_topic_consumer("order.purchased", consumer)
        failed_event(bus, "evt-many")
        outcomes = []

        def repush():
            try:
                outcomes.append(bus.repush("evt-many", requested_by="ops").retry_count)
            except RepushRefused as exc:
                outcomes.append(exc.error_code)

        threads = [threading.Thread(target=repush) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(o for o in outcomes if isinstance(o, int)) == [1, 2, 3]
        assert {o for o in outcomes if isinstance(o, str)} <= {"RepushLimitReached", "RepushConflict"}
        assert bus.store.get_event("evt-many")["retryCount"] == 3
        assert len(bus.store.repush_history("evt-many")) == 3


def test_a_repush_that_cannot_publish_is_counted_and_audited_as_failed(bus, monkeypatch):
    failed_event(bus, "evt-rp-down")

    def down(*args, **kwargs):
        raise TransportUnavailable("broker unreachable (test)")

    monkeypatch.setattr(bus.transport, "publish", down)
    with pytest.raises(TransportUnavailable):
        bus.repush("evt-rp-down", requested_by="alice")
    [audit] = bus.store.repush_history("evt-rp-down")
    assert audit["outcome"] == "failed" and "unreachable" in audit["error"]
    assert bus.store.get_event("evt-rp-down")["lastError"].startswith("broker unreachable")


# --- trace, detail, listing --------------------------------------------------------------------


def make_trace(bus):
    for topic in ("points.added", "notification.sent"):
        bus.set_topic_consumer(topic, "message-service")
    t0 = utcnow() - timedelta(minutes=1)
    bus.send("order.purchased", {"orderId": "o-1"}, event_id="evt-root", trace_id="trace-T",
             occurred_at=t0, initiator={"service": "order-service", "userId": "user-A"})
    bus.send("points.added", {"points": 19}, event_id="evt-points", trace_id="trace-T",
             parent_event_id="evt-root", occurred_at=t0 + timedelta(seconds=1),
             initiator={"service": "member-service"})
    bus.send("notification.sent", {}, event_id="evt-notice", trace_id="trace-T", parent_event_id="evt-root",
             occurred_at=t0 + timedelta(seconds=2), initiator={"service": "message-service"})
    bus.send("notification.sent", {}, event_id="evt-notice-2", trace_id="trace-T", parent_event_id="evt-points",
             occurred_at=t0 + timedelta(seconds=3), initiator={"service": "message-service"})
    bus.send("order.purchased", {"orderId": "o-2"}, event_id="evt-other", trace_id="trace-U",
             initiator={"service": "order-service"})
    bus.record_feedback("evt-root", "member-service", True)


def test_trace_time_line_and_tree(bus):
    make_trace(bus)
    trace = bus.trace("trace-T")
    assert trace["total"] == 4 and not trace["truncated"]
    assert [e["eventId"] for e in trace["timeline"]] == ["evt-root", "evt-points", "evt-notice", "evt-notice-2"]
    [root] = trace["tree"]
    assert root["eventId"] == "evt-root" and root["consumption"]["text"] == "1/2 consumed"
    assert [c["eventId"] for c in root["children"]] == ["evt-points", "evt-notice"]
    assert [c["eventId"] for c in root["children"][0]["children"]] == ["evt-notice-2"]
    assert root["occurredAt"].endswith("Z")
    with pytest.raises(TraceNotFound):
        bus.trace("trace-none")


def test_event_detail_with_feedback_history_parent_and_children(bus):
    make_trace(bus)
    bus.record_feedback("evt-points", "message-service", False, "smtp down", retrying=True)
    detail = bus.event_detail("evt-points")
    assert detail["event"]["eventId"] == "evt-points" and detail["event"]["consumption"]["text"] == "0/1 consumed"
    assert detail["parent"]["eventId"] == "evt-root"
    assert [c["eventId"] for c in detail["children"]] == ["evt-notice-2"]
    [consumer] = detail["consumers"]
    assert consumer["consumerId"] == "message-service" and consumer["state"] == "WAITING"
    assert [(a["attemptNo"], a["success"], a["error"]) for a in consumer["attempts"]] == [
        (0, None, None), (1, False, "smtp down")]
    root = bus.event_detail("evt-root")
    assert root["parent"] is None and [c["eventId"] for c in root["children"]] == ["evt-points", "evt-notice"]
    assert {c["consumerId"]: c["state"] for c in root["consumers"]} == {"member-service": "CONSUMED",
                                                                       "message-service": "WAITING"}
    with pytest.raises(EventNotFound):
        bus.event_detail("evt-none")


def test_list_and_filter_events(bus):
    make_trace(bus)
    bus.record_feedback("evt-other", "member-service", False, "x", dead_lettered=True)
    everything = bus.list_events()
    assert everything["total"] == 5 and everything["list"][0]["eventId"] == "evt-other"  # newest first
    assert {e["eventId"] for e in bus.list_events(topic="notification.sent")["list"]} == {"evt-notice",
                                                                                          "evt-notice-2"}
    assert [e["eventId"] for e in bus.list_events(status="FAILED")["list"]] == ["evt-other"]
    assert {e["eventId"] for e in bus.list_events(service="message-service")["list"]} == {"evt-notice",
                                                                                          "evt-notice-2"}
    assert bus.list_events(trace_id="trace-T")["total"] == 4
    since = bus.store.get_event("evt-notice")["occurredAt"]
    assert {e["eventId"] for e in bus.list_events(since=since, topic="notification.sent")["list"]} == {
        "evt-notice", "evt-notice-2"}
    assert [e["eventId"] for e in bus.list_events(until=since)["list"]] == ["evt-points", "evt-root"]
    page = bus.list_events(page=2, size=2)
    assert page["total"] == 5 and len(page["list"]) == 2 and (page["page"], page["size"]) == (2, 2)
    with pytest.raises(EnvelopeValidationError) as caught:
        bus.list_events(status="DONE", since="soon", page=0, size=10_000)
    assert {e["name"] for e in caught.value.binding_errors} == {"status", "since", "page", "size"}


def test_topic_consumers_are_unique_per_topic_and_consumer(bus):
    saved = bus.set_topic_consumer("order.purchased", "member-service", enabled=False, description="paused",
                                   updated_by="alice")
    assert saved["enabled"] is False and saved["description"] == "paused" and saved["updatedBy"] == "alice"
    listed = bus.topic_consumers(topic="order.purchased")
    assert [(c["consumerId"], c["enabled"]) for c in listed] == [("member-service", False), ("message-service", True)]
    assert bus.store.enabled_consumers("order.purchased") == ["message-service"]
    with pytest.raises(EnvelopeValidationError):
        bus.set_topic_consumer("order.*", "member-service")
    with pytest.raises(EnvelopeValidationError):
        bus.set_topic_consumer("order.purchased", "bad id")


# --- inbox and sequences ----------------------------------------------------------------------------


def test_inbox_claims_once_then_done_released_or_taken_over(bus):
    inbox = Inbox(bus.store, "member-service", lease_s=60)
    first = inbox.claim("evt-1")
    assert first.state == CLAIMED and inbox.claim("evt-1").state == BUSY
    assert inbox.done("evt-1", first.token) and inbox.claim("evt-1").state == DONE
    second = inbox.claim("evt-2")
    inbox.release("evt-2", second.token)
    again = inbox.claim("evt-2")
    assert again.state == CLAIMED and again.token != second.token
    short = Inbox(bus.store, "message-service", lease_s=0.05)
    crashed = short.claim("evt-3")
    time.sleep(0.06)
    taken = short.claim("evt-3")
    assert taken.state == CLAIMED
    assert short.done("evt-3", crashed.token) is False  # the crashed worker's claim is gone
    assert short.done("evt-3", taken.token) and short.state("evt-3") == "done"
    other = Inbox(bus.store, "other-service")
    assert other.claim("evt-1").state == CLAIMED  # keyed by consumer and event


def test_sequence_tracker_drops_stale_sequences(bus):
    tracker = SequenceTracker(bus.store, "member-service")
    assert tracker.last("o-1") is None and not tracker.is_stale("o-1", 1)
    assert tracker.accept("o-1", 5) and not tracker.accept("o-1", 4) and not tracker.accept("o-1", 5)
    assert tracker.accept("o-1", 6) and tracker.last("o-1") == 6
    tracker.advance("o-1", 3)
    assert tracker.last("o-1") == 6  # never lowered
    tracker.advance("o-2", 2)
    assert tracker.is_stale("o-2", 2) and not tracker.is_stale("o-2", 3)
    assert SequenceTracker(bus.store, "message-service").last("o-1") is None


# --- schema ------------------------------------------------------------------------------------------

BUS_INDEXES = {
    "events": {
        "_id_": {"_id": 1},
        "eventId_1": {"eventId": 1},
        "status_1_occurredAt_-1": {"status": 1, "occurredAt": -1},
        "topic_1_occurredAt_-1": {"topic": 1, "occurredAt": -1},
        "traceId_1_occurredAt_1": {"traceId": 1, "occurredAt": 1},
        "initiator.service_1_occurredAt_-1": {"initiator.service": 1, "occurredAt": -1},
        "parentEventId_1": {"parentEventId": 1},
        "status_1_statusAt_1_eventId_1": {"status": 1, "statusAt": 1, "eventId": 1},
        "expireAt_1_statusAt_1_eventId_1": {"expireAt": 1, "statusAt": 1, "eventId": 1},
        "occurredAt_-1_eventId_1": {"occurredAt": -1, "eventId": 1},
        "status_1_occurredAt_-1_eventId_1": {"status": 1, "occurredAt": -1, "eventId": 1},
        "topic_1_occurredAt_-1_eventId_1": {"topic": 1, "occurredAt": -1, "eventId": 1},
        "initiator.service_1_occurredAt_-1_eventId_1": {"initiator.service": 1, "occurredAt": -1, "eventId": 1},
        "initiator.userId_1_occurredAt_-1_eventId_1": {"initiator.userId": 1, "occurredAt": -1, "eventId": 1},
        "initiator.clientRequestId_1_occurredAt_-1_eventId_1": {"initiator.clientRequestId": 1, "occurredAt": -1,
                                                                "eventId": 1},
        "searchKeys_1_occurredAt_-1_eventId_1": {"searchKeys": 1, "occurredAt": -1, "eventId": 1},
    },
    "topic_consumers": {
        "_id_": {"_id": 1},
        "topic_1_consumerId_1": {"topic": 1, "consumerId": 1},
        "topic_1_enabled_1": {"topic": 1, "enabled": 1},
    },
    "event_consumptions": {
        "_id_": {"_id": 1},
        "eventId_1": {"eventId": 1},
        "eventId_1_consumerId_1_attemptNo_-1": {"eventId": 1, "consumerId": 1, "attemptNo": -1},
        "eventId_1_consumerId_1_consumedAt_-1": {"eventId": 1, "consumerId": 1, "consumedAt": -1},
        "consumerId_1_consumedAt_-1": {"consumerId": 1, "consumedAt": -1},
    },
    "consumer_inbox": {"_id_": {"_id": 1}, "consumerId_1_eventId_1": {"consumerId": 1, "eventId": 1},
                       "eventId_1": {"eventId": 1}},
    "consumer_sequences": {"_id_": {"_id": 1}, "consumerId_1_partitionKey_1": {"consumerId": 1, "partitionKey": 1}},
    "event_repushes": {"_id_": {"_id": 1}, "eventId_1_requestedAt_-1": {"eventId": 1, "requestedAt": -1}},
}
UNIQUE = {"eventId_1", "topic_1_consumerId_1", "eventId_1_consumerId_1_attemptNo_-1", "consumerId_1_eventId_1",
          "consumerId_1_partitionKey_1"}


def index_names(database):
    out = {}
    for name in BUS_INDEXES:
        out[name] = {ix["name"]: dict(ix["key"]) for ix in database[name].list_indexes()}
    return out


def unique_indexes(database):
    return {ix["name"] for name in BUS_INDEXES for ix in database[name].list_indexes() if ix.get("unique")}


@pytest.mark.parametrize("bus_store", ["mongo"])
def test_the_bus_collections_get_the_pinned_indexes_on_first_use(bus):
    failed_event(bus)
    bus.repush("evt-r", requested_by="alice")
    Inbox(bus.store, "member-service").claim("evt-r")
    SequenceTracker(bus.store, "member-service").advance("p", 1)
    database = bus.store.database
    assert index_names(database) == BUS_INDEXES
    assert unique_indexes(database) == UNIQUE


@pytest.mark.parametrize("bus_store", ["mongo"])
def test_wow_init_schema_creates_the_bus_collections(bus_env):
    out = StringIO()
    call_command("wow_init_schema", stdout=out)
    database = get_bus().store.database
    assert index_names(database) == BUS_INDEXES
    assert unique_indexes(database) == UNIQUE
    assert "created   " in out.getvalue() and ".events eventId_1" in out.getvalue()
    check = StringIO()
    call_command("wow_init_schema", "--check", stdout=check)
    assert "verified  " in check.getvalue() and ".event_consumptions eventId_1_consumerId_1_attemptNo_-1" \
        in check.getvalue()


@pytest.mark.parametrize("bus_store", ["in_memory"])
def test_the_in_memory_bus_store_leaves_mongodb_alone(bus, bus_env):
    from wow_django.backends.memory.bus_store import InMemoryBusStore
    from wow_django.backends.mongo import get_connection

    assert isinstance(bus.store, InMemoryBusStore)
    failed_event(bus)
    bus.repush("evt-r", requested_by="alice")
    out = StringIO()
    call_command("wow_init_schema", stdout=out)
    assert ".events " not in out.getvalue() and "consumer_inbox" not in out.getvalue()
    database = get_connection().database(bus_env["MONGO_URI"].rsplit("/", 1)[1])
    assert not set(BUS_INDEXES) & set(database.list_collection_names())
    with override_settings(WOW={**bus_env, "BUS_STORE": None, "STORAGE": "in_memory"}):
        assert isinstance(get_bus().store, InMemoryBusStore)  # None: WOW['STORAGE']
        assert get_bus().store.get_event("evt-r") is None  # new settings, a new store


def test_events_page_walks_the_list_by_cursor_and_refuses_a_bad_cursor(bus):
    bus.set_topic_consumer("order.paged", "member-service")
    for n in range(5):
        bus.send("order.paged", {"n": n}, event_id=f"evt-page-{n}", occurred_at=f"2024-01-01T00:00:0{n}Z")
    query = bus.query_of(topic="order.paged")
    seen, cursor = [], None
    while True:
        page = bus.events_page(query, cursor=cursor, size=2)
        seen.append([e["eventId"] for e in page["list"]])
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [["evt-page-4", "evt-page-3"], ["evt-page-2", "evt-page-1"], ["evt-page-0"]]
    assert page["list"][0]["consumption"]["text"] == "0/1 consumed"
    for bad in ("x", "!!", "WzEsMl0", "bm90IGpzb24"):
        with pytest.raises(EnvelopeValidationError) as caught:
            bus.events_page(query, cursor=bad)
        assert caught.value.binding_errors[0]["name"] == "cursor"
    with pytest.raises(EnvelopeValidationError):
        bus.query_of(status="DONE", since="yesterday")


def test_repush_refusal_says_why_before_anything_changes(bus):
    bus.set_topic_consumer("order.refused", "member-service")
    bus.send("order.refused", {}, event_id="evt-refused")
    event = bus.store.get_event("evt-refused")
    assert bus.repush_refusal(event).error_code == "RepushTooEarly"
    assert bus.repush_refusal(event, "nobody").error_code == "ConsumerNotExpected"
    bus.record_feedback("evt-refused", "member-service", False, "boom")
    event = bus.store.get_event("evt-refused")
    assert event["status"] == "FAILED" and bus.repush_refusal(event) is None
    assert bus.store.get_event("evt-refused")["retryCount"] == 0

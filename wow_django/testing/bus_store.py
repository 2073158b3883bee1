"""The bus-store contract (DESIGN part H): what :class:`~wow_django.persistence.bus.BusStore` promises.

One mixin per concern of the store (``TopicConsumerRecordsContract``,
``EventRecordsContract``, ``ConsumptionRecordsContract``, ``InboxRecordsContract``,
``SequenceRecordsContract``, ``RepushAuditContract``, and ``PurgeContract`` across them); :class:`BusStoreContract`
is all of them. Mix into ``unittest.TestCase`` and implement ``make_store``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from wow_django.exceptions import ConsumerNotExpected
from wow_django.persistence.bus import BusStore, EventQuery, EventStatus, status_revision
from wow_django.testing._case import TestCaseMixin

if TYPE_CHECKING:
    from wow_django.backends.mongo.bus_store import MongoBusStore

T0 = datetime(2024, 2, 28, 10, 0, 0)


def make_event(event_id: str | None = None, *, topic: str = "order.purchased", trace_id: str = "trace-1",
               occurred_at: datetime = T0, status: str = "PENDING", consumers=("member-service",),
               **fields) -> dict:
    """An ``events`` document as :meth:`EventBus.send` stores it; ``fields`` override any key."""
    event = {
        "eventId": event_id or f"evt-{uuid.uuid4()}", "traceId": trace_id, "spanId": "span-1",
        "parentEventId": None, "topic": topic, "payload": {"orderId": "o-1", "lines": [{"sku": "a", "qty": 2}]},
        "payloadType": "application/json",
        "initiator": {"service": "order-service", "operation": "pay", "userId": "user-A", "clientRequestId": None},
        "occurredAt": occurred_at, "sentAt": None, "contractVersion": 1, "partitionKey": None, "sequence": None,
        "expireAt": None, "status": status, "statusAt": occurred_at, "retryCount": 0, "lastSentAt": None,
        "lastError": None, "consumers": list(consumers), "createdAt": occurred_at,
    }
    event.update(fields)
    return event


def feedback_fields(success: bool | None, at: datetime = T0, **extra) -> dict:
    return {"success": success, "consumedAt": at, "error": None if success else "failed", "source": "sdk",
            "retrying": False, "deadLettered": False, "createdAt": at, **extra}


def run_together(count: int, fn: Callable[[int], object]) -> tuple[list, list]:
    """Run ``fn(i)`` in ``count`` threads released at once; ``(results, errors)``."""
    barrier = threading.Barrier(count, timeout=60)
    results: list = []
    errors: list = []
    lock = threading.Lock()

    def run(index: int) -> None:
        barrier.wait(10)
        try:
            value = fn(index)
        except Exception as exc:  # collected and asserted by the caller
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(value)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors


class BusStoreCase(TestCaseMixin):
    """What every mixin below shares: ``self.store`` built by :meth:`make_store` for each test.

    Each mixin calls only the methods of its own concern, so a store that
    implements one concern (e.g. an :class:`~wow_django.persistence.bus.InboxRecords`)
    can be proved with that mixin alone.
    """

    def make_store(self) -> BusStore:  # pragma: no cover - abstract
        raise NotImplementedError("return the bus store under test")

    def setUp(self) -> None:
        super().setUp()
        self.store = self.make_store()


class TopicConsumerRecordsContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.TopicConsumerRecords`: ``topic_consumers``."""

    def test_set_topic_consumer_creates_then_updates_one_record(self):
        created = self.store.set_topic_consumer("order.purchased", "member-service", enabled=True, description=None,
                                                updated_by=None)
        self.assertEqual(set(created), {"topic", "consumerId", "enabled", "description", "createdAt", "updatedAt",
                                        "updatedBy"})
        self.assertEqual((created["topic"], created["consumerId"], created["enabled"], created["description"],
                          created["updatedBy"]), ("order.purchased", "member-service", True, "", None))
        self.assertEqual(created["createdAt"], created["updatedAt"])
        updated = self.store.set_topic_consumer("order.purchased", "member-service", enabled=False,
                                                description="paused", updated_by="alice")
        self.assertEqual((updated["enabled"], updated["description"], updated["updatedBy"]), (False, "paused", "alice"))
        self.assertEqual(updated["createdAt"], created["createdAt"])
        self.assertGreaterEqual(updated["updatedAt"], created["updatedAt"])
        again = self.store.set_topic_consumer("order.purchased", "member-service", enabled=True, description=None,
                                              updated_by="bob")
        self.assertEqual((again["enabled"], again["description"]), (True, "paused"))  # None keeps the description
        self.assertEqual(self.store.list_topic_consumers(), [again])

    def test_enabled_consumers_are_those_of_the_topic_sorted(self):
        for topic, consumer, enabled in (("order.purchased", "message-service", True),
                                         ("order.purchased", "member-service", True),
                                         ("order.purchased", "audit-service", False),
                                         ("order.refunded", "billing-service", True)):
            self.store.set_topic_consumer(topic, consumer, enabled=enabled, description=None, updated_by=None)
        self.assertEqual(self.store.enabled_consumers("order.purchased"), ["member-service", "message-service"])
        self.assertEqual(self.store.enabled_consumers("order.refunded"), ["billing-service"])
        self.assertEqual(self.store.enabled_consumers("order.unknown"), [])

    def test_list_topic_consumers_filters_and_sorts_by_topic_then_consumer(self):
        for topic, consumer in (("b.topic", "z-service"), ("a.topic", "z-service"), ("b.topic", "a-service")):
            self.store.set_topic_consumer(topic, consumer, enabled=True, description=None, updated_by=None)
        pairs = [(r["topic"], r["consumerId"]) for r in self.store.list_topic_consumers()]
        self.assertEqual(pairs, [("a.topic", "z-service"), ("b.topic", "a-service"), ("b.topic", "z-service")])
        self.assertEqual([r["consumerId"] for r in self.store.list_topic_consumers(topic="b.topic")],
                         ["a-service", "z-service"])
        self.assertEqual([r["topic"] for r in self.store.list_topic_consumers(consumer_id="z-service")],
                         ["a.topic", "b.topic"])
        self.assertEqual(self.store.list_topic_consumers(topic="a.topic", consumer_id="a-service"), [])

    def test_concurrent_saves_of_one_topic_consumer_leave_one_record(self):
        results, errors = run_together(8, lambda i: self.store.set_topic_consumer(
            "order.purchased", "member-service", enabled=i % 2 == 0, description=f"d{i}", updated_by=f"u{i}"))
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 8)
        [record] = self.store.list_topic_consumers()
        self.assertEqual(record["consumerId"], "member-service")


class EventRecordsContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.EventRecords`: ``events``, their status, listing and trace reads."""

    def insert(self, *events: dict) -> None:
        for event in events:
            self.assertTrue(self.store.insert_event(event))

    def ids(self, events: list[dict]) -> list[str]:
        return [e["eventId"] for e in events]

    def find(self, **query) -> list[str]:
        total, page = self.store.find_events(EventQuery(**query), skip=0, limit=100)
        self.assertEqual(total, len(page))
        return self.ids(page)

    def total(self, **query) -> int:
        """How many events match ``query``: the total of a one-event page."""
        total, page = self.store.find_events(EventQuery(**query), skip=0, limit=1)
        self.assertEqual(len(page), min(total, 1))
        return total

    def test_an_event_round_trips_as_a_copy_with_millisecond_times(self):
        event = make_event("evt-1", occurred_at=datetime(2024, 2, 28, 10, 0, 0, 123456))
        self.insert(event)
        stored = self.store.get_event("evt-1")
        self.assertEqual(stored, {**event, "occurredAt": datetime(2024, 2, 28, 10, 0, 0, 123000),
                                  "statusAt": datetime(2024, 2, 28, 10, 0, 0, 123000),
                                  "createdAt": datetime(2024, 2, 28, 10, 0, 0, 123000)})
        event["payload"]["orderId"] = "changed after insert"
        stored["payload"]["lines"].append("changed after read")
        stored["status"] = "CONSUMED"
        again = self.store.get_event("evt-1")
        self.assertEqual(again["payload"], {"orderId": "o-1", "lines": [{"sku": "a", "qty": 2}]})
        self.assertEqual(again["status"], "PENDING")
        self.assertIsNone(self.store.get_event("evt-unknown"))

    def test_tuples_are_stored_as_lists_and_enum_values_as_their_values(self):
        self.insert(make_event("evt-plain", status=EventStatus.SENT, consumers=("b-service", "a-service"),
                               payload={"pair": (1, 2)}))
        stored = self.store.get_event("evt-plain")
        self.assertEqual((stored["status"], stored["consumers"], stored["payload"]),
                         ("SENT", ["b-service", "a-service"], {"pair": [1, 2]}))
        self.assertEqual(self.find(status="SENT"), ["evt-plain"])

    def test_get_event_with_fields_gives_only_those(self):
        self.insert(make_event("evt-f", status="SENT"))
        self.assertEqual(self.store.get_event("evt-f", fields=("status", "statusAt", "consumers", "nothing")),
                         {"status": "SENT", "statusAt": T0, "consumers": ["member-service"]})
        self.assertEqual(self.store.get_event("evt-f", fields=["eventId"]), {"eventId": "evt-f"})
        self.assertEqual(self.store.get_event("evt-f", fields=[]), {})
        self.assertIsNone(self.store.get_event("evt-none", fields=["status"]))

    def test_get_events_reads_many_events_as_get_event_reads_each(self):
        self.insert(*(make_event(f"evt-m{n}", status="SENT" if n % 2 else "PENDING", payload={"n": n})
                      for n in range(5)))
        wanted = ["evt-m3", "evt-none", "evt-m0", "evt-m3", "evt-m4"]
        self.assertEqual(self.store.get_events(wanted),
                         {i: self.store.get_event(i) for i in ("evt-m3", "evt-m0", "evt-m4")})
        fields = ("status", "statusRevision", "consumers", "nothing")
        self.assertEqual(self.store.get_events(wanted, fields=fields),
                         {i: self.store.get_event(i, fields=fields) for i in ("evt-m3", "evt-m0", "evt-m4")})
        self.assertEqual(self.store.get_events(["evt-m1"], fields=["eventId"]), {"evt-m1": {"eventId": "evt-m1"}})
        self.assertEqual(self.store.get_events([]), {})
        self.assertEqual(self.store.get_events(["evt-m2"], fields=[]), {"evt-m2": {}})
        copy = self.store.get_events(["evt-m1"])["evt-m1"]
        copy["payload"]["n"] = "changed after read"
        self.assertEqual(self.store.get_event("evt-m1")["payload"], {"n": 1})

    def test_get_events_reads_over_a_thousand_events_at_once(self):
        self.insert(*(make_event(f"evt-{n:04d}") for n in range(1, 1202)))
        ids = [f"evt-{n:04d}" for n in range(1203, 0, -1)]  # two unknown ones among them
        found = self.store.get_events(ids, fields=["status"])
        self.assertEqual(sorted(found), [f"evt-{n:04d}" for n in range(1, 1202)])
        self.assertEqual(set(map(str, found.values())), {"{'status': 'PENDING'}"})

    def test_insert_event_with_consumptions_stores_the_event_and_its_pending_rows_once(self):
        event = make_event("evt-w", consumers=["message-service", "member-service"])
        self.assertTrue(self.store.insert_event_with_consumptions(event, T0))
        self.assertEqual(self.store.get_event("evt-w"), event)
        self.assertEqual([(r["consumerId"], r["attemptNo"], r["source"], r["success"])
                          for r in self.store.consumption_rows(["evt-w"])],
                         [("member-service", 0, "send", None), ("message-service", 0, "send", None)])
        again = make_event("evt-w", consumers=["audit-service"], payload={"n": 2})
        self.assertFalse(self.store.insert_event_with_consumptions(again, T0))
        self.assertEqual(self.store.get_event("evt-w"), event)  # the first one's event and rows, unchanged
        self.assertEqual(len(self.store.consumption_rows(["evt-w"])), 2)
        results, errors = run_together(6, lambda i: self.store.insert_event_with_consumptions(
            make_event("evt-wrace", consumers=[f"c{i}-service"]), T0))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [False] * 5 + [True])
        [winner] = self.store.get_event("evt-wrace")["consumers"]
        self.assertEqual([r["consumerId"] for r in self.store.consumption_rows(["evt-wrace"])], [winner])

    def test_event_id_is_unique(self):
        self.assertTrue(self.store.insert_event(make_event("evt-dup", payload={"n": 1})))
        self.assertFalse(self.store.insert_event(make_event("evt-dup", payload={"n": 2}, status="SENT")))
        stored = self.store.get_event("evt-dup")
        self.assertEqual((stored["payload"], stored["status"]), ({"n": 1}, "PENDING"))
        self.assertEqual(self.find(), ["evt-dup"])

    def test_concurrent_inserts_of_one_event_id_store_it_once(self):
        results, errors = run_together(8, lambda i: self.store.insert_event(make_event("evt-race", payload={"n": i})))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [False] * 7 + [True])
        self.assertEqual(self.find(), ["evt-race"])

    def test_each_event_is_read_by_its_own_id(self):
        self.insert(*(make_event(f"evt-{n}", payload={"n": n}) for n in (1, 2, 3)))
        for n in (3, 1, 2):
            self.assertEqual(self.store.get_event(f"evt-{n}"), make_event(f"evt-{n}", payload={"n": n}))
        self.assertIsNone(self.store.get_event("evt-x"))

    def test_mark_sent_moves_a_pending_event_to_sent_once(self):
        self.insert(make_event("evt-s", lastError="broker down"))
        self.assertIsNotNone(self.store.lease_for_relay("evt-s", T0, T0 + timedelta(minutes=1)))
        sent_at = T0 + timedelta(seconds=5)
        self.assertTrue(self.store.mark_sent("evt-s", sent_at))
        event = self.store.get_event("evt-s")
        self.assertEqual((event["status"], event["statusAt"], event["sentAt"], event["lastSentAt"], event["lastError"],
                          event["statusRevision"]), ("SENT", sent_at, sent_at, sent_at, None, 1))
        self.assertNotIn("relayLeaseUntil", event)
        self.assertFalse(self.store.mark_sent("evt-s", sent_at + timedelta(seconds=1)))
        self.assertEqual(self.store.get_event("evt-s"), event)  # the first send time stays
        self.assertFalse(self.store.mark_sent("evt-unknown", sent_at))

    def test_mark_sent_after_the_rollup_records_the_send_time_and_keeps_the_status(self):
        self.insert(make_event("evt-fast"))
        self.assertTrue(self.store.set_status_if("evt-fast", "PENDING", 0, "CONSUMED", T0 + timedelta(seconds=1)))
        sent_at = T0 + timedelta(seconds=2)
        self.assertFalse(self.store.mark_sent("evt-fast", sent_at))
        event = self.store.get_event("evt-fast")
        self.assertEqual((event["status"], event["statusAt"], event["sentAt"], event["lastSentAt"],
                          event["statusRevision"]), ("CONSUMED", T0 + timedelta(seconds=1), sent_at, sent_at, 1))

    def test_record_send_error_keeps_2000_characters_and_ends_the_relay_lease(self):
        self.insert(make_event("evt-e"))
        self.store.lease_for_relay("evt-e", T0, T0 + timedelta(minutes=1))
        self.store.record_send_error("evt-e", "x" * 2500)
        event = self.store.get_event("evt-e")
        self.assertEqual(event["lastError"], "x" * 2000)
        self.assertNotIn("relayLeaseUntil", event)
        self.assertEqual((event["status"], status_revision(event)), ("PENDING", 0))  # not a status write
        self.store.record_send_error("evt-unknown", "nothing to record")
        self.assertEqual(self.find(), ["evt-e"])

    def test_stale_pending_lists_old_pending_events_oldest_first(self):
        self.insert(
            make_event("evt-b", occurred_at=T0 + timedelta(seconds=3), statusAt=T0),
            make_event("evt-a", occurred_at=T0 + timedelta(seconds=2), statusAt=T0),
            make_event("evt-c", occurred_at=T0 + timedelta(seconds=1), statusAt=T0),
            make_event("evt-young", occurred_at=T0, statusAt=T0 + timedelta(minutes=5)),
            make_event("evt-sent", occurred_at=T0, status="SENT", statusAt=T0),
        )
        cutoff = T0 + timedelta(minutes=1)
        self.assertEqual(self.store.stale_pending(cutoff, 10), ["evt-c", "evt-a", "evt-b"])
        self.assertEqual(self.store.stale_pending(cutoff, 2), ["evt-c", "evt-a"])
        self.assertEqual(self.store.stale_pending(T0, 10), ["evt-c", "evt-a", "evt-b"])  # statusAt ≤ cutoff
        self.assertEqual(self.store.stale_pending(T0 - timedelta(seconds=1), 10), [])

    def test_a_relay_lease_is_given_once_until_it_ends(self):
        self.insert(make_event("evt-l"), make_event("evt-sent", status="SENT"))
        until = T0 + timedelta(minutes=1)
        leased = self.store.lease_for_relay("evt-l", T0, until)
        self.assertEqual(leased, {**make_event("evt-l"), "relayLeaseUntil": until})
        self.assertEqual(self.store.get_event("evt-l")["relayLeaseUntil"], until)
        self.assertIsNone(self.store.lease_for_relay("evt-l", T0 + timedelta(seconds=59), T0 + timedelta(minutes=2)))
        again = self.store.lease_for_relay("evt-l", until, until + timedelta(minutes=1))
        self.assertEqual(again["relayLeaseUntil"], until + timedelta(minutes=1))
        self.assertIsNone(self.store.lease_for_relay("evt-sent", T0, until))
        self.assertIsNone(self.store.lease_for_relay("evt-unknown", T0, until))

    def test_concurrent_relays_lease_an_event_to_one_of_them(self):
        self.insert(make_event("evt-lr"))
        results, errors = run_together(8, lambda i: self.store.lease_for_relay("evt-lr", T0, T0 + timedelta(minutes=1)))
        self.assertEqual(errors, [])
        self.assertEqual(sum(1 for r in results if r is not None), 1)

    def test_claim_repush_counts_a_re_push_when_the_conditions_hold(self):
        now = T0 + timedelta(hours=1)
        sent_before = now - timedelta(minutes=5)
        statuses = ("FAILED", "PARTIAL", "RETRYING")
        self.insert(
            make_event("evt-failed", status="FAILED", lastSentAt=T0, retryCount=1),
            make_event("evt-partial", status="PARTIAL", lastSentAt=T0, statusRevision=4),
            make_event("evt-old-sent", status="SENT", lastSentAt=sent_before),
            make_event("evt-new-sent", status="SENT", lastSentAt=sent_before + timedelta(seconds=1)),
            make_event("evt-consumed", status="CONSUMED", lastSentAt=T0),
            make_event("evt-pending", status="PENDING"),
            make_event("evt-limit", status="FAILED", retryCount=3),
            make_event("evt-expired", status="FAILED", expireAt=now),
            make_event("evt-expiring", status="FAILED", expireAt=now + timedelta(seconds=1)),
        )

        def claim(event_id):
            return self.store.claim_repush(event_id, now=now, max_count=3, statuses=statuses, sent_before=sent_before)

        claimed = claim("evt-failed")
        self.assertEqual((claimed["retryCount"], claimed["status"], claimed["lastSentAt"], claimed["statusAt"],
                          claimed["statusRevision"]), (2, "RETRYING", now, now, 1))
        self.assertEqual(self.store.get_event("evt-failed"), claimed)
        for event_id, revision in (("evt-partial", 5), ("evt-old-sent", 1), ("evt-expiring", 1)):
            claimed = claim(event_id)
            self.assertEqual((claimed["retryCount"], claimed["statusRevision"]), (1, revision), event_id)
            self.assertEqual(self.store.get_event(event_id), claimed)
        for event_id in ("evt-new-sent", "evt-consumed", "evt-pending", "evt-limit", "evt-expired", "evt-unknown"):
            self.assertIsNone(claim(event_id), event_id)
        self.assertEqual(self.store.get_event("evt-limit"), make_event("evt-limit", status="FAILED", retryCount=3))
        self.assertEqual(self.store.get_event("evt-new-sent")["retryCount"], 0)
        again = claim("evt-failed")  # RETRYING may be re-pushed again: a status write, though the status stays
        self.assertEqual((again["retryCount"], again["status"], again["statusRevision"]), (3, "RETRYING", 2))
        self.assertIsNone(claim("evt-failed"))  # up to max_count

    def test_concurrent_repush_claims_never_exceed_the_maximum(self):
        self.insert(make_event("evt-many", status="FAILED"))
        results, errors = run_together(10, lambda i: self.store.claim_repush(
            "evt-many", now=T0, max_count=3, statuses=("FAILED", "RETRYING"), sent_before=T0))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(r["retryCount"] for r in results if r is not None), [1, 2, 3])
        self.assertEqual(sorted(r["statusRevision"] for r in results if r is not None), [1, 2, 3])
        event = self.store.get_event("evt-many")
        self.assertEqual((event["retryCount"], event["statusRevision"]), (3, 3))

    def test_set_status_if_writes_only_the_status_when_status_and_revision_are_unchanged(self):
        self.insert(make_event("evt-cas", status="SENT"), make_event("evt-no-time", status="SENT", statusAt=None),
                    make_event("evt-rev", status="SENT", statusRevision=7))
        before = self.store.get_event("evt-cas")
        self.assertNotIn("statusRevision", before)  # never written: revision 0
        later = T0 + timedelta(seconds=3)
        self.assertFalse(self.store.set_status_if("evt-cas", "SENT", 1, "FAILED", later))
        self.assertFalse(self.store.set_status_if("evt-cas", "PARTIAL", 0, "FAILED", later))
        self.assertEqual(self.store.get_event("evt-cas"), before)
        self.assertTrue(self.store.set_status_if("evt-cas", "SENT", 0, "PARTIAL", later))
        after = {**before, "status": "PARTIAL", "statusAt": later, "statusRevision": 1}
        self.assertEqual(self.store.get_event("evt-cas"), after)
        self.assertFalse(self.store.set_status_if("evt-cas", "SENT", 0, "FAILED", later))  # read before the write
        self.assertFalse(self.store.set_status_if("evt-cas", "PARTIAL", 0, "FAILED", later))  # the status, not the revision
        self.assertEqual(self.store.get_event("evt-cas"), after)
        self.assertTrue(self.store.set_status_if("evt-cas", "PARTIAL", 1, "FAILED", later))
        self.assertEqual(self.store.get_event("evt-cas"), {**after, "status": "FAILED", "statusRevision": 2})
        self.assertTrue(self.store.set_status_if("evt-no-time", "SENT", 0, "CONSUMED", later))
        self.assertFalse(self.store.set_status_if("evt-rev", "SENT", 0, "CONSUMED", later))
        self.assertTrue(self.store.set_status_if("evt-rev", "SENT", 7, "CONSUMED", later))
        self.assertEqual(self.store.get_event("evt-rev", fields=("status", "statusRevision")),
                         {"status": "CONSUMED", "statusRevision": 8})
        self.assertFalse(self.store.set_status_if("evt-unknown", "SENT", 0, "CONSUMED", later))
        with self.assertRaises(TypeError):  # a time is not a revision (the token before revisions)
            self.store.set_status_if("evt-cas", "FAILED", T0, "SENT", later)

    def test_a_stale_revision_is_refused_even_when_status_and_status_at_are_as_read(self):
        self.insert(make_event("evt-aba", status="SENT"),
                    make_event("evt-again", status="RETRYING", lastSentAt=T0 - timedelta(hours=1)))
        read = self.store.get_event("evt-aba")
        # Two writes within one millisecond (T0, as read) take the status away and back.
        self.assertTrue(self.store.set_status_if("evt-aba", "SENT", status_revision(read), "FAILED", T0))
        self.assertTrue(self.store.set_status_if("evt-aba", "FAILED", 1, "SENT", T0))
        self.assertEqual(self.store.get_event("evt-aba"), {**read, "statusRevision": 2})
        self.assertFalse(self.store.set_status_if("evt-aba", "SENT", status_revision(read), "CONSUMED", T0))
        self.assertEqual(self.store.get_event("evt-aba"), {**read, "statusRevision": 2})
        # A re-push of a RETRYING event at the statusAt read keeps status and statusAt; the revision moves.
        read = self.store.get_event("evt-again")
        claimed = self.store.claim_repush("evt-again", now=T0, max_count=5, statuses=("RETRYING",), sent_before=T0)
        self.assertEqual((claimed["status"], claimed["statusAt"]), (read["status"], read["statusAt"]))
        self.assertFalse(self.store.set_status_if("evt-again", "RETRYING", status_revision(read), "FAILED", T0))
        self.assertTrue(self.store.set_status_if("evt-again", "RETRYING", status_revision(claimed), "FAILED", T0))

    def test_concurrent_status_writes_from_one_revision_have_one_winner(self):
        self.insert(make_event("evt-cas-race", status="SENT"))
        results, errors = run_together(8, lambda i: self.store.set_status_if(
            "evt-cas-race", "SENT", 0, ("FAILED", "PARTIAL")[i % 2], T0))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [False] * 7 + [True])
        self.assertEqual(self.store.get_event("evt-cas-race")["statusRevision"], 1)

    # --- listing --------------------------------------------------------------------------

    def listing_events(self) -> None:
        self.insert(
            make_event("evt-1", occurred_at=T0, status="CONSUMED", trace_id="trace-A"),
            make_event("evt-2", occurred_at=T0 + timedelta(seconds=1), topic="points.added", trace_id="trace-A",
                       initiator={"service": "member-service"}, parentEventId="evt-1"),
            make_event("evt-3", occurred_at=T0 + timedelta(seconds=2), status="FAILED", trace_id="trace-B"),
            make_event("evt-5", occurred_at=T0 + timedelta(seconds=3), topic="points.added", trace_id="trace-A",
                       initiator={"service": "member-service"}, parentEventId="evt-1"),
            make_event("evt-4", occurred_at=T0 + timedelta(seconds=3), trace_id="trace-A", parentEventId="evt-2"),
        )

    def test_find_events_filters_by_every_field(self):
        self.listing_events()
        self.assertEqual(self.find(), ["evt-4", "evt-5", "evt-3", "evt-2", "evt-1"])  # newest first, then eventId
        self.assertEqual(self.find(status="FAILED"), ["evt-3"])
        # several statuses: any of them, in the listing's order, each event once
        self.assertEqual(self.find(status=("FAILED", "PENDING")), ["evt-4", "evt-5", "evt-3", "evt-2"])
        self.assertEqual(self.find(status=("FAILED", "PENDING", "FAILED")), ["evt-4", "evt-5", "evt-3", "evt-2"])
        self.assertEqual(self.find(status=("FAILED", "PARTIAL"), trace_id="trace-B"), ["evt-3"])
        self.assertEqual(self.find(status=("PARTIAL", "CONSUMED")), ["evt-1"])
        self.assertEqual(self.find(status=("PARTIAL", "RETRYING")), [])
        self.assertEqual(self.total(status=("FAILED", "PENDING")), 4)
        self.assertEqual(self.find(topic="points.added"), ["evt-5", "evt-2"])
        self.assertEqual(self.find(service="member-service"), ["evt-5", "evt-2"])
        self.assertEqual(self.find(service="order-service"), ["evt-4", "evt-3", "evt-1"])
        self.assertEqual(self.find(trace_id="trace-A"), ["evt-4", "evt-5", "evt-2", "evt-1"])
        self.assertEqual(self.find(since=T0 + timedelta(seconds=2)), ["evt-4", "evt-5", "evt-3"])  # inclusive
        self.assertEqual(self.find(until=T0 + timedelta(seconds=2)), ["evt-2", "evt-1"])  # exclusive
        self.assertEqual(self.find(trace_id="trace-A", topic="order.purchased", status="PENDING",
                                   since=T0 + timedelta(seconds=1), until=T0 + timedelta(seconds=4)), ["evt-4"])
        self.assertEqual(self.find(trace_id="trace-none"), [])

    def test_events_are_found_by_any_of_their_search_keys(self):
        self.insert(
            make_event("evt-1", occurred_at=T0, searchKeys=["orderId=o-1", "userId=u-1"]),
            make_event("evt-2", occurred_at=T0 + timedelta(seconds=1), searchKeys=["orderId=o-2", "userId=u-1"],
                       status="FAILED"),
            make_event("evt-3", occurred_at=T0 + timedelta(seconds=2), searchKeys=["aggregate=orders.order/o-1"]),
            make_event("evt-4", occurred_at=T0 + timedelta(seconds=3)),  # none
            make_event("evt-5", occurred_at=T0 + timedelta(seconds=3), searchKeys=[]),
        )
        self.assertEqual(self.find(keys=("orderId=o-1",)), ["evt-1"])
        self.assertEqual(self.find(keys=("userId=u-1",)), ["evt-2", "evt-1"])  # newest first
        self.assertEqual(self.find(keys=("orderId=o-1", "aggregate=orders.order/o-1")), ["evt-3", "evt-1"])  # any
        self.assertEqual(self.find(keys=("userId=u-1", "orderId=o-1")), ["evt-2", "evt-1"])  # each once
        self.assertEqual(self.find(keys=("userId=u-1",), status="FAILED"), ["evt-2"])
        self.assertEqual(self.find(keys=("userId=u-",)), [])  # whole keys only
        self.assertEqual(self.find(keys=("orderId=o-1 ",)), [])
        self.assertEqual(self.find(keys=("x" * 400,)), [])
        self.assertEqual(self.ids(self.store.events_after(EventQuery(keys=("userId=u-1",)), after=(
            T0 + timedelta(seconds=1), "evt-2"), limit=10)), ["evt-1"])
        self.assertEqual(self.store.get_event("evt-1")["searchKeys"], ["orderId=o-1", "userId=u-1"])

    def test_events_not_consumed_in_time_are_those_sent_at_or_before_the_cutoff(self):
        cutoff = T0 + timedelta(minutes=10)
        self.insert(
            make_event("evt-late", occurred_at=T0, status="SENT", lastSentAt=T0 + timedelta(minutes=1)),
            make_event("evt-edge", occurred_at=T0 + timedelta(seconds=1), status="SENT", lastSentAt=cutoff),
            make_event("evt-fresh", occurred_at=T0 + timedelta(seconds=2), status="SENT",
                       lastSentAt=cutoff + timedelta(milliseconds=1)),
            make_event("evt-retrying", occurred_at=T0 + timedelta(seconds=3), status="RETRYING", lastSentAt=T0),
            make_event("evt-pending", occurred_at=T0 + timedelta(seconds=4), status="PENDING"),  # never sent
            make_event("evt-done", occurred_at=T0 + timedelta(seconds=5), status="CONSUMED", lastSentAt=T0),
        )
        self.assertEqual(self.find(sent_before=cutoff), ["evt-done", "evt-retrying", "evt-edge", "evt-late"])
        self.assertEqual(self.find(status=("SENT", "RETRYING"), sent_before=cutoff),
                         ["evt-retrying", "evt-edge", "evt-late"])
        self.assertEqual(self.find(status="SENT", sent_before=cutoff), ["evt-edge", "evt-late"])
        self.assertEqual(self.ids(self.store.events_after(EventQuery(status="SENT", sent_before=cutoff),
                                                          after=None, limit=1)), ["evt-edge"])
        self.assertEqual(self.find(status="SENT", sent_before=T0), [])
        self.assertEqual(self.total(status=("SENT", "RETRYING"), sent_before=cutoff), 3)

    def test_find_events_by_the_initiators_user_and_request(self):
        def initiator(user, request):
            return {"service": "order-service", "operation": "pay", "userId": user, "clientRequestId": request}

        self.insert(
            make_event("evt-u1", occurred_at=T0, initiator=initiator("ann", "req-1")),
            make_event("evt-u2", occurred_at=T0 + timedelta(seconds=1), initiator=initiator("ann", "req-2")),
            make_event("evt-u3", occurred_at=T0 + timedelta(seconds=2), initiator=initiator("bob", "req-2")),
            make_event("evt-u4", occurred_at=T0 + timedelta(seconds=3), initiator={"service": "order-service"}),
            make_event("evt-u5", occurred_at=T0 + timedelta(seconds=4), initiator=None),
        )
        self.assertEqual(self.find(user_id="ann"), ["evt-u2", "evt-u1"])
        self.assertEqual(self.find(client_request_id="req-2"), ["evt-u3", "evt-u2"])
        self.assertEqual(self.find(user_id="ann", client_request_id="req-2"), ["evt-u2"])
        self.assertEqual(self.find(user_id="nobody"), [])
        self.assertEqual(self.total(user_id="bob", service="order-service"), 1)
        self.assertEqual(self.ids(self.store.events_after(EventQuery(user_id="ann"), after=(T0 + timedelta(seconds=1),
                                                                                           "evt-u2"), limit=5)),
                         ["evt-u1"])

    def test_find_events_pages_with_the_total(self):
        self.listing_events()
        total, page = self.store.find_events(EventQuery(), skip=1, limit=2)
        self.assertEqual((total, self.ids(page)), (5, ["evt-5", "evt-3"]))
        total, page = self.store.find_events(EventQuery(trace_id="trace-A"), skip=3, limit=2)
        self.assertEqual((total, self.ids(page)), (4, ["evt-1"]))
        total, page = self.store.find_events(EventQuery(), skip=10, limit=2)
        self.assertEqual((total, page), (5, []))

    def test_a_short_page_of_many_events_is_the_page_of_the_full_order(self):
        # Many more events than a page (a store may find a short page without sorting them all): times that
        # repeat, ids inserted out of order, a status filter, an event without a time last.
        for n in (7, 3, 11, 0, 9, 1, 5, 10, 2, 8, 6, 4, 12, 13, 14, 15, 16, 17, 18, 19):
            self.insert(make_event(f"evt-{n:02d}", occurredAt=T0 + timedelta(seconds=n // 3)))
        self.insert(make_event("evt-none", occurredAt=None))
        expected = [f"evt-{n:02d}" for n in sorted(range(20), key=lambda n: (-(n // 3), n))] + ["evt-none"]
        total, page = self.store.find_events(EventQuery(), skip=0, limit=3)
        self.assertEqual((total, self.ids(page)), (21, expected[:3]))
        total, page = self.store.find_events(EventQuery(status="PENDING"), skip=2, limit=2)
        self.assertEqual((total, self.ids(page)), (21, expected[2:4]))
        total, page = self.store.find_events(EventQuery(), skip=19, limit=3)
        self.assertEqual((total, self.ids(page)), (21, expected[19:]))
        after = (T0 + timedelta(seconds=4), "evt-13")
        self.assertEqual(self.ids(self.store.events_after(EventQuery(), after=after, limit=2)), ["evt-14", "evt-09"])

    def test_events_after_pages_by_key_in_the_listing_order(self):
        self.listing_events()
        self.insert(make_event("evt-none", occurredAt=None))
        pages, after = [], None
        while True:
            page = self.store.events_after(EventQuery(), after=after, limit=2)
            if not page:
                break
            pages.append(self.ids(page))
            after = (page[-1]["occurredAt"], page[-1]["eventId"])
        self.assertEqual(pages, [["evt-4", "evt-5"], ["evt-3", "evt-2"], ["evt-1"]])  # equal times: by eventId
        self.assertEqual(self.ids(self.store.events_after(EventQuery(trace_id="trace-A"),
                                                          after=(T0 + timedelta(seconds=3), "evt-4"), limit=10)),
                         ["evt-5", "evt-2", "evt-1"])
        self.assertEqual(self.ids(self.store.events_after(EventQuery(topic="points.added"),
                                                          after=(T0 + timedelta(seconds=3), "evt-5"), limit=10)),
                         ["evt-2"])
        self.assertEqual(self.store.events_after(EventQuery(), after=(T0, "evt-1"), limit=10), [])
        self.assertEqual(self.store.events_after(EventQuery(), after=None, limit=0), [])

    def test_events_before_pages_back_by_key_in_the_listing_order(self):
        self.listing_events()
        self.insert(make_event("evt-none", occurredAt=None))
        order = ["evt-4", "evt-5", "evt-3", "evt-2", "evt-1"]
        events = {e["eventId"]: e for e in self.store.events_after(EventQuery(), after=None, limit=10)}

        def key(event_id):
            return events[event_id]["occurredAt"], event_id

        for index, event_id in enumerate(order):  # from each event, every page size: the events just before it
            for size in (1, 2, 10):
                self.assertEqual(self.ids(self.store.events_before(EventQuery(), before=key(event_id), limit=size)),
                                 order[max(0, index - size):index], (event_id, size))
        pages, before = [], key("evt-1")  # walking back from the last event visits every one once
        for _ in range(10):
            page = self.store.events_before(EventQuery(), before=before, limit=2)
            if not page:
                break
            pages.insert(0, self.ids(page))
            before = key(page[0]["eventId"])
        self.assertEqual(pages, [["evt-4", "evt-5"], ["evt-3", "evt-2"]])  # each page the nearest ones to its key
        self.assertEqual([i for page in pages for i in page], order[:-1])
        self.assertEqual(self.ids(self.store.events_before(EventQuery(topic="points.added"), before=key("evt-2"),
                                                           limit=10)), ["evt-5"])
        self.assertEqual(self.ids(self.store.events_before(EventQuery(trace_id="trace-A"),
                                                           before=(T0 - timedelta(days=1), "evt-0"), limit=3)),
                         ["evt-5", "evt-2", "evt-1"])
        self.assertEqual(self.store.events_before(EventQuery(), before=key("evt-4"), limit=10), [])
        self.assertEqual(self.store.events_before(EventQuery(), before=key("evt-1"), limit=0), [])

    def test_count_events_counts_the_matches_up_to_its_bound(self):
        self.listing_events()
        self.assertEqual(self.store.count_events(EventQuery(), up_to=100), 5)
        self.assertEqual(self.store.count_events(EventQuery(), up_to=3), 3)
        self.assertEqual(self.store.count_events(EventQuery(), up_to=5), 5)
        self.assertEqual(self.store.count_events(EventQuery(topic="points.added"), up_to=100), 2)
        self.assertEqual(self.store.count_events(EventQuery(status=("FAILED", "CONSUMED")), up_to=1), 1)
        self.assertEqual(self.store.count_events(EventQuery(trace_id="trace-none"), up_to=100), 0)
        self.assertEqual(self.store.count_events(EventQuery(), up_to=0), 0)

    def test_find_events_counts_every_match_whatever_the_page(self):
        self.assertEqual(self.total(), 0)
        self.listing_events()
        self.assertEqual(self.total(), 5)
        self.assertEqual(self.total(status="PENDING"), 3)
        self.assertEqual(self.total(topic="points.added", trace_id="trace-A"), 2)

    def test_status_filters_follow_status_changes(self):
        self.insert(*(make_event(f"evt-{n}", occurred_at=T0 + timedelta(seconds=n)) for n in range(4)))
        self.store.mark_sent("evt-0", T0)
        self.store.mark_sent("evt-1", T0)
        self.assertTrue(self.store.set_status_if("evt-1", "SENT", 1, "FAILED", T0))
        self.store.claim_repush("evt-1", now=T0, max_count=5, statuses=("FAILED",), sent_before=T0)
        self.assertTrue(self.store.set_status_if("evt-2", "PENDING", 0, "CONSUMED", T0))
        counts = {s: self.total(status=s) for s in ("PENDING", "SENT", "CONSUMED", "FAILED", "RETRYING")}
        self.assertEqual(counts, {"PENDING": 1, "SENT": 1, "CONSUMED": 1, "FAILED": 0, "RETRYING": 1})
        self.assertEqual(self.find(status="RETRYING"), ["evt-1"])
        self.assertEqual(self.find(status="PENDING"), ["evt-3"])
        self.assertEqual(self.find(status=("RETRYING", "CONSUMED")), ["evt-2", "evt-1"])  # the index, moved
        self.assertEqual(self.store.stale_pending(T0 + timedelta(minutes=1), 10), ["evt-3"])
        self.assertEqual(self.total(status="SENT", since=T0 + timedelta(seconds=1)), 0)

    def test_trace_events_in_time_order_then_by_event_id(self):
        self.listing_events()
        self.assertEqual(self.ids(self.store.trace_events("trace-A", 10)), ["evt-1", "evt-2", "evt-4", "evt-5"])
        self.assertEqual(self.ids(self.store.trace_events("trace-A", 2)), ["evt-1", "evt-2"])
        self.assertEqual(self.ids(self.store.trace_events("trace-B", 10)), ["evt-3"])
        self.assertEqual(self.store.trace_events("trace-none", 10), [])
        self.assertEqual(self.store.trace_events("trace-A", 10)[0], self.store.get_event("evt-1"))

    def test_children_of_an_event_in_time_order(self):
        self.listing_events()
        self.assertEqual(self.ids(self.store.children("evt-1", 10)), ["evt-2", "evt-5"])
        self.assertEqual(self.ids(self.store.children("evt-1", 1)), ["evt-2"])
        self.assertEqual(self.ids(self.store.children("evt-2", 10)), ["evt-4"])
        self.assertEqual(self.store.children("evt-4", 10), [])


class ConsumptionRecordsContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.ConsumptionRecords`: the append-only feedback rows."""

    def test_init_consumptions_adds_one_pending_row_per_consumer_and_keeps_existing_rows(self):
        self.store.init_consumptions("evt-c", ["message-service", "member-service"], T0)
        rows = self.store.consumption_rows(["evt-c"])
        self.assertEqual(rows, [
            {"eventId": "evt-c", "consumerId": c, "attemptNo": 0, "success": None, "consumedAt": None,
             "error": None, "source": "send", "createdAt": T0} for c in ("member-service", "message-service")])
        self.store.insert_feedback("evt-c", "member-service", feedback_fields(True))
        self.store.init_consumptions("evt-c", ["member-service", "message-service", "audit-service"],
                                     T0 + timedelta(minutes=1))  # a relay after a crash
        after = self.store.consumption_rows(["evt-c"])
        self.assertEqual([(r["consumerId"], r["attemptNo"], r["createdAt"]) for r in after], [
            ("audit-service", 0, T0 + timedelta(minutes=1)), ("member-service", 0, T0), ("member-service", 1, T0),
            ("message-service", 0, T0)])
        self.store.init_consumptions("evt-c", [], T0)
        self.assertEqual(self.store.consumption_rows(["evt-c"]), after)

    def test_latest_consumption_and_rows_ordered_by_event_consumer_attempt(self):
        for event_id in ("evt-b", "evt-a"):
            self.store.init_consumptions(event_id, ["z-service", "a-service"], T0)
        for n in range(3):
            self.store.insert_feedback("evt-b", "z-service", feedback_fields(n == 2, T0 + timedelta(seconds=n)))
        self.store.insert_feedback("evt-a", "a-service", feedback_fields(False))
        latest = self.store.latest_consumption("evt-b", "z-service")
        self.assertEqual((latest["attemptNo"], latest["success"], latest["consumedAt"]),
                         (3, True, T0 + timedelta(seconds=2)))
        self.assertEqual(self.store.latest_consumption("evt-b", "a-service")["attemptNo"], 0)
        self.assertIsNone(self.store.latest_consumption("evt-b", "other-service"))
        self.assertIsNone(self.store.latest_consumption("evt-none", "z-service"))
        rows = self.store.consumption_rows(["evt-b", "evt-a", "evt-b", "evt-none"])
        self.assertEqual([(r["eventId"], r["consumerId"], r["attemptNo"]) for r in rows], [
            ("evt-a", "a-service", 0), ("evt-a", "a-service", 1), ("evt-a", "z-service", 0),
            ("evt-b", "a-service", 0), ("evt-b", "z-service", 0), ("evt-b", "z-service", 1),
            ("evt-b", "z-service", 2), ("evt-b", "z-service", 3)])
        self.assertEqual(self.store.consumption_rows([]), [])
        self.assertEqual(self.store.consumption_rows(["evt-a", "evt-b"]), rows)  # repeated, unknown ids: no matter
        latest = self.store.latest_consumptions("evt-b")
        self.assertEqual(latest, {"a-service": rows[3], "z-service": rows[7]})
        self.assertEqual({c: r["attemptNo"] for c, r in self.store.latest_consumptions("evt-a").items()},
                         {"a-service": 1, "z-service": 0})
        self.assertEqual(self.store.latest_consumptions("evt-none"), {})

    def test_insert_feedback_takes_the_next_attempt_number(self):
        self.store.init_consumptions("evt-f", ["member-service"], T0)
        first = self.store.insert_feedback("evt-f", "member-service", feedback_fields(False, retrying=True))
        self.assertEqual(first, {"eventId": "evt-f", "consumerId": "member-service", "attemptNo": 1,
                                 **feedback_fields(False, retrying=True)})
        self.assertEqual(self.store.latest_consumption("evt-f", "member-service"), first)
        known = self.store.insert_feedback("evt-f", "member-service", feedback_fields(False), known_latest=1)
        self.assertEqual(known["attemptNo"], 2)
        stale = self.store.insert_feedback("evt-f", "member-service", feedback_fields(True), known_latest=0)
        self.assertEqual(stale["attemptNo"], 3)  # 1 was taken: it read again
        self.assertEqual([r["attemptNo"] for r in self.store.consumption_rows(["evt-f"])], [0, 1, 2, 3])
        with self.assertRaises(ConsumerNotExpected):
            self.store.insert_feedback("evt-f", "other-service", feedback_fields(True))
        with self.assertRaises(ConsumerNotExpected):
            self.store.insert_feedback("evt-none", "member-service", feedback_fields(True))
        self.assertEqual([(r["eventId"], r["consumerId"], r["attemptNo"])
                          for r in self.store.consumption_rows(["evt-f", "evt-none"])],
                         [("evt-f", "member-service", n) for n in range(4)])  # the refused ones stored nothing

    def test_insert_attempt_refuses_a_taken_attempt_number(self):
        self.store.init_consumptions("evt-u", ["member-service"], T0)
        row = {"eventId": "evt-u", "consumerId": "member-service", "attemptNo": 0, **feedback_fields(True)}
        self.assertFalse(self.store.insert_attempt(row))
        self.assertIsNone(self.store.latest_consumption("evt-u", "member-service")["success"])
        self.assertTrue(self.store.insert_attempt({**row, "attemptNo": 1}))
        self.assertTrue(self.store.insert_attempt({**row, "consumerId": "message-service"}))
        self.assertEqual([(r["consumerId"], r["attemptNo"], r["success"])
                          for r in self.store.consumption_rows(["evt-u"])],
                         [("member-service", 0, None), ("member-service", 1, True), ("message-service", 0, True)])

    def test_concurrent_feedback_gets_distinct_contiguous_attempt_numbers(self):
        self.store.init_consumptions("evt-race", ["member-service", "message-service"], T0)

        def report(index):
            consumer = ("member-service", "message-service")[index % 2]
            return [self.store.insert_feedback("evt-race", consumer, feedback_fields(n % 2 == 0))["attemptNo"]
                    for n in range(5)]

        results, errors = run_together(8, report)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(n for numbers in results for n in numbers), sorted(list(range(1, 21)) * 2))
        for consumer in ("member-service", "message-service"):
            numbers = [r["attemptNo"] for r in self.store.consumption_rows(["evt-race"]) if r["consumerId"] == consumer]
            self.assertEqual(numbers, list(range(21)))


    def test_consumer_feedback_is_the_consumers_reports_newest_first_in_keyset_pages(self):
        for event_id in ("evt-b", "evt-a", "evt-c"):
            self.store.init_consumptions(event_id, ["member-service", "message-service"], T0)
        later = T0 + timedelta(minutes=5)
        self.store.insert_feedback("evt-a", "member-service", feedback_fields(False, T0 + timedelta(minutes=1)))
        self.store.insert_feedback("evt-a", "member-service", feedback_fields(True, later))  # attempt 2, same time
        self.store.insert_feedback("evt-b", "member-service", feedback_fields(False, later))
        self.store.insert_feedback("evt-c", "member-service", feedback_fields(True, T0 + timedelta(minutes=9)))
        self.store.insert_feedback("evt-b", "message-service", feedback_fields(True, T0 + timedelta(minutes=20)))
        self.store.insert_feedback("evt-a", "member-service", feedback_fields(False, later),
                                   known_latest=2)  # attempt 3 at the same time as attempt 2

        def keys(rows):
            return [(r["eventId"], r["attemptNo"]) for r in rows]

        every = self.store.consumer_feedback("member-service", limit=100)
        # Newest report first, then by eventId, then the highest attempt first; the pending rows are not reports.
        self.assertEqual(keys(every), [("evt-c", 1), ("evt-a", 3), ("evt-a", 2), ("evt-b", 1), ("evt-a", 1)])
        self.assertEqual(every[1], {"eventId": "evt-a", "consumerId": "member-service", "attemptNo": 3,
                                    **feedback_fields(False, later)})
        self.assertEqual(keys(self.store.consumer_feedback("member-service", success=False, limit=100)),
                         [("evt-a", 3), ("evt-b", 1), ("evt-a", 1)])
        self.assertEqual(keys(self.store.consumer_feedback("member-service", success=True, limit=100)),
                         [("evt-c", 1), ("evt-a", 2)])
        self.assertEqual(keys(self.store.consumer_feedback("message-service", limit=100)), [("evt-b", 1)])
        self.assertEqual(self.store.consumer_feedback("other-service", limit=100), [])
        self.assertEqual(self.store.consumer_feedback("member-service", limit=0), [])
        for size in (1, 2, 3):  # every page size walks the same order, none skipped or repeated
            pages, after = [], None
            for _ in range(10):  # bounded: a store that ignored ``after`` fails instead of looping
                page = self.store.consumer_feedback("member-service", after=after, limit=size)
                pages.extend(page)
                if len(page) < size:
                    break
                last = page[-1]
                after = (last["consumedAt"], last["eventId"], last["attemptNo"])
            self.assertEqual(keys(pages), keys(every), size)
        with self.assertRaises(TypeError):
            EventQuery(sent_before="2024-01-01")
        failed_after = self.store.consumer_feedback("member-service", success=False, limit=2)[-1]
        self.assertEqual(keys(self.store.consumer_feedback(
            "member-service", success=False, limit=10,
            after=(failed_after["consumedAt"], failed_after["eventId"], failed_after["attemptNo"]))), [("evt-a", 1)])


class InboxRecordsContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.InboxRecords`: the consumers' inbox."""

    def test_an_inbox_entry_is_created_once_per_consumer_and_event(self):
        lease = T0 + timedelta(minutes=1)
        self.assertIsNone(self.store.inbox_state("member-service", "evt-1"))
        self.assertTrue(self.store.inbox_insert("member-service", "evt-1", owner="w1", now=T0, lease_until=lease))
        self.assertFalse(self.store.inbox_insert("member-service", "evt-1", owner="w2", now=T0, lease_until=lease))
        self.assertEqual(self.store.inbox_state("member-service", "evt-1"), "processing")
        self.assertTrue(self.store.inbox_insert("message-service", "evt-1", owner="w3", now=T0, lease_until=lease))
        self.assertTrue(self.store.inbox_insert("member-service", "evt-2", owner="w4", now=T0, lease_until=lease))
        self.assertFalse(self.store.inbox_done("member-service", "evt-1", owner="w2", now=T0))  # not its claim
        self.assertTrue(self.store.inbox_done("member-service", "evt-1", owner="w1", now=T0))
        self.assertEqual(self.store.inbox_state("member-service", "evt-1"), "done")
        self.assertEqual(self.store.inbox_state("message-service", "evt-1"), "processing")

    def test_an_inbox_claim_is_taken_over_only_after_its_lease(self):
        lease = T0 + timedelta(seconds=30)
        self.store.inbox_insert("member-service", "evt-1", owner="crashed", now=T0, lease_until=lease)
        self.assertFalse(self.store.inbox_take_over("member-service", "evt-1", owner="w2", now=lease - timedelta(
            seconds=1), lease_until=lease + timedelta(minutes=1)))
        self.assertTrue(self.store.inbox_take_over("member-service", "evt-1", owner="w2", now=lease,
                                                   lease_until=lease + timedelta(minutes=1)))
        self.assertFalse(self.store.inbox_take_over("member-service", "evt-1", owner="w3", now=lease,
                                                    lease_until=lease + timedelta(minutes=1)))
        self.assertFalse(self.store.inbox_done("member-service", "evt-1", owner="crashed", now=lease))
        self.assertTrue(self.store.inbox_done("member-service", "evt-1", owner="w2", now=lease))
        later = lease + timedelta(days=1)
        self.assertFalse(self.store.inbox_take_over("member-service", "evt-1", owner="w4", now=later,
                                                    lease_until=later))  # done: nothing to take over
        self.assertFalse(self.store.inbox_take_over("member-service", "evt-none", owner="w4", now=later,
                                                    lease_until=later))
        self.assertEqual(self.store.inbox_state("member-service", "evt-1"), "done")

    def test_an_inbox_claim_is_released_only_by_its_owner_while_processing(self):
        lease = T0 + timedelta(minutes=1)
        self.store.inbox_insert("member-service", "evt-1", owner="w1", now=T0, lease_until=lease)
        self.store.inbox_release("member-service", "evt-1", owner="w2")
        self.assertEqual(self.store.inbox_state("member-service", "evt-1"), "processing")
        self.store.inbox_release("member-service", "evt-1", owner="w1")
        self.assertIsNone(self.store.inbox_state("member-service", "evt-1"))
        self.assertTrue(self.store.inbox_insert("member-service", "evt-1", owner="w3", now=T0, lease_until=lease))
        self.store.inbox_done("member-service", "evt-1", owner="w3", now=T0)
        self.store.inbox_release("member-service", "evt-1", owner="w3")
        self.assertEqual(self.store.inbox_state("member-service", "evt-1"), "done")  # done is never released

    def test_concurrent_inbox_claims_have_one_winner(self):
        results, errors = run_together(8, lambda i: self.store.inbox_insert(
            "member-service", "evt-race", owner=f"w{i}", now=T0, lease_until=T0 + timedelta(minutes=1)))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [False] * 7 + [True])


class SequenceRecordsContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.SequenceRecords`: sequences per consumer and partition."""

    def test_sequences_are_accepted_when_newer_and_never_lowered(self):
        store = self.store
        self.assertIsNone(store.last_sequence("member-service", "o-1"))
        self.assertTrue(store.accept_sequence("member-service", "o-1", 5, T0))
        self.assertFalse(store.accept_sequence("member-service", "o-1", 4, T0))
        self.assertFalse(store.accept_sequence("member-service", "o-1", 5, T0))
        self.assertTrue(store.accept_sequence("member-service", "o-1", 6, T0))
        self.assertEqual(store.last_sequence("member-service", "o-1"), 6)
        store.advance_sequence("member-service", "o-1", 3, T0)
        self.assertEqual(store.last_sequence("member-service", "o-1"), 6)
        store.advance_sequence("member-service", "o-1", 9, T0)
        self.assertEqual(store.last_sequence("member-service", "o-1"), 9)
        store.advance_sequence("member-service", "o-2", 2, T0)
        self.assertEqual(store.last_sequence("member-service", "o-2"), 2)
        self.assertIsNone(store.last_sequence("message-service", "o-1"))
        self.assertTrue(store.accept_sequence("message-service", "o-1", 0, T0))

    def test_concurrent_accepts_of_one_sequence_have_one_winner(self):
        results, errors = run_together(8, lambda i: self.store.accept_sequence("member-service", "o-r", 7, T0))
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [False] * 7 + [True])
        _, errors = run_together(8, lambda i: self.store.advance_sequence("member-service", "o-new", i, T0))
        self.assertEqual(errors, [])
        self.assertEqual(self.store.last_sequence("member-service", "o-new"), 7)

    def test_an_accepted_sequence_is_restored_only_while_unchanged(self):
        store = self.store
        self.assertTrue(store.accept_sequence("member-service", "o-u", 5, T0))
        self.assertTrue(store.accept_sequence("member-service", "o-u", 6, T0))
        self.assertFalse(store.restore_sequence("member-service", "o-u", accepted=5, previous=None, now=T0))
        self.assertEqual(store.last_sequence("member-service", "o-u"), 6)  # a newer one came since: kept
        self.assertTrue(store.restore_sequence("member-service", "o-u", accepted=6, previous=5, now=T0))
        self.assertEqual(store.last_sequence("member-service", "o-u"), 5)
        self.assertTrue(store.restore_sequence("member-service", "o-u", accepted=5, previous=None, now=T0))
        self.assertIsNone(store.last_sequence("member-service", "o-u"))
        self.assertTrue(store.accept_sequence("member-service", "o-u", 5, T0))  # accepted again after the undo


class RepushAuditContract(BusStoreCase):
    """:class:`~wow_django.persistence.bus.RepushAudit`: who re-pushed what."""

    def test_repush_history_is_newest_first_per_event(self):
        for n in (2, 0, 1):
            self.store.insert_repush({"eventId": "evt-r", "consumerId": None, "requestedBy": f"user-{n}",
                                      "requestedAt": T0 + timedelta(seconds=n), "retryCount": n + 1,
                                      "previousStatus": "FAILED", "outcome": "published", "error": None})
        self.store.insert_repush({"eventId": "evt-other", "consumerId": "member-service", "requestedBy": "ops",
                                  "requestedAt": T0, "retryCount": 1, "previousStatus": "PARTIAL",
                                  "outcome": "failed", "error": "broker down"})
        history = self.store.repush_history("evt-r")
        self.assertEqual([r["requestedBy"] for r in history], ["user-2", "user-1", "user-0"])
        self.assertEqual(history[0], {"eventId": "evt-r", "consumerId": None, "requestedBy": "user-2",
                                      "requestedAt": T0 + timedelta(seconds=2), "retryCount": 3,
                                      "previousStatus": "FAILED", "outcome": "published", "error": None})
        self.assertEqual([r["requestedBy"] for r in self.store.repush_history("evt-r", limit=2)], ["user-2", "user-1"])
        self.assertEqual([r["outcome"] for r in self.store.repush_history("evt-other")], ["failed"])
        self.assertEqual(self.store.repush_history("evt-none"), [])


class PurgeContract(BusStoreCase):
    """:meth:`~wow_django.persistence.bus.EventRecords.purge_events`: retention, across every record kind."""

    DAY = timedelta(days=1)

    def history(self, event_id: str) -> None:
        """Feedback, an inbox entry and a re-push record about ``event_id``."""
        self.store.init_consumptions(event_id, ["member-service"], T0)
        self.store.insert_feedback(event_id, "member-service", feedback_fields(True))
        self.store.inbox_insert("member-service", event_id, owner="w-1", now=T0, lease_until=T0 + self.DAY)
        self.store.insert_repush({"eventId": event_id, "consumerId": None, "requestedBy": "ops", "requestedAt": T0,
                                  "retryCount": 1, "previousStatus": "FAILED", "outcome": "published",
                                  "error": None})

    def kept(self, event_id: str) -> tuple[bool, int, bool, int]:
        return (self.store.get_event(event_id) is not None, len(self.store.consumption_rows([event_id])),
                self.store.inbox_state("member-service", event_id) is not None,
                len(self.store.repush_history(event_id)))

    def test_purge_deletes_the_events_done_with_and_every_row_about_them(self):
        for event in (
            make_event("evt-consumed-old", status="CONSUMED", statusAt=T0 + timedelta(hours=2)),
            make_event("evt-consumed-older", status="CONSUMED", statusAt=T0 + timedelta(hours=1)),
            make_event("evt-consumed-young", status="CONSUMED", statusAt=T0 + 3 * self.DAY),
            make_event("evt-failed-old", status="FAILED", statusAt=T0),
            make_event("evt-sent-old", status="SENT", statusAt=T0),
            make_event("evt-expired", status="FAILED", statusAt=T0 + timedelta(hours=3), expireAt=T0 + self.DAY),
            make_event("evt-expiring", status="FAILED", statusAt=T0, expireAt=T0 + 2 * self.DAY),
        ):
            self.store.insert_event(event)
            self.history(event["eventId"])
        now = T0 + 4 * self.DAY
        deleted = self.store.purge_events(consumed_before=now - 2 * self.DAY, expired_before=now - 3 * self.DAY,
                                          limit=100)
        self.assertEqual(deleted, ["evt-consumed-older", "evt-consumed-old", "evt-expired"])  # oldest statusAt first
        for event_id in deleted:
            self.assertEqual(self.kept(event_id), (False, 0, False, 0), event_id)
        for event_id in ("evt-consumed-young", "evt-failed-old", "evt-sent-old", "evt-expiring"):
            self.assertEqual(self.kept(event_id), (True, 2, True, 1), event_id)
        self.assertEqual(self.store.purge_events(consumed_before=now - 2 * self.DAY,
                                                 expired_before=now - 3 * self.DAY, limit=100), [])

    def test_a_purged_events_feedback_is_gone_from_its_consumers_deliveries(self):
        for event_id in ("evt-p1", "evt-p2"):
            self.store.insert_event(make_event(event_id, status="CONSUMED", statusAt=T0))
            self.store.init_consumptions(event_id, ["member-service"], T0)
            self.store.insert_feedback(event_id, "member-service", feedback_fields(True))
        self.assertEqual(self.store.purge_events(consumed_before=T0, expired_before=None, limit=1), ["evt-p1"])
        self.assertEqual([r["eventId"] for r in self.store.consumer_feedback("member-service", limit=10)],
                         ["evt-p2"])

    def test_a_purged_event_is_no_longer_found_by_its_search_keys(self):
        self.store.insert_event(make_event("evt-gone", status="CONSUMED", statusAt=T0, searchKeys=["orderId=o-9"]))
        self.store.insert_event(make_event("evt-kept", status="SENT", statusAt=T0, searchKeys=["orderId=o-9"]))
        self.assertEqual(self.store.purge_events(consumed_before=T0, expired_before=None, limit=10), ["evt-gone"])
        total, page = self.store.find_events(EventQuery(keys=("orderId=o-9",)), skip=0, limit=10)
        self.assertEqual((total, [e["eventId"] for e in page]), (1, ["evt-kept"]))
        # the same eventId stored again (the bus never does; a restore might) has only its own keys
        self.store.insert_event(make_event("evt-gone", status="SENT", searchKeys=["orderId=o-10"]))
        total, page = self.store.find_events(EventQuery(keys=("orderId=o-9",)), skip=0, limit=10)
        self.assertEqual([e["eventId"] for e in page], ["evt-kept"])
        total, page = self.store.find_events(EventQuery(keys=("orderId=o-10",)), skip=0, limit=10)
        self.assertEqual([e["eventId"] for e in page], ["evt-gone"])

    def test_each_rule_alone_and_none(self):
        self.store.insert_event(make_event("evt-c", status="CONSUMED", statusAt=T0))
        self.store.insert_event(make_event("evt-x", status="SENT", statusAt=T0, expireAt=T0))
        later = T0 + self.DAY
        self.assertEqual(self.store.purge_events(consumed_before=None, expired_before=None, limit=100), [])
        self.assertEqual(self.store.purge_events(consumed_before=None, expired_before=later, limit=100), ["evt-x"])
        self.assertIsNotNone(self.store.get_event("evt-c"))
        self.assertEqual(self.store.purge_events(consumed_before=T0 - timedelta(seconds=1), expired_before=None,
                                                 limit=100), [])  # statusAt ≤ the cutoff only
        self.assertEqual(self.store.purge_events(consumed_before=T0, expired_before=None, limit=100), ["evt-c"])

    def test_purge_takes_at_most_limit_events_oldest_first(self):
        for n in range(5):
            self.store.insert_event(make_event(f"evt-{n}", status="CONSUMED", statusAt=T0 + timedelta(minutes=5 - n)))
        later = T0 + self.DAY
        self.assertEqual(self.store.purge_events(consumed_before=later, expired_before=None, limit=2),
                         ["evt-4", "evt-3"])
        self.assertEqual(self.store.purge_events(consumed_before=later, expired_before=None, limit=0), [])
        self.assertEqual(self.store.purge_events(consumed_before=later, expired_before=None, limit=10),
                         ["evt-2", "evt-1", "evt-0"])

    def test_concurrent_purges_delete_each_event_once(self):
        for n in range(20):
            self.store.insert_event(make_event(f"evt-p{n:02}", status="CONSUMED", statusAt=T0))
        results, errors = run_together(4, lambda i: self.store.purge_events(
            consumed_before=T0 + self.DAY, expired_before=None, limit=100))
        self.assertEqual(errors, [])
        everything = [event_id for result in results for event_id in result]
        self.assertEqual(sorted(everything), [f"evt-p{n:02}" for n in range(20)])  # each once, by one purge


def plan_of(explained: dict) -> tuple[list[str], set[str]]:
    """``(stage names, index names)`` of an ``explain()`` output's winning plan (classic or SBE, sharded or not)."""
    stages: list[str] = []
    indexes: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if "stage" in node:
                stages.append(node["stage"])
            if "indexName" in node:
                indexes.add(node["indexName"])
            for key in ("queryPlan", "inputStage", "inputStages", "shards", "winningPlan", "thenStage",
                        "elseStage", "outerStage", "innerStage"):
                if key in node:
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(explained["queryPlanner"]["winningPlan"])
    return stages, indexes


class MongoPurgePlanContract(BusStoreCase):
    """The purge's reads on MongoDB (issue 22, item 10): one query per rule, each read in its order from an
    index, merged in Python into the contract's order (oldest ``statusAt`` first, then eventId) and limit.

    ``make_store`` returns a :class:`~wow_django.backends.mongo.bus_store.MongoBusStore`. A wrapper around
    its ``events`` collection records the filter, projection, sort and limit each query sends (the embedded
    engine has no ``explain``, so this is what runs there); on a real server (``WOW_TEST_MONGO_URI``) each
    recorded query is also explained: an index scan of the named index, no collection scan, no in-memory
    sort for the consumed rule, and no document fetched for the expired rule (the index covers it; its
    top-``limit`` sort runs over index keys). Only a real server proves the plan.
    """

    CONSUMED_INDEX = "status_1_statusAt_1_eventId_1"
    EXPIRED_INDEX = "expireAt_1_statusAt_1_eventId_1"

    def recorded_purge(self, **arguments) -> tuple[list[str], list[dict]]:
        from wow_django.backends.mongo import bus_schema

        store = cast("MongoBusStore", self.store)  # make_store's, as the class says
        real = store.events
        queries: list[dict] = []

        class Cursor:
            def __init__(self, cursor, query):
                self.cursor, self.query = cursor, query

            def sort(self, keys, direction=None):
                self.query["sort"] = list(keys) if direction is None else [(keys, direction)]
                self.cursor = self.cursor.sort(keys, direction) if direction is not None else self.cursor.sort(keys)
                return self

            def limit(self, count):
                self.query["limit"] = count
                self.cursor = self.cursor.limit(count)
                return self

            def __iter__(self):
                return iter(self.cursor)

        class Recording:
            def __getattr__(self, attribute):
                return getattr(real, attribute)

            def find(self, filter_=None, projection=None, **options):
                query = {"filter": filter_, "projection": projection}
                queries.append(query)
                return Cursor(real.find(filter_, projection, **options), query)

        collection = store.collection

        def recording(spec):
            return Recording() if spec is bus_schema.EVENTS_SPEC else collection(spec)

        store.collection = recording  # type: ignore[method-assign]  # patched on the instance for this purge only
        try:
            return store.purge_events(**arguments), queries
        finally:
            store.collection = collection  # type: ignore[method-assign]  # the store's own method again

    def test_each_purge_rule_is_one_query_read_in_order_from_an_index(self):
        day = timedelta(days=1)
        for n in range(4):
            self.store.insert_event(make_event(f"evt-c{n}", status="CONSUMED", statusAt=T0 + timedelta(hours=n)))
            self.store.insert_event(make_event(f"evt-x{n}", status="FAILED", statusAt=T0 + timedelta(hours=n, minutes=30),
                                               expireAt=T0))
        self.store.insert_event(make_event("evt-both", status="CONSUMED", statusAt=T0, expireAt=T0))
        self.store.insert_event(make_event("evt-young", status="CONSUMED", statusAt=T0 + 3 * day))
        consumed_before, expired_before = T0 + day, T0 + day
        deleted, queries = self.recorded_purge(consumed_before=consumed_before, expired_before=expired_before,
                                               limit=5)
        # The merge keeps the contract: oldest statusAt first (eventId on a tie), an event both rules match once.
        self.assertEqual(deleted, ["evt-both", "evt-c0", "evt-x0", "evt-c1", "evt-x1"])
        order = [("statusAt", 1), ("eventId", 1)]
        self.assertEqual(queries, [
            {"filter": {"status": "CONSUMED", "statusAt": {"$lte": consumed_before}},
             "projection": {"eventId": 1, "statusAt": 1, "_id": 0}, "sort": order, "limit": 5},
            {"filter": {"expireAt": {"$lte": expired_before}},
             "projection": {"eventId": 1, "statusAt": 1, "_id": 0}, "sort": order, "limit": 5},
        ])
        indexes = {ix["name"]: list(dict(ix["key"]).items()) for ix in self.store.events.list_indexes()}
        self.assertEqual(indexes[self.CONSUMED_INDEX], [("status", 1), ("statusAt", 1), ("eventId", 1)])
        self.assertEqual(indexes[self.EXPIRED_INDEX], [("expireAt", 1), ("statusAt", 1), ("eventId", 1)])
        if self.store.connection.embedded:
            return  # the embedded engine has no explain(): the shape above is what it can prove
        for query, index in zip(queries, (self.CONSUMED_INDEX, self.EXPIRED_INDEX), strict=True):
            explained = (self.store.events.find(query["filter"], query["projection"]).sort(query["sort"])
                         .limit(query["limit"]).explain())
            stages, used = plan_of(explained)
            self.assertEqual(used, {index}, stages)
            self.assertNotIn("COLLSCAN", stages)
            if index == self.CONSUMED_INDEX:
                self.assertNotIn("SORT", stages)  # equality on status, then the index's own order
            else:
                self.assertNotIn("FETCH", stages)  # covered: the top-limit sort reads index keys only


class BusStoreContract(TopicConsumerRecordsContract, EventRecordsContract, ConsumptionRecordsContract,
                       InboxRecordsContract, SequenceRecordsContract, RepushAuditContract, PurgeContract):
    """Every mixin above: mix into ``unittest.TestCase`` and implement :meth:`make_store` (a whole
    :class:`~wow_django.persistence.bus.BusStore`)."""

"""The event-store contract (DESIGN part A)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from decimal import Decimal

from wow_django.domain.ids import generate_id
from wow_django.exceptions import ContextLockTimeout, DuplicateAggregateId, DuplicateRequestId, EventVersionConflict
from wow_django.persistence.contracts import EventStore
from wow_django.persistence.records import AggregateId, DomainEventRecord, EventStream, now_ms
from wow_django.testing._case import TestCaseMixin


def make_stream(
    aggregate_id: AggregateId,
    version: int,
    *,
    request_id: str | None = None,
    events: int = 1,
    create_time: int | None = None,
    owner_id: str = "owner-1",
    header: dict | None = None,
) -> EventStream:
    """An event stream with ``events`` small events, for tests and benchmarks."""
    return EventStream(
        id=generate_id(),
        aggregate_id=aggregate_id,
        version=version,
        body=tuple(
            DomainEventRecord(
                id=generate_id(), name="thing_happened", revision="1", body_type="tests.ThingHappened",
                body={"n": version, "i": i, "text": f"event {i} of v{version}"},
            )
            for i in range(events)
        ),
        request_id=request_id or generate_id(),
        command_id=generate_id(),
        owner_id=owner_id,
        header=header if header is not None else {"upstream_id": "saga-1"},
        create_time=create_time if create_time is not None else now_ms(),
    )


class EventStoreContract(TestCaseMixin):
    """Mix into ``unittest.TestCase``; implement :meth:`make_store`."""

    aggregate_name = "order"
    context_name = "test-context"

    def make_store(self) -> EventStore:  # pragma: no cover - abstract
        raise NotImplementedError("return the event store under test")

    def setUp(self) -> None:
        super().setUp()
        self.store = self.make_store()
        self.addCleanup(self.store.close)

    def agg(self, id: str | None = None, *, tenant: str = "tenant-a", name: str | None = None,
            context: str | None = None) -> AggregateId:
        return AggregateId(
            aggregate_name=name or self.aggregate_name,
            id=id or uuid.uuid4().hex,
            context_name=context or self.context_name,
            tenant_id=tenant,
        )

    # --- append and load ------------------------------------------------------

    def test_append_then_load_returns_equal_streams_in_version_order(self):
        agg = self.agg()
        streams = [make_stream(agg, v, events=v) for v in (1, 2, 3)]
        for stream in streams:
            self.store.append(stream)
        loaded = self.store.load(agg)
        self.assertEqual(loaded, streams)
        self.assertEqual([s.size for s in loaded], [1, 2, 3])
        self.assertEqual(loaded[0].header, {"upstream_id": "saga-1"})

    def test_event_bodies_keep_their_decimals(self):
        """A Decimal in an event body comes back a Decimal with its digits (wow_django.domain.values)."""
        agg = self.agg()
        stream = make_stream(agg, 1)
        stream.body[0].body.update(amount=Decimal("19.90"), rates=[Decimal("0.125"), Decimal("1E+3")])
        self.store.append(stream)
        body = self.store.load(agg)[0].body[0].body
        self.assertEqual(body, stream.body[0].body)
        # Digits and scale as written; an exponent may come back written out (PostgreSQL's jsonb: 1E+3 is 1000).
        self.assertEqual([str(body["amount"]), str(body["rates"][0])], ["19.90", "0.125"])
        self.assertIsInstance(body["amount"], Decimal)

    def test_load_of_unknown_aggregate_is_empty(self):
        self.assertEqual(self.store.load(self.agg("nobody")), [])
        self.assertIsNone(self.store.last(self.agg("nobody")))

    def test_load_range_is_inclusive(self):
        agg = self.agg()
        streams = [make_stream(agg, v) for v in range(1, 6)]
        for stream in streams:
            self.store.append(stream)
        self.assertEqual(self.store.load(agg, 2, 4), streams[1:4])
        self.assertEqual(self.store.load(agg, 5), streams[4:])
        self.assertEqual(self.store.load(agg, 3, 3), [streams[2]])
        self.assertEqual(self.store.load(agg, 6, 9), [])

    def test_head_and_tail_are_validated(self):
        agg = self.agg()
        self.store.append(make_stream(agg, 1))
        with self.assertRaisesRegex(ValueError, "head_version"):
            self.store.load(agg, 0)
        with self.assertRaisesRegex(ValueError, "head_version"):
            self.store.load(agg, -3, 5)
        with self.assertRaisesRegex(ValueError, "tail_version"):
            self.store.load(agg, 3, 2)
        with self.assertRaisesRegex(ValueError, "integer"):
            self.store.load(agg, "1")

    def test_load_by_time_is_inclusive_and_version_ordered(self):
        agg = self.agg()
        streams = [make_stream(agg, v, create_time=t) for v, t in ((1, 1_000), (2, 2_000), (3, 3_000), (4, 4_000))]
        for stream in streams:
            self.store.append(stream)
        self.assertEqual(self.store.load_by_time(agg, 2_000, 3_000), streams[1:3])
        self.assertEqual(self.store.load_by_time(agg, 0, 10_000), streams)
        self.assertEqual(self.store.load_by_time(agg, 4_001, 5_000), [])
        with self.assertRaisesRegex(ValueError, "end_time"):
            self.store.load_by_time(agg, 3_000, 2_000)

    def test_last_is_the_highest_version(self):
        agg = self.agg()
        streams = [make_stream(agg, v) for v in (1, 2, 3)]
        for stream in streams:
            self.store.append(stream)
        self.assertEqual(self.store.last(agg), streams[-1])

    # --- version order, whatever the order of appends ---------------------------
    #
    # A store only forbids a version twice; it does not require versions to
    # arrive in order (two writers of one aggregate can land v3 before v2).
    # Reads are in version order all the same.

    def test_streams_appended_out_of_order_load_in_version_order(self):
        agg = self.agg()
        # Insertion order 3, 1, 2; creation times in the reverse of version
        # order; only version order is neither of the two.
        streams = {v: make_stream(agg, v, events=v, create_time=t) for v, t in ((1, 3_000), (2, 2_000), (3, 1_000))}
        for version in (3, 1, 2):
            self.store.append(streams[version])
        in_order = [streams[1], streams[2], streams[3]]
        self.assertEqual(self.store.load(agg), in_order)
        self.assertEqual(self.store.load(agg, 1, 2), in_order[:2])
        self.assertEqual(self.store.load(agg, 2), in_order[1:])
        self.assertEqual(self.store.load(agg, 2, 3), in_order[1:])
        self.assertEqual(self.store.load_by_time(agg, 0, 10_000), in_order)
        self.assertEqual(self.store.load_by_time(agg, 1_000, 2_000), [streams[2], streams[3]])
        self.assertEqual(self.store.last(agg), streams[3])

    def test_last_is_the_highest_version_not_the_last_appended(self):
        agg = self.agg()
        streams = {v: make_stream(agg, v) for v in (1, 2, 3)}
        for version in (1, 3, 2):
            self.store.append(streams[version])
        self.assertEqual(self.store.last(agg), streams[3])
        self.assertEqual(self.store.load(agg), [streams[1], streams[2], streams[3]])

    def test_a_gap_filled_later_loads_in_version_order(self):
        agg = self.agg()
        streams = {v: make_stream(agg, v) for v in range(1, 7)}
        appended: list[int] = []
        for version in (6, 2, 4, 1, 5, 3):
            self.store.append(streams[version])
            appended.append(version)
            self.assertEqual(self.store.load(agg), [streams[v] for v in sorted(appended)])
            self.assertEqual(self.store.last(agg), streams[6])
        self.assertEqual(self.store.load(agg, 3, 5), [streams[3], streams[4], streams[5]])

    def test_aggregates_of_one_type_do_not_mix(self):
        first, second = self.agg(), self.agg()
        a = make_stream(first, 1)
        b = make_stream(second, 1)
        self.store.append(a)
        self.store.append(b)
        self.assertEqual(self.store.load(first), [a])
        self.assertEqual(self.store.load(second), [b])

    # --- conflicts --------------------------------------------------------------

    def test_duplicate_aggregate_id_at_version_one(self):
        agg = self.agg()
        original = make_stream(agg, 1)
        self.store.append(original)
        with self.assertRaises(DuplicateAggregateId) as caught:
            self.store.append(make_stream(agg, 1))
        self.assertIsInstance(caught.exception, EventVersionConflict)
        self.assertEqual(caught.exception.aggregate_id, agg.id)
        self.assertEqual(self.store.load(agg), [original])

    def test_version_conflict_leaves_the_original_intact(self):
        agg = self.agg()
        first, original = make_stream(agg, 1), make_stream(agg, 2)
        self.store.append(first)
        self.store.append(original)
        rival = make_stream(agg, 2, events=3)
        with self.assertRaises(EventVersionConflict) as caught:
            self.store.append(rival)
        self.assertNotIsInstance(caught.exception, DuplicateAggregateId)
        self.assertEqual(caught.exception.version, 2)
        self.assertEqual(self.store.load(agg), [first, original])
        self.assertFalse(self.store.exists_request_id(self.aggregate_name, rival.request_id))

    def test_duplicate_request_id_is_refused_and_nothing_is_stored(self):
        agg = self.agg()
        first = make_stream(agg, 1, request_id="req-1")
        self.store.append(first)
        with self.assertRaises(DuplicateRequestId) as caught:
            self.store.append(make_stream(agg, 2, request_id="req-1"))
        self.assertEqual(caught.exception.request_id, "req-1")
        self.assertEqual(self.store.load(agg), [first])

    def test_same_request_id_on_another_aggregate_succeeds(self):
        first, second = self.agg(), self.agg()
        self.store.append(make_stream(first, 1, request_id="shared-req"))
        other = make_stream(second, 1, request_id="shared-req")
        self.store.append(other)
        self.assertEqual(self.store.load(second), [other])

    def test_exists_request_id(self):
        agg, other = self.agg(), self.agg()
        self.store.append(make_stream(agg, 1, request_id="req-x"))
        self.assertTrue(self.store.exists_request_id(self.aggregate_name, "req-x"))
        self.assertTrue(self.store.exists_request_id(self.aggregate_name, "req-x", agg.id))
        self.assertFalse(self.store.exists_request_id(self.aggregate_name, "req-x", other.id))
        self.assertFalse(self.store.exists_request_id(self.aggregate_name, "req-y"))
        self.assertFalse(self.store.exists_request_id("customer", "req-x"))

    def test_get_by_request_id(self):
        agg = self.agg()
        stream = make_stream(agg, 1, request_id="req-z")
        self.store.append(stream)
        self.assertEqual(self.store.get_by_request_id(agg, "req-z"), stream)
        self.assertIsNone(self.store.get_by_request_id(agg, "req-other"))

    def test_reads_of_one_aggregate_find_nothing_under_another_tenant(self):
        agg = self.agg(tenant="tenant-a")
        streams = [make_stream(agg, v, request_id=f"req-{v}", create_time=1_000 * v) for v in (1, 2)]
        for stream in streams:
            self.store.append(stream)
        intruder = self.agg(agg.id, tenant="tenant-b")
        self.assertEqual(self.store.load(intruder), [])
        self.assertEqual(self.store.load(intruder, 1, 2), [])
        self.assertEqual(self.store.load_by_time(intruder, 0, 10_000), [])
        self.assertIsNone(self.store.last(intruder))
        self.assertIsNone(self.store.get_by_request_id(intruder, "req-1"))
        # The owner still reads everything; locate names the owner, for code that serves every tenant.
        self.assertEqual(self.store.load(agg), streams)
        self.assertEqual(self.store.load_by_time(agg, 0, 10_000), streams)
        self.assertEqual(self.store.last(agg), streams[1])
        self.assertEqual(self.store.get_by_request_id(agg, "req-2"), streams[1])
        self.assertEqual(self.store.locate(self.aggregate_name, agg.id), agg)
        self.assertIsNone(self.store.locate(self.aggregate_name, "nobody"))
        self.assertIsNone(self.store.locate("customer", agg.id))

    def test_append_many_gives_each_stream_its_own_result(self):
        agg, other = self.agg(), self.agg()
        self.store.append(make_stream(agg, 1, request_id="taken"))
        batch = [
            make_stream(agg, 2),
            make_stream(agg, 1),  # version taken
            make_stream(other, 1, request_id="fresh"),
            make_stream(agg, 3, request_id="taken"),  # request id taken
            make_stream(other, 1),  # taken by the third stream of this batch
        ]
        results = self.store.append_many(batch)
        self.assertIsNone(results[0])
        self.assertIsInstance(results[1], DuplicateAggregateId)
        self.assertIsNone(results[2])
        self.assertIsInstance(results[3], DuplicateRequestId)
        self.assertIsInstance(results[4], DuplicateAggregateId)
        self.assertEqual([s.version for s in self.store.load(agg)], [1, 2])
        self.assertEqual(self.store.load(other), [batch[2]])

    # --- concurrency ------------------------------------------------------------

    def test_parallel_first_appends_have_exactly_one_winner(self):
        agg = self.agg()
        barrier = threading.Barrier(8, timeout=60)
        outcomes: list[object] = []
        lock = threading.Lock()

        def worker():
            stream = make_stream(agg, 1)
            barrier.wait()
            try:
                self.store.append(stream)
                result: object = stream
            except DuplicateAggregateId as exc:
                result = exc
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if isinstance(o, EventStream)]
        self.assertEqual(len(outcomes), 8)
        self.assertEqual(len(winners), 1)
        self.assertEqual(self.store.load(agg), winners)

    def test_parallel_appends_and_loads_lose_nothing(self):
        agg = self.agg()
        writers, per_writer = 8, 25
        accepted: list[str] = []
        conflicts = [0]
        problems: list[str] = []
        lock = threading.Lock()
        done = threading.Event()

        def writer(n: int):
            for i in range(per_writer):
                request_id = f"w{n}-{i}"
                given_up_at = time.monotonic() + 120
                while True:
                    last = self.store.last(agg)
                    version = last.version + 1 if last else 1
                    try:
                        self.store.append(make_stream(agg, version, request_id=request_id))
                    except EventVersionConflict:
                        with lock:
                            conflicts[0] += 1
                        given_up_at = time.monotonic() + 120  # another writer's append landed: progress
                        continue
                    except ContextLockTimeout as exc:
                        # A timeout is what eight writers of one aggregate may meet on a slow machine (nothing
                        # stored, the contract says): retried with the same request id, as a client does. Had
                        # it stored the stream, the retry would fail as a repeated request id. A store that
                        # times out for two minutes on end (a lock left held) fails the test, not holds it.
                        with lock:
                            conflicts[0] += 1
                        if time.monotonic() > given_up_at:
                            problems.append(f"{request_id}: only lock timeouts for 120 s ({exc})")
                            return
                        continue
                    with lock:
                        accepted.append(request_id)
                    break

        def reader():
            while not done.is_set():
                versions = [s.version for s in self.store.load(agg)]
                if versions != list(range(1, len(versions) + 1)):
                    problems.append(f"load saw a gap or disorder: {versions}")
                    return

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads + readers:
            t.start()
        for t in threads:
            t.join()
        done.set()
        for t in readers:
            t.join()

        self.assertEqual(problems, [])
        stored = self.store.load(agg)
        self.assertEqual(len(accepted), writers * per_writer)
        self.assertEqual([s.version for s in stored], list(range(1, writers * per_writer + 1)))
        self.assertEqual(sorted(s.request_id for s in stored), sorted(accepted))

    # --- scanning ---------------------------------------------------------------

    def test_scan_is_ordered_exclusive_limited_and_unique(self):
        ids = [f"agg-{n:03d}" for n in range(20)]
        shuffled = ids[:]
        random.Random(7).shuffle(shuffled)
        for aggregate_id in shuffled:
            agg = self.agg(aggregate_id)
            for version in (1, 2, 3):  # several streams per aggregate, listed once
                self.store.append(make_stream(agg, version))
        first = self.store.scan_aggregate_ids(self.aggregate_name, "", 7)
        self.assertEqual([a.id for a in first], ids[:7])
        rest = self.store.scan_aggregate_ids(self.aggregate_name, first[-1].id, 100)
        self.assertEqual([a.id for a in rest], ids[7:])
        self.assertEqual(self.store.scan_aggregate_ids(self.aggregate_name, ids[-1], 10), [])
        between = self.store.scan_aggregate_ids(self.aggregate_name, "agg-004x", 2)
        self.assertEqual([a.id for a in between], ["agg-005", "agg-006"])
        self.assertEqual(first[0], self.agg(ids[0]))
        self.assertEqual([a.id for a in self.store.iter_all(self.aggregate_name, batch=6)], ids)

    def test_scan_filters_by_aggregate_context_and_tenant(self):
        self.store.append(make_stream(self.agg("a1", tenant="t1"), 1))
        self.store.append(make_stream(self.agg("a2", tenant="t2"), 1))
        self.store.append(make_stream(self.agg("a3", tenant="t1", context="other-context"), 1))
        self.store.append(make_stream(self.agg("c1", name="customer"), 1))
        everything = self.store.scan_aggregate_ids(self.aggregate_name)
        self.assertEqual([a.id for a in everything], ["a1", "a2", "a3"])
        by_tenant = self.store.scan_aggregate_ids(self.aggregate_name, tenant_id="t1")
        self.assertEqual([a.id for a in by_tenant], ["a1", "a3"])
        by_context = self.store.scan_aggregate_ids(self.aggregate_name, context_name=self.context_name)
        self.assertEqual([a.id for a in by_context], ["a1", "a2"])
        both = self.store.scan_aggregate_ids(self.aggregate_name, tenant_id="t1", context_name=self.context_name)
        self.assertEqual([a.id for a in both], ["a1"])
        self.assertEqual([a.id for a in self.store.scan_aggregate_ids("customer")], ["c1"])

    def test_scan_arguments_are_validated(self):
        with self.assertRaisesRegex(ValueError, "limit"):
            self.store.scan_aggregate_ids(self.aggregate_name, "", 0)
        with self.assertRaisesRegex(ValueError, "after_id"):
            self.store.scan_aggregate_ids(self.aggregate_name, None, 5)

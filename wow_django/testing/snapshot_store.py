"""The snapshot-store contract (DESIGN part B)."""

from __future__ import annotations

import random
import threading
import uuid
from decimal import Decimal

from wow_django.persistence.contracts import SnapshotStore
from wow_django.persistence.records import AggregateId, Snapshot
from wow_django.testing._case import TestCaseMixin


def make_snapshot(aggregate_id: AggregateId, version: int, **state) -> Snapshot:
    return Snapshot(
        aggregate_id=aggregate_id,
        version=version,
        state={"version_seen": version, **state},
        event_id=f"evt-{version}",
        owner_id="owner-1",
        first_operator="alice",
        operator="bob",
        first_event_time=1_000,
        event_time=1_000 + version,
        snapshot_time=2_000 + version,
    )


class SnapshotStoreContract(TestCaseMixin):
    """Mix into ``unittest.TestCase``; implement :meth:`make_store`."""

    aggregate_name = "order"

    def make_store(self) -> SnapshotStore:  # pragma: no cover - abstract
        raise NotImplementedError("return the snapshot store under test")

    def setUp(self) -> None:
        super().setUp()
        self.store = self.make_store()
        self.addCleanup(self.store.close)

    def agg(self) -> AggregateId:
        return AggregateId(self.aggregate_name, uuid.uuid4().hex, "test-context", "tenant-a")

    def test_round_trip(self):
        agg = self.agg()
        snapshot = make_snapshot(agg, 3, status="PAID", lines=[{"sku": "a", "qty": 2}], nested={"x": {"y": 1}})
        self.store.save(snapshot)
        self.assertEqual(self.store.load(agg), snapshot)

    def test_decimals_and_times_keep_their_types(self):
        """Stored values keep their types (wow_django.domain.values): a Decimal comes back a Decimal with its
        digits (scale included) wherever it sits; canonical time text comes back as the same text."""
        agg = self.agg()
        amounts = {"total": Decimal("100.00"), "tiny": Decimal("0.000000000000000000000000000001"),
                   "big": Decimal("12345678901234567890.123456789"), "negative": Decimal("-7.5"),
                   "integral": Decimal("42")}
        snapshot = make_snapshot(agg, 1, **amounts, lines=[{"price": Decimal("3.50")}],
                                 due_at="2026-03-01T09:30:00.000000Z")
        self.store.save(snapshot)
        state = self.store.load(agg).state
        for name, amount in amounts.items():
            self.assertEqual(state[name], amount, name)
            self.assertEqual(str(state[name]), str(amount), name)
        self.assertIsInstance(state["total"], Decimal)
        self.assertEqual((state["lines"][0]["price"], str(state["lines"][0]["price"])), (Decimal("3.50"), "3.50"))
        self.assertEqual(state["due_at"], "2026-03-01T09:30:00.000000Z")

    def test_another_tenant_finds_no_snapshot(self):
        agg = self.agg()
        snapshot = make_snapshot(agg, 2, status="PAID")
        self.store.save(snapshot)
        intruder = AggregateId(agg.aggregate_name, agg.id, agg.context_name, "tenant-b")
        self.assertIsNone(self.store.load(intruder))
        self.assertEqual(self.store.load(agg), snapshot)

    def test_deleted_flag_round_trips(self):
        agg = self.agg()
        snapshot = Snapshot(aggregate_id=agg, version=4, state={}, deleted=True)
        self.store.save(snapshot)
        self.assertTrue(self.store.load(agg).deleted)

    def test_unknown_aggregate_loads_none(self):
        self.assertIsNone(self.store.load(self.agg()))

    def test_older_save_is_ignored(self):
        agg = self.agg()
        newer = make_snapshot(agg, 5, status="new")
        self.store.save(newer)
        self.store.save(make_snapshot(agg, 4, status="old"))
        self.assertEqual(self.store.load(agg), newer)

    def test_same_version_save_replaces(self):
        agg = self.agg()
        self.store.save(make_snapshot(agg, 5, status="first"))
        again = make_snapshot(agg, 5, status="second")
        self.store.save(again)
        self.assertEqual(self.store.load(agg), again)

    def test_newer_save_replaces(self):
        agg = self.agg()
        self.store.save(make_snapshot(agg, 1))
        newer = make_snapshot(agg, 2)
        self.store.save(newer)
        self.assertEqual(self.store.load(agg), newer)

    def test_save_many_saves_each_with_its_guard(self):
        stale, fresh, twice, new = self.agg(), self.agg(), self.agg(), self.agg()
        kept = make_snapshot(stale, 5, status="kept")
        self.store.save(kept)
        self.store.save(make_snapshot(fresh, 1))
        self.store.save_many([
            make_snapshot(stale, 4, status="older: ignored"),
            make_snapshot(fresh, 3, status="newer"),
            make_snapshot(twice, 2, status="the higher of two"),
            make_snapshot(twice, 1, status="the lower of two"),
            make_snapshot(new, 1, status="first"),
        ])
        self.assertEqual(self.store.load(stale), kept)
        self.assertEqual(self.store.load(fresh).state["status"], "newer")
        self.assertEqual(self.store.load(twice).state["status"], "the higher of two")
        self.assertEqual(self.store.load(new).state["status"], "first")
        self.store.save_many([])  # nothing to do

    def test_save_many_of_more_than_a_statement_holds(self):
        aggregates = [self.agg() for _ in range(1200)]  # more than one chunk of the SQL store's statement
        self.store.save_many([make_snapshot(agg, 1, n=n) for n, agg in enumerate(aggregates)])
        self.assertEqual([self.store.load(agg).state["n"] for agg in aggregates[::199]], list(range(0, 1200, 199)))

    def test_state_keys_that_look_like_operators_are_kept_verbatim(self):
        agg = self.agg()
        snapshot = make_snapshot(agg, 1, note="$version", odd={"$literal": 1, "a$b": 2})
        self.store.save(snapshot)
        self.assertEqual(self.store.load(agg), snapshot)

    def test_concurrent_shuffled_saves_keep_the_highest_version(self):
        for round_ in range(5):
            agg = self.agg()
            versions = list(range(1, 9))
            random.Random(round_).shuffle(versions)
            barrier = threading.Barrier(len(versions), timeout=60)

            def save(version: int, agg=agg, barrier=barrier) -> None:
                barrier.wait()
                self.store.save(make_snapshot(agg, version))

            threads = [threading.Thread(target=save, args=(v,)) for v in versions]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(self.store.load(agg).version, 8, f"round {round_}, order {versions}")

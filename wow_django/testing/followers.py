"""The follower contracts (DESIGN G): the stream feed, the follower store, and the runner on both.

A backend's test says how to build its stores::

    class TestMyFollowers(StreamFeedContract, FollowerStoreContract, FollowerRunnerContract, TestCase):
        def make_event_store(self): ...
        def make_feed(self, store, context_name): ...
        def make_follower_store(self): ...

Each test uses its own context and follower names, so stores that share a
database do not see each other's data.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from wow_django.application.followers import Follower, FollowerRunner
from wow_django.exceptions import (
    CheckpointFenced,
    DuplicateAggregateId,
    LeaseLost,
    RecoverableStoreError,
    UnknownFollower,
)
from wow_django.persistence.contracts import EventStore
from wow_django.persistence.followers import FollowerStore, Gap, PoisonEvent, PositionedStream, StreamFeed
from wow_django.persistence.records import AggregateId
from wow_django.testing._case import TestCaseMixin
from wow_django.testing.clock import FakeClock
from wow_django.testing.event_store import make_stream


class HidingFeed(StreamFeed):
    """A feed that hides some positions of another (a late commit still on its way) and may call some void."""

    gaps_are_final = False

    def __init__(self, inner: StreamFeed, hidden: Iterable[int] = (), void: Iterable[int] = ()):
        self.inner = inner
        self.hidden = set(hidden)
        self.void = set(void)
        self.notifier = inner.notifier

    def read(self, after: int, limit: int) -> list[PositionedStream]:
        found: list[PositionedStream] = []
        while len(found) < limit:
            batch = self.inner.read(after, limit)
            if not batch:
                break
            found.extend(item for item in batch if item.position not in self.hidden)
            after = batch[-1].position
        return found[:limit]

    def head(self) -> int:
        return self.inner.head()

    def position_at(self, time: datetime) -> int:
        return self.inner.position_at(time)

    def count_between(self, after: int, upto: int) -> int:
        return self.inner.count_between(after, upto) - len([p for p in self.hidden if after < p <= upto])

    def position_of(self, aggregate_name: str, aggregate_id: str, version: int) -> int | None:
        position = self.inner.position_of(aggregate_name, aggregate_id, version)
        return None if position in self.hidden else position

    def void_positions(self, after: int, upto: int) -> Iterable[int]:
        """The positions called void, and where the inner feed's gaps are final every position it lacks
        that is not hidden (a feed's positions need not be contiguous: one sequence for several contexts)."""
        void = {p for p in self.void if after < p <= upto}
        if self.inner.gaps_are_final and upto > after:
            present = {item.position for item in self.inner.read(after, upto - after)}
            void |= {p for p in range(after + 1, upto + 1) if p not in present and p not in self.hidden}
        return sorted(void)


class _FollowerHarness(TestCaseMixin):
    """The factories a backend's test implements, and what the contracts share."""

    def make_event_store(self) -> EventStore:  # pragma: no cover - abstract
        raise NotImplementedError("return the event store under test")

    def make_feed(self, store: EventStore, context_name: str) -> StreamFeed:  # pragma: no cover - abstract
        raise NotImplementedError("return the feed of context_name over store")

    def make_follower_store(self) -> FollowerStore:  # pragma: no cover - abstract
        raise NotImplementedError("return the follower store under test")

    def setUp(self) -> None:
        super().setUp()
        self.context = f"ctx-{uuid.uuid4().hex[:10]}"
        self.events = self.make_event_store()
        self.addCleanup(self.events.close)
        self.feed = self.make_feed(self.events, self.context)
        self.followers = self.make_follower_store()
        self.addCleanup(self.followers.close)
        self.clock = FakeClock()

    def agg(self, name: str = "order", context: str | None = None) -> AggregateId:
        return AggregateId(aggregate_name=name, id=uuid.uuid4().hex, context_name=context or self.context,
                           tenant_id="tenant-a")

    def append(self, count: int = 1, *, name: str = "order", context: str | None = None,
               create_time: int | None = None) -> list:
        """``count`` new aggregates' first streams, appended one by one; the streams."""
        streams = [make_stream(self.agg(name, context), 1, create_time=create_time) for _ in range(count)]
        for stream in streams:
            self.events.append(stream)
        return streams

    def follower_name(self) -> str:
        return f"f-{uuid.uuid4().hex[:10]}"

    @contextlib.contextmanager
    def hung_writer(self, stream):
        """``stream`` appended by another writer that hangs before committing until the block ends.

        A backend whose append is one atomic write (in_memory, MongoDB) has nothing to hold: the
        default appends at the end. The django backend's tests hold a transaction open in a thread.
        """
        yield
        self.events.append(stream)


class StreamFeedContract(_FollowerHarness):
    """The event store read by position."""

    def test_read_gives_the_context_streams_in_append_order(self):
        streams = self.append(5)
        self.append(2, context=f"{self.context}-other")
        found = self.feed.read(0, 100)
        self.assertEqual([item.stream for item in found], streams)
        positions = [item.position for item in found]
        self.assertEqual(positions, sorted(positions))
        self.assertEqual(len(set(positions)), 5)
        self.assertGreaterEqual(positions[0], 1)

    def test_read_after_and_limit(self):
        self.append(6)
        everything = self.feed.read(0, 100)
        self.assertEqual(self.feed.read(0, 2), everything[:2])
        self.assertEqual(self.feed.read(everything[1].position, 3), everything[2:5])
        self.assertEqual(self.feed.read(everything[-1].position, 10), [])
        self.assertEqual(self.feed.read(everything[2].position - 1, 1), [everything[2]])

    def test_read_arguments_are_validated(self):
        for after, limit in ((-1, 10), (0, 0), ("1", 10), (0, 1.5), (True, 10)):
            with self.subTest(after=after, limit=limit), self.assertRaises(ValueError):
                self.feed.read(after, limit)

    def test_position_of_finds_a_stream_by_aggregate_and_version(self):
        first, second = self.append(2)
        later = make_stream(first.aggregate_id, 2)
        self.events.append(later)
        self.append(1, context=f"{self.context}-other")
        by_stream = {item.stream.id: item.position for item in self.feed.read(0, 10)}
        for stream in (first, second, later):
            agg = stream.aggregate_id
            self.assertEqual(self.feed.position_of(agg.aggregate_name, agg.id, stream.version), by_stream[stream.id])
        agg = first.aggregate_id
        self.assertIsNone(self.feed.position_of(agg.aggregate_name, agg.id, 3))  # not stored
        self.assertIsNone(self.feed.position_of("customer", agg.id, 1))  # another aggregate type
        other = self.make_feed(self.events, f"{self.context}-other")
        self.assertIsNone(other.position_of(agg.aggregate_name, agg.id, 1))  # another context

    def test_an_empty_context(self):
        self.append(2, context=f"{self.context}-other")
        self.assertEqual(self.feed.read(0, 10), [])
        self.assertEqual(self.feed.head(), 0)
        self.assertEqual(self.feed.position_at(datetime.now(UTC) + timedelta(days=1)), 0)
        self.assertEqual(self.feed.count_between(0, 1_000_000), 0)

    def test_head_position_at_and_count_between(self):
        base = 1_700_000_000_000
        self.append(1, create_time=base)
        self.append(1, create_time=base + 1_000)
        self.append(1, create_time=base + 2_000)
        p1, p2, p3 = (item.position for item in self.feed.read(0, 10))
        self.assertEqual(self.feed.head(), p3)
        at = datetime.fromtimestamp
        self.assertEqual(self.feed.position_at(at((base + 1_500) / 1000, UTC)), p2)
        self.assertEqual(self.feed.position_at(at((base + 1_000) / 1000, UTC)), p1)  # created before: strictly
        self.assertEqual(self.feed.position_at(at(base / 1000, UTC)), 0)
        self.assertEqual(self.feed.count_between(0, p3), 3)
        self.assertEqual(self.feed.count_between(p1, p3), 2)
        self.assertEqual(self.feed.count_between(p3, p3 + 100), 0)
        self.assertEqual(self.feed.created_at(p2), at((base + 1_000) / 1000, UTC))

    def test_a_refused_append_takes_no_visible_position(self):
        first = self.append(1)[0]
        with self.assertRaises(DuplicateAggregateId):
            self.events.append(make_stream(first.aggregate_id, 1))  # version 1 again
        second = self.append(1)[0]
        found = self.feed.read(0, 10)
        self.assertEqual([item.stream for item in found], [first, second])

    def test_concurrent_appends_are_read_in_commit_order(self):
        """Readers running alongside writers only ever see a prefix of the final order when gaps are final."""
        writers, per_writer = 4, 15
        done = threading.Event()
        snapshots: list[list[int]] = []
        errors: list[BaseException] = []

        def write():
            try:
                self.append(per_writer)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def read():
            reader_feed = self.make_feed(self.events, self.context)
            while not done.is_set():
                snapshots.append([item.position for item in reader_feed.read(0, 10_000)])

        reader = threading.Thread(target=read)
        reader.start()
        threads = [threading.Thread(target=write) for _ in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        reader.join()
        self.assertEqual(errors, [])
        final = [item.position for item in self.feed.read(0, 10_000)]
        self.assertEqual(len(final), writers * per_writer)
        self.assertEqual(final, sorted(set(final)))
        if self.feed.gaps_are_final:
            for snapshot in snapshots:
                self.assertEqual(snapshot, final[:len(snapshot)])


class FollowerStoreContract(_FollowerHarness):
    """Followers' durable state: checkpoint, lease, pause, rewind, poison and its audit, skipped gaps."""

    def now(self) -> datetime:
        return self.clock()

    def test_acquire_creates_the_follower_at_position_zero(self):
        name = self.follower_name()
        self.assertIsNone(self.followers.get(name))
        self.assertTrue(self.followers.acquire(name, "a", 30, now=self.now()))
        state = self.followers.get(name)
        self.assertEqual((state.name, state.position, state.paused, state.poison), (name, 0, False, None))
        self.assertEqual(state.lease_owner, "a")
        self.assertEqual(state.lease_until, self.now() + timedelta(seconds=30))
        self.assertIn(name, [s.name for s in self.followers.all()])

    def test_the_lease_is_exclusive_until_it_expires_or_is_released(self):
        name = self.follower_name()
        self.assertTrue(self.followers.acquire(name, "a", 30, now=self.now()))
        self.assertFalse(self.followers.acquire(name, "b", 30, now=self.clock.advance(10)))
        self.assertTrue(self.followers.acquire(name, "a", 30, now=self.now()))  # renewed until now + 30
        self.assertFalse(self.followers.acquire(name, "b", 30, now=self.clock.advance(29)))
        self.assertTrue(self.followers.acquire(name, "b", 30, now=self.clock.advance(2)))  # expired: taken over
        self.assertEqual(self.followers.get(name).lease_owner, "b")
        self.followers.release(name, "a")  # not a's: nothing
        self.assertEqual(self.followers.get(name).lease_owner, "b")
        self.followers.release(name, "b")
        self.assertIsNone(self.followers.get(name).lease_owner)
        self.assertTrue(self.followers.acquire(name, "a", 30, now=self.now()))

    def test_of_owners_acquiring_at_once_one_wins(self):
        for _ in range(3):
            name = self.follower_name()
            owners = [f"owner-{i}" for i in range(6)]
            barrier = threading.Barrier(len(owners), timeout=60)
            results: dict[str, bool] = {}
            now = self.now()

            def take(owner, name=name, barrier=barrier, results=results, now=now):
                barrier.wait()
                results[owner] = self.followers.acquire(name, owner, 30, now=now)

            threads = [threading.Thread(target=take, args=(owner,)) for owner in owners]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            winners = [owner for owner, won in results.items() if won]
            self.assertEqual(len(winners), 1, results)
            self.assertEqual(self.followers.get(name).lease_owner, winners[0])

    def test_advance_moves_forward_only_and_records_gaps(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.advance(name, "a", 5, now=self.now())
        self.assertEqual(self.followers.get(name).position, 5)
        self.followers.advance(name, "a", 3, now=self.now())
        self.assertEqual(self.followers.get(name).position, 5)
        gap = Gap(first=7, last=8, seen_at=self.now(), skipped_at=self.clock.advance(10))
        self.followers.advance(name, "a", 9, now=self.now(), gaps=(gap,))
        state = self.followers.get(name)
        self.assertEqual((state.position, state.gaps_skipped, state.last_gap), (9, 2, gap))
        self.assertEqual(state.updated_at, self.now())

    def test_a_stale_owner_changes_nothing(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.advance(name, "a", 2, now=self.now())
        self.followers.acquire(name, "b", 30, now=self.clock.advance(31))
        with self.assertRaises(LeaseLost) as raised:
            self.followers.advance(name, "a", 10, now=self.now(),
                                   gaps=(Gap(3, 3, self.now(), self.now()),))
        self.assertEqual((raised.exception.owner, raised.exception.holder), ("a", "b"))
        poison = PoisonEvent(position=3, stream_id="s", aggregate="order/1", error="boom", at=self.now())
        with self.assertRaises(LeaseLost):
            self.followers.set_poison(name, "a", poison, now=self.now())
        state = self.followers.get(name)
        self.assertEqual((state.position, state.gaps_skipped, state.poison), (2, 0, None))

    def test_an_expired_lease_cannot_advance_even_untaken(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        with self.assertRaises(LeaseLost):
            self.followers.advance(name, "a", 1, now=self.clock.advance(31))
        with self.assertRaises(LeaseLost):
            self.followers.advance(name, "nobody", 1, now=self.now())
        self.assertEqual(self.followers.get(name).position, 0)

    def test_unknown_followers(self):
        name = self.follower_name()
        with self.assertRaises(UnknownFollower):
            self.followers.set_paused(name, True)
        with self.assertRaises(UnknownFollower):
            self.followers.rewind(name, 0, now=self.now())
        with self.assertRaises(UnknownFollower):
            self.followers.skip_poison(name, by="ops", reason="x", now=self.now())
        with self.assertRaises(LeaseLost):
            self.followers.advance(name, "a", 1, now=self.now())
        self.assertEqual(self.followers.skipped(name), [])

    def test_pause_and_resume(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.set_paused(name, True)
        self.assertTrue(self.followers.get(name).paused)
        self.assertEqual(self.followers.get(name).lease_owner, "a")
        self.followers.set_paused(name, False)
        self.assertFalse(self.followers.get(name).paused)

    def test_rewind_moves_either_way_and_clears_the_poison(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.advance(name, "a", 8, now=self.now())
        poison = PoisonEvent(position=9, stream_id="s-9", aggregate="order/9", error="boom", at=self.now())
        self.followers.set_poison(name, "a", poison, now=self.now())
        self.assertEqual(self.followers.get(name).poison, poison)
        self.followers.rewind(name, 3, now=self.clock.advance(1))
        state = self.followers.get(name)
        self.assertEqual((state.position, state.poison, state.lease_owner), (3, None, "a"))
        self.followers.rewind(name, 20, now=self.now())
        self.assertEqual(self.followers.get(name).position, 20)
        with self.assertRaises(ValueError):
            self.followers.rewind(name, -1, now=self.now())

    def test_a_checkpoint_of_an_earlier_generation_is_refused(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        read_in = self.followers.get(name).generation
        self.followers.advance(name, "a", 5, now=self.now(), generation=read_in)
        for operator_move in (lambda: self.followers.rewind(name, 2, now=self.now()),
                              lambda: self.followers.set_paused(name, True),
                              lambda: self.followers.set_paused(name, False)):
            operator_move()
            state = self.followers.get(name)
            self.assertGreater(state.generation, read_in)
            with self.assertRaises(CheckpointFenced):
                self.followers.advance(name, "a", 9, now=self.now(), generation=read_in)
            with self.assertRaises(CheckpointFenced):
                self.followers.set_poison(name, "a", None, now=self.now(), generation=read_in)
            self.assertEqual(self.followers.get(name).position, 2)
            read_in = state.generation
        self.followers.advance(name, "a", 9, now=self.now(), generation=read_in)
        self.assertEqual(self.followers.get(name).position, 9)
        with self.assertRaises(LeaseLost):  # another owner: the lease decides first
            self.followers.advance(name, "b", 10, now=self.now(), generation=read_in)

    def test_skip_poison_moves_past_it_with_an_audit_record(self):
        name = self.follower_name()
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.advance(name, "a", 4, now=self.now())
        with self.assertRaises(ValueError):
            self.followers.skip_poison(name, by="ops", reason="nothing to skip", now=self.now())
        poison = PoisonEvent(position=5, stream_id="s-5", aggregate="order/5", error="ValueError: bad", at=self.now())
        self.followers.set_poison(name, "a", poison, now=self.now())
        skipped_at = self.clock.advance(60)
        self.assertEqual(self.followers.skip_poison(name, by="alice", reason="known bad data", now=skipped_at), poison)
        state = self.followers.get(name)
        self.assertEqual((state.position, state.poison), (5, None))
        self.assertEqual(self.followers.skipped(name), [{
            "position": 5, "streamId": "s-5", "aggregate": "order/5", "error": "ValueError: bad", "by": "alice",
            "reason": "known bad data", "at": skipped_at,
        }])
        self.followers.acquire(name, "a", 30, now=self.now())
        self.followers.set_poison(name, "a", poison, now=self.now())
        self.followers.set_poison(name, "a", None, now=self.now())
        self.assertIsNone(self.followers.get(name).poison)
        self.assertEqual(self.followers.get(name).position, 5)


class FollowerRunnerContract(_FollowerHarness):
    """The runner on the backend's feed and store: delivery, checkpoints, leases, gaps, operations."""

    def setUp(self) -> None:
        super().setUp()
        self.seen: list[tuple[str, int]] = []  # (owner, position) handed to a handler
        self.fail_at: set[int] = set()

    def handler(self, owner_of=lambda: "?"):
        def handle(item: PositionedStream) -> None:
            if item.position in self.fail_at:
                raise ValueError(f"cannot handle {item.position}")
            self.seen.append((owner_of(), item.position))

        return handle

    def runner(self, *, name: str | None = None, feed: StreamFeed | None = None, owner: str | None = None,
               cls=FollowerRunner, aggregates=None, events=None, **options) -> FollowerRunner:
        holder: list[FollowerRunner] = []
        declared = Follower(name or self.name, self.handler(lambda: holder[0].owner),
                            frozenset(aggregates) if aggregates else None, frozenset(events) if events else None)
        options = {"gap_timeout_s": 10.0, "lease_s": 30.0, "min_batch": 4, "max_batch": 16, "max_wait_s": 0.05,
                   **options}
        options.setdefault("clock", self.clock)  # None: the real time
        runner = cls(declared, feed or self.feed, self.followers, owner=owner or uuid.uuid4().hex, **options)
        holder.append(runner)
        return runner

    def positions(self) -> list[int]:
        return [item.position for item in self.feed.read(0, 10_000)]

    def handled(self) -> list[int]:
        return [position for _, position in self.seen]

    def drain(self, runner: FollowerRunner, cycles: int = 50) -> None:
        for _ in range(cycles):
            cycle = runner.run_once()
            if not cycle.full:
                return

    @property
    def name(self) -> str:
        if not hasattr(self, "_name"):
            self._name = self.follower_name()
        return self._name

    def test_hands_every_stream_in_order_and_checkpoints(self):
        self.append(10)
        runner = self.runner()
        self.drain(runner)
        self.assertEqual(self.handled(), self.positions())
        self.assertEqual(self.followers.get(self.name).position, self.positions()[-1])
        self.assertEqual(runner.run_once().handled, 0)

    def test_a_batch_longer_than_the_lease_renews_it_and_checkpoints_once(self):
        self.append(6)
        runner = self.runner(lease_s=30.0, min_batch=8)
        handle = runner.follower.handler

        def slow(item):  # each stream takes 12 s: the batch takes 72 s of a 30 s lease
            handle(item)
            self.clock.advance(12)

        runner.follower = replace(runner.follower, handler=slow)
        cycle = runner.run_once()
        self.assertEqual((cycle.handled, self.handled()), (6, self.positions()))
        state = self.followers.get(self.name)
        self.assertEqual((state.position, state.lease_owner), (self.positions()[-1], runner.owner))
        self.assertEqual(runner.run_once().handled, 0)  # nothing handed twice

    def test_batches_grow_while_behind_and_shrink_when_live(self):
        self.append(30)
        runner = self.runner(min_batch=2, max_batch=8)
        reads = [runner.run_once().read for _ in range(6)]
        self.assertEqual(reads, [2, 4, 8, 8, 8, 0])
        self.assertEqual(runner.batch, 4)
        runner.run_once()
        self.assertEqual(runner.batch, 2)
        self.assertEqual(self.handled(), self.positions())

    def test_at_least_once_across_a_crash_before_the_checkpoint(self):
        self.append(3)

        class Crashing(FollowerRunner):
            def checkpoint(self, position, gaps):
                raise RuntimeError("the process died here")

        crashing = self.runner(cls=Crashing)
        with self.assertRaisesRegex(RuntimeError, "died"):
            crashing.run_once()
        self.assertEqual(self.followers.get(self.name).position, 0)
        successor = self.runner()
        self.assertEqual(successor.run_once().handled, 0)  # the dead instance still holds the lease
        self.clock.advance(31)
        self.drain(successor)
        self.assertEqual(self.handled(), self.positions() * 2)

    def test_resumes_after_a_restart(self):
        self.append(3)
        first = self.runner()
        self.drain(first)
        first.close()
        self.append(2)
        second = self.runner()
        self.drain(second)
        self.assertEqual(self.handled(), self.positions())
        self.assertEqual({owner for owner, _ in self.seen}, {first.owner, second.owner})
        self.assertEqual([owner for owner, _ in self.seen], [first.owner] * 3 + [second.owner] * 2)

    def test_two_instances_one_lease_only_one_processes(self):
        self.append(20)
        runners = [self.runner(owner=f"instance-{i}", min_batch=1, max_batch=2) for i in range(2)]
        barrier = threading.Barrier(2, timeout=60)

        def work(runner):
            barrier.wait()
            for _ in range(30):
                runner.run_once()

        threads = [threading.Thread(target=work, args=(runner,)) for runner in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(self.handled(), self.positions())
        self.assertEqual(len({owner for owner, _ in self.seen}), 1)

    def test_a_lost_lease_stops_the_stale_instance(self):
        self.append(2)
        stale = self.runner(owner="stale")
        self.drain(stale)
        self.clock.advance(31)
        fresh = self.runner(owner="fresh")
        fresh.run_once()
        self.append(2)
        stale._lease_until = self.clock() + timedelta(seconds=30)  # it believes it still holds the lease
        cycle = stale.run_once()
        self.assertFalse(cycle.leader)
        self.assertEqual(self.followers.get(self.name).lease_owner, "fresh")
        self.drain(fresh)
        self.assertEqual(self.followers.get(self.name).position, self.positions()[-1])

    def test_a_late_commit_is_held_within_the_gap_timeout(self):
        self.append(3)
        p1, p2, p3 = self.positions()
        feed = HidingFeed(self.feed, hidden={p2})
        runner = self.runner(feed=feed, gap_timeout_s=10)
        cycle = runner.run_once()
        self.assertTrue(cycle.held)
        self.assertEqual(self.handled(), [p1])
        self.clock.advance(9)
        self.assertEqual(runner.run_once().handled, 0)
        feed.hidden.clear()  # the late commit becomes visible
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p2, p3])
        state = self.followers.get(self.name)
        self.assertEqual((state.position, state.gaps_skipped, state.last_gap), (p3, 0, None))

    def test_a_gap_is_passed_and_recorded_once_the_timeout_passes(self):
        self.append(4)
        p1, p2, p3, p4 = self.positions()
        feed = HidingFeed(self.feed, hidden={p2, p3})
        runner = self.runner(feed=feed, gap_timeout_s=10)
        seen_at = self.clock()
        runner.run_once()
        self.clock.advance(5)
        runner.run_once()
        skipped_at = self.clock.advance(5)
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p4])
        state = self.followers.get(self.name)
        self.assertEqual(state.position, p4)
        self.assertEqual(state.gaps_skipped, 2)
        self.assertEqual(state.last_gap, Gap(first=p2, last=p3, seen_at=seen_at, skipped_at=skipped_at))

    def test_void_positions_are_not_waited_for(self):
        self.append(3)
        p1, p2, p3 = self.positions()
        feed = HidingFeed(self.feed, hidden={p2}, void={p2})
        runner = self.runner(feed=feed)
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p3])
        self.assertEqual(self.followers.get(self.name).gaps_skipped, 0)

    def test_rewind_replays(self):
        self.append(4)
        runner = self.runner()
        self.drain(runner)
        positions = self.positions()
        self.followers.rewind(self.name, positions[1], now=self.clock())
        self.drain(runner)
        self.assertEqual(self.handled(), positions + positions[2:])

    def test_a_rewind_during_a_batch_is_not_undone(self):
        self.append(8)
        positions = self.positions()
        runner = self.runner(min_batch=8, max_batch=8)
        handle = runner.follower.handler

        def rewinding(item):  # an operator rewinds to the second stream while the batch is at its fifth
            handle(item)
            if item.position == positions[4] and len(self.seen) == 5:
                self.followers.rewind(self.name, positions[1], now=self.clock())

        runner.follower = replace(runner.follower, handler=rewinding)
        runner.run_once()
        self.assertEqual(self.followers.get(self.name).position, positions[1])  # not moved past the rewind
        self.drain(runner)
        self.assertEqual(self.followers.get(self.name).position, positions[-1])
        self.assertEqual(self.handled()[-6:], positions[2:])  # everything after the rewind handed again

    def test_a_pause_during_a_batch_stops_its_checkpoint(self):
        self.append(6)
        positions = self.positions()
        runner = self.runner(min_batch=8, max_batch=8)
        handle = runner.follower.handler

        def pausing(item):
            handle(item)
            if item.position == positions[2]:
                self.followers.set_paused(self.name, True)

        runner.follower = replace(runner.follower, handler=pausing)
        runner.run_once()
        state = self.followers.get(self.name)
        self.assertEqual((state.position, state.paused), (0, True))  # the rebuild's rows may be deleted now
        self.followers.rewind(self.name, 0, now=self.clock())
        self.followers.set_paused(self.name, False)
        runner.follower = replace(runner.follower, handler=handle)
        self.drain(runner)
        self.assertEqual(self.followers.get(self.name).position, positions[-1])
        self.assertEqual(self.handled()[-6:], positions)

    def test_a_handler_slower_than_the_lease_keeps_it_and_checkpoints(self):
        # Real time: the heartbeat renews the lease while a stream takes longer than the whole lease.
        self.append(2)
        positions = self.positions()
        runners = [self.runner(owner=f"slow-{i}", lease_s=0.3, min_batch=1, max_batch=1, clock=None)
                   for i in range(2)]
        for runner in runners:
            handle = runner.follower.handler

            def slow(item, handle=handle):
                handle(item)
                threading.Event().wait(0.45)

            runner.follower = replace(runner.follower, handler=slow)
        stop = threading.Event()

        def work(runner):
            for _ in range(200):  # bounded: a livelock ends the loop and fails the assertions below
                if stop.is_set():
                    return
                cycle = runner.run_once()
                if cycle.leader and not cycle.full and not cycle.handled:
                    stop.set()
                threading.Event().wait(0.02)

        threads = [threading.Thread(target=work, args=(runner,)) for runner in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        stop.set()
        self.assertEqual(self.handled(), positions)  # each once, in order
        self.assertEqual(len({owner for owner, _ in self.seen}), 1)
        self.assertEqual(self.followers.get(self.name).position, positions[-1])
        for runner in runners:
            runner.close()
        self.assertIsNone(self.followers.get(self.name).lease_owner)

    def test_close_releases_a_lease_it_holds_whatever_it_believes(self):
        self.append(1)
        runner = self.runner()
        runner.run_once()
        runner._lease_until = None  # e.g. after a LeaseLost the heartbeat took it back
        runner.close()
        self.assertIsNone(self.followers.get(self.name).lease_owner)

    def test_a_position_that_keeps_losing_the_lease_stops_with_the_reason(self):
        self.append(2)
        p1, _ = self.positions()
        runner = self.runner(lease_s=30.0)
        handle = runner.follower.handler

        def losing(item):  # the handler outlives the lease and another instance takes it over every time
            handle(item)
            self.clock.advance(31)
            self.followers.acquire(self.name, "thief", 30, now=self.clock())

        runner.follower = replace(runner.follower, handler=losing)
        for _ in range(10):  # bounded: it used to hand the same stream forever
            cycle = runner.run_once()
            if cycle.stopped:
                break
            self.clock.advance(31)  # the thief's lease expires without it checkpointing anything
        state = self.followers.get(self.name)
        self.assertTrue(cycle.stopped)
        self.assertEqual(state.position, 0)
        self.assertEqual(state.poison.position, p1)
        self.assertIn("LeaseStalled", state.poison.error)
        self.assertLessEqual(len(self.seen), 4)

    def test_a_hung_writer_delays_but_never_loses_a_stream(self):
        self.append(2)
        held = make_stream(self.agg(), 1)
        with self.hung_writer(held):
            visible = self.positions()
            self.assertEqual(len(visible), 2)  # the held stream is not visible
            try:  # another writer of the context: stored, or refused as retryable within its bound
                self.append(1)
            except RecoverableStoreError:
                pass
        runner = self.runner()
        self.drain(runner)
        self.assertIn(held.id, [item.stream.id for item in self.feed.read(0, 100)])
        self.assertEqual(self.handled(), self.positions())
        self.assertEqual(self.followers.get(self.name).gaps_skipped, 0)

    def test_filters_pass_their_streams_and_checkpoint_every_position(self):
        self.append(2, name="order")
        self.append(2, name="cart")
        runner = self.runner(aggregates={"cart"})
        self.drain(runner)
        positions = self.positions()
        self.assertEqual(self.handled(), positions[2:])
        self.assertEqual(self.followers.get(self.name).position, positions[-1])
        other = self.runner(name=self.follower_name(), events={"something_else"})
        self.drain(other)
        self.assertEqual(self.handled(), positions[2:])
        self.assertEqual(self.followers.get(other.name).position, positions[-1])

    def test_a_poison_event_stops_the_follower_then_retry(self):
        self.append(3)
        p1, p2, p3 = self.positions()
        self.fail_at = {p2}
        runner = self.runner()
        cycle = runner.run_once()
        self.assertTrue(cycle.failed)
        state = self.followers.get(self.name)
        self.assertEqual(state.position, p1)
        self.assertEqual(state.poison.position, p2)
        # its first line says what failed, the traceback below it where (kept by every store)
        head, _, trace = state.poison.error.partition("\n\n")
        self.assertIn("cannot handle", head)
        self.assertTrue(trace.startswith("Traceback (most recent call last):"), state.poison.error)
        self.assertEqual(state.poison.stream_id, self.feed.read(p1, 1)[0].stream.id)
        self.assertTrue(runner.run_once().stopped)
        self.assertEqual(self.handled(), [p1])
        self.fail_at = set()
        self.followers.rewind(self.name, state.position, now=self.clock())  # retry
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p2, p3])

    def test_a_transient_store_error_is_retried_not_poison(self):
        self.append(2)
        p1, p2 = self.positions()
        failures = [RecoverableStoreError("the database went away")]

        def handle(item):
            if item.position == p2 and failures:
                raise failures.pop()
            self.seen.append(("?", item.position))

        runner = FollowerRunner(Follower(self.name, handle), self.feed, self.followers, owner="one", clock=self.clock,
                                min_batch=4, max_batch=4)
        with self.assertRaises(RecoverableStoreError):
            runner.run_once()
        state = self.followers.get(self.name)
        self.assertEqual((state.position, state.poison), (0, None))
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p1, p2])

    def test_a_poison_event_skipped_with_an_audit(self):
        self.append(3)
        p1, p2, p3 = self.positions()
        self.fail_at = {p2}
        runner = self.runner()
        runner.run_once()
        self.followers.skip_poison(self.name, by="ops", reason="bad data", now=self.clock())
        self.drain(runner)
        self.assertEqual(self.handled(), [p1, p3])
        self.assertEqual([(r["position"], r["by"]) for r in self.followers.skipped(self.name)], [(p2, "ops")])

    def test_a_paused_follower_waits(self):
        self.append(2)
        runner = self.runner()
        runner.run_once()
        self.append(2)
        self.followers.set_paused(self.name, True)
        self.assertTrue(runner.run_once().stopped)
        self.assertEqual(len(self.seen), 2)
        self.followers.set_paused(self.name, False)
        self.drain(runner)
        self.assertEqual(self.handled(), self.positions())

    def test_run_until_caught_up_then_releases_the_lease(self):
        self.append(5)
        runner = self.runner(min_batch=1, max_batch=2)
        runner.run(threading.Event(), until_caught_up=True)
        self.assertEqual(self.handled(), self.positions())
        self.assertIsNone(self.followers.get(self.name).lease_owner)

    def test_a_running_follower_sees_new_appends(self):
        runner = self.runner(max_wait_s=0.05)
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,))
        thread.start()
        try:
            self.append(3)
            done = threading.Event()
            for _ in range(2000):
                if len(self.seen) >= 3:
                    done.set()
                    break
                done.wait(0.01)
            self.assertTrue(done.is_set(), self.seen)
        finally:
            stop.set()
            runner.wake()
            thread.join()
        self.assertEqual(self.handled(), self.positions())
        self.assertIsNone(self.followers.get(self.name).lease_owner)


__all__ = ["FollowerRunnerContract", "FollowerStoreContract", "HidingFeed", "StreamFeedContract"]

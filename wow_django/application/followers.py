"""Followers: named, durable readers of a context's event streams (DESIGN G).

Declare one with :func:`follower`; ``manage.py wow_follow`` (or a thread of
any process, or a test's :meth:`FollowerRunner.run_once`) runs it::

    @follower("order-totals", aggregates={"order"}, events={"order_placed"})
    def order_totals(item: PositionedStream) -> None:
        ...

The handler gets the streams one at a time, in position (commit) order, at
least once: a crash between handling and the checkpoint hands the same
streams again. Filters are applied by the runner, after gap detection, so
every position counts; a stream passes the event filter when one of its
events has a listed name (the handler gets the whole stream).

:class:`FollowerRunner` runs one follower on a :class:`StreamFeed` and a
:class:`FollowerStore`:

* **lease** — an instance processes only while it holds the follower's lease
  (``WOW['FOLLOWER_LEASE_S']``), renewed once a third of it has passed; a
  lost lease makes the checkpoint write fail
  (``LeaseLost``) and the instance waits to take it again.
* **gaps** — where the feed's gaps are not final, a position missing below a
  visible one is held (nothing after it is handled) until it appears or
  ``WOW['FOLLOWER_GAP_TIMEOUT_S']`` has passed since it was first seen; then
  it is passed and recorded with the checkpoint. Positions the feed reports
  void are passed at once.
* **batches** — a read's size doubles up to ``FOLLOWER_MAX_BATCH`` while reads
  come back full, and halves toward ``FOLLOWER_MIN_BATCH`` when they do not;
  one checkpoint per batch.
* **waiting** — when live the runner waits for the feed's notifier (an append
  of this process wakes it at once) or its backoff (10 ms doubling up to
  ``FOLLOWER_MAX_WAIT_S``), whichever comes first; never a busy loop.
* **transactional** handlers (django follower store only): each batch's
  handler writes and its checkpoint commit in one
  ``transaction.atomic(using=WOW['DATABASE_ALIAS'])`` — exactly once into
  that database; each stream in a savepoint, so a failing one leaves the
  ones before it committed.
* **poison** — a handler that raises stops the follower at that stream
  (``set_poison``); the streams before it are checkpointed. A transient store
  error (``RecoverableStoreError``, a lost connection, a locked SQLite) is
  not the stream's fault: the cycle fails, nothing of the batch is
  checkpointed and it is handed again after a backoff. An operator
  retries (``rewind`` to the same position clears it) or skips it
  (``skip_poison``, audited). A paused or poisoned follower's instance keeps
  its lease and waits.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction

from wow_django.application.repository import stream_messages
from wow_django.application.snapshotting import SNAPSHOT_FOLLOWER, SnapshotWriter, runtime_repository
from wow_django.backends.django.errors import is_recoverable
from wow_django.conf import wow_settings
from wow_django.domain import registry as domain_registry
from wow_django.domain.registry import Current, EventHandler, check_name
from wow_django.exceptions import CheckpointFenced, LeaseLost, RecoverableStoreError
from wow_django.log import describe_failure, first_line
from wow_django.persistence.followers import (
    AppendNotifier,
    FollowerStore,
    Gap,
    PoisonEvent,
    PositionedStream,
    StreamFeed,
)

logger = logging.getLogger(__name__)

#: The first wait of a live follower, doubled up to ``WOW['FOLLOWER_MAX_WAIT_S']``.
MIN_WAIT_S = 0.01

#: Leases lost in a row at one position before the follower stops there (``LeaseStalled``) instead of
#: handing the same streams again and again.
STALL_LOSSES = 3


@dataclass(frozen=True)
class Follower:
    """A declared follower: its name, handler and filters."""

    name: str
    handler: Callable[[PositionedStream], object]
    aggregates: frozenset[str] | None = None
    events: frozenset[str] | None = None
    transactional: bool = False
    #: "follower" (declared with :func:`follower`), "projection" or "processor" (a domain event handler),
    #: "snapshots" (the snapshot follower, :mod:`wow_django.application.snapshotting`).
    kind: str = "follower"
    #: Called after the handler took a batch's streams, before each checkpoint (a handler that gathers
    #: its writes per batch writes them there); an error of it fails the cycle like a transient one.
    flush: Callable[[], object] | None = None
    #: After a batch that handled streams, wait this long before reading on (unless hurried): a follower
    #: that gathers its writes per batch (``flush``) then writes once for more streams.
    linger_s: float = 0.0

    def matches(self, item: PositionedStream) -> bool:
        """Whether the handler takes ``item`` (its aggregate type and one of its events' names pass the filters)."""
        stream = item.stream
        if self.aggregates is not None and stream.aggregate_id.aggregate_name not in self.aggregates:
            return False
        return self.events is None or any(event.name in self.events for event in stream.body)


class FollowerRegistry:
    """The followers declared with :func:`follower`, by name. Thread-safe; one current per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followers: dict[str, Follower] = {}

    def copy(self) -> FollowerRegistry:
        other = FollowerRegistry()
        with self._lock:
            other._followers = dict(self._followers)
        return other

    def add(self, declared: Follower) -> None:
        with self._lock:
            previous = self._followers.get(declared.name)
            if previous is not None and previous.handler is not declared.handler:
                raise ImproperlyConfigured(f"two followers are named {declared.name!r}")
            self._followers[declared.name] = declared

    def get(self, name: str) -> Follower | None:
        with self._lock:
            return self._followers.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._followers)


_current: Current[FollowerRegistry] = Current(FollowerRegistry())


def followers() -> FollowerRegistry:
    """The current follower registry."""
    return _current.get()


def use_followers(registry: FollowerRegistry):
    """Make ``registry`` the current one inside a ``with`` block."""
    return _current.use(registry)


def _names(values: Iterable[str] | None, what: str) -> frozenset[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise TypeError(f"{what} must be a collection of names, not the string {values!r}")
    names = frozenset(values)
    if not names or not all(isinstance(v, str) and v for v in names):
        raise ValueError(f"{what} must hold at least one non-empty name")
    return names


def follower(name: str, *, aggregates: Iterable[str] | None = None, events: Iterable[str] | None = None,
             transactional: bool = False):
    """Declare ``fn(item: PositionedStream)`` as follower ``name`` (see the module docstring)."""
    check_name(name, "follower name")
    declared_aggregates = _names(aggregates, "aggregates")
    declared_events = _names(events, "events")

    def register(fn):
        followers().add(Follower(name, fn, declared_aggregates, declared_events, bool(transactional)))
        return fn

    return register


@functools.lru_cache(maxsize=4096)
def handler_follower(handler: EventHandler) -> Follower:
    """The follower that runs a projection or event processor: each matching event of a stream, in order."""

    def handle(item: PositionedStream) -> None:
        for message in stream_messages(item.stream):
            if handler.matches(message):
                handler.fn(message)

    handle.__qualname__ = handle.__name__ = getattr(handler.fn, "__name__", "handler")
    return Follower(handler.name, handle, frozenset({handler.aggregate_name}), handler.event_names,
                    kind=handler.kind)


def declared_followers() -> dict[str, Follower]:
    """Every follower of this process by name: the projections and event processors of the current
    domain registry, then the followers declared with :func:`follower`."""
    found: dict[str, Follower] = {}
    for handler in domain_registry.current().handlers():
        found[handler.name] = handler_follower(handler)
    snapshots = snapshot_follower()
    if snapshots is not None:
        found[SNAPSHOT_FOLLOWER] = snapshots
    registry = followers()
    for name in registry.names():
        declared = registry.get(name)
        if declared is None:
            continue
        if name in found:
            raise ImproperlyConfigured(f"follower {name!r} is declared with @follower and names a "
                                       f"{found[name].kind} too: rename one")
        found[name] = declared
    return found


_snapshot_followers: dict[tuple, Follower] = {}
_snapshot_followers_lock = threading.Lock()


def snapshot_follower() -> Follower | None:
    """The snapshot follower of the current settings (the same object while they stand), or None when
    ``SNAPSHOT_MODE`` is not ``"follower"`` or the strategy is ``"none"`` (see
    :mod:`wow_django.application.snapshotting`)."""
    mode, strategy = wow_settings.SNAPSHOT_MODE, wow_settings.SNAPSHOT_STRATEGY
    if mode != "follower" or strategy == "none":
        return None
    key = (strategy, wow_settings.SNAPSHOT_VERSION_OFFSET, wow_settings.SNAPSHOT_TIME_OFFSET_S,
           wow_settings.SNAPSHOT_FOLLOWER_LINGER_S)
    with _snapshot_followers_lock:
        declared = _snapshot_followers.get(key)
        if declared is None:
            writer = SnapshotWriter(runtime_repository, strategy=strategy, version_offset=key[1],
                                    time_offset_s=key[2], aggregate_type=domain_registry.aggregate_type,
                                    transient=transient)
            declared = _snapshot_followers[key] = Follower(SNAPSHOT_FOLLOWER, writer, kind="snapshots",
                                                           flush=writer.flush,
                                                           linger_s=wow_settings.SNAPSHOT_FOLLOWER_LINGER_S)
        return declared


def projection_followers(aggregate_name: str, event_names: Iterable[str]) -> list[str]:
    """The names of the projection followers that take a stream of ``aggregate_name`` holding ``event_names``
    (what ``PROJECTED`` waits for)."""
    names = set(event_names)
    return [handler.name for handler in domain_registry.current().handlers()
            if handler.kind == "projection" and handler.aggregate_name == aggregate_name
            and (handler.event_names is None or handler.event_names & names)]


#: The followers each handler wait stage waits for, by their ``kind``: ``PROJECTED`` the aggregate's
#: projections, ``EVENT_HANDLED`` its event processors, ``SAGA_HANDLED`` the followers declared with
#: :func:`follower` that take its streams (the process managers that react to events by sending commands:
#: what Wow calls a saga).
STAGE_KINDS = {"PROJECTED": "projection", "EVENT_HANDLED": "processor", "SAGA_HANDLED": "follower"}


def stage_followers(stage: str, aggregate_name: str, event_names: Iterable[str] | None = None, *,
                    processor: str = "", function: str = "") -> list[str]:
    """The names of the followers the handler wait stage ``stage`` waits for on a stream of ``aggregate_name``
    holding ``event_names`` (None: whatever events, i.e. every follower that could take one), narrowed to the
    follower named ``processor`` and to those whose function is named ``function`` when given (Wow's
    ``Command-Wait-Processor`` and ``Command-Wait-Function``)."""
    names = None if event_names is None else set(event_names)
    return [name for name, fn_name, events in stage_candidates(stage, aggregate_name)
            if (names is None or events is None or events & names)
            and (not processor or processor == name) and (not function or function == fn_name)]


def stage_candidates(stage: str, aggregate_name: str) -> list[tuple[str, str, frozenset[str] | None]]:
    """(follower name, its function's name, the events it takes or None for all) of every follower of
    ``aggregate_name`` the handler wait stage ``stage`` can wait for."""
    kind = STAGE_KINDS[stage]
    found: list[tuple[str, str, frozenset[str] | None]] = []
    if kind == "follower":
        registry = followers()
        for name in registry.names():
            declared = registry.get(name)
            if declared is None or declared.kind != "follower":
                continue
            if declared.aggregates is None or aggregate_name in declared.aggregates:
                found.append((name, getattr(declared.handler, "__name__", ""), declared.events))
    else:
        for handler in domain_registry.current().handlers():
            if handler.kind == kind and handler.aggregate_name == aggregate_name:
                found.append((handler.name, getattr(handler.fn, "__name__", ""), handler.event_names))
    return found


#: Notified whenever a runner of this process moved a checkpoint: ``PROJECTED`` waiters re-check at once.
progress = AppendNotifier()


@dataclass(frozen=True)
class Cycle:
    """What one :meth:`FollowerRunner.run_once` did."""

    leader: bool = False  # the runner held the lease
    stopped: bool = False  # paused or stopped on a poison event
    read: int = 0  # streams read
    full: bool = False  # the read came back full: more are waiting
    handled: int = 0  # streams handed to the handler
    position: int = 0  # the checkpoint afterwards
    held: bool = False  # waiting for a gap below a visible stream
    failed: bool = False  # the handler raised (the follower is stopped on it)


def default_owner() -> str:
    """An instance id: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def inline_owner() -> str:
    """The instance id of the followers this process runs inline (:class:`InlineFollowers`): host and process."""
    return f"{socket.gethostname()}:{os.getpid()}:inline"


class FollowerRunner:
    """Runs one follower on ``feed`` and ``store`` (see the module docstring); settings give the defaults."""

    def __init__(self, declared: Follower, feed: StreamFeed, store: FollowerStore, *, owner: str | None = None,
                 clock: Callable[[], datetime] | None = None, gap_timeout_s: float | None = None,
                 lease_s: float | None = None, min_batch: int | None = None, max_batch: int | None = None,
                 max_wait_s: float | None = None):
        self.follower = declared
        self.feed = feed
        self.store = store
        self.owner = owner or default_owner()
        self.clock = clock or (lambda: datetime.now(UTC))
        self.gap_timeout_s = wow_settings.FOLLOWER_GAP_TIMEOUT_S if gap_timeout_s is None else gap_timeout_s
        self.lease_s = wow_settings.FOLLOWER_LEASE_S if lease_s is None else lease_s
        self.min_batch = wow_settings.FOLLOWER_MIN_BATCH if min_batch is None else min_batch
        self.max_batch = wow_settings.FOLLOWER_MAX_BATCH if max_batch is None else max_batch
        self.max_wait_s = wow_settings.FOLLOWER_MAX_WAIT_S if max_wait_s is None else max_wait_s
        if not 1 <= self.min_batch <= self.max_batch:
            raise ImproperlyConfigured(f"follower batches need 1 ≤ min ({self.min_batch}) ≤ max ({self.max_batch})")
        if declared.transactional and store.database_alias is None:
            raise ImproperlyConfigured(
                f"follower {declared.name!r} is transactional, which needs its checkpoint in the handler's "
                "database: use the django follower store (WOW['STORAGE'] = 'django')")
        self.batch = self.min_batch
        self._lease_until: datetime | None = None
        self._seen: dict[int, datetime] = {}  # missing position → when first seen missing
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._finishing = False
        self._generation: int | None = None  # of the state the current batch was read from
        self._fenced = threading.Event()  # the heartbeat saw a rewind or pause: end the batch
        self._batch_started = self.clock()
        self._losses: tuple[int, int | None, PositionedStream | None] = (0, None, None)
        self._interrupted = False

    @property
    def name(self) -> str:
        return self.follower.name

    # --- one cycle ---------------------------------------------------------------------------------

    def _lease(self, now: datetime) -> bool:
        """Whether this instance holds the lease: renewed once a third of it has passed."""
        renew_at = None if self._lease_until is None else self._lease_until - timedelta(seconds=self.lease_s * 2 / 3)
        if renew_at is not None and now < renew_at:
            return True
        if self.store.acquire(self.name, self.owner, self.lease_s, now=now):
            self._lease_until = now + timedelta(seconds=self.lease_s)
            return True
        self._lease_until = None
        return False

    def _passable(self, after: int, streams: list[PositionedStream], now: datetime
                  ) -> tuple[list[PositionedStream], list[Gap], bool]:
        """The streams that may be handled now, the gaps passed below them, and whether a gap holds the rest."""
        if self.feed.gaps_are_final:
            return streams, [], False
        passable: list[PositionedStream] = []
        gaps: list[Gap] = []
        expected = after + 1
        for item in streams:
            if item.position > expected:
                void = set(self.feed.void_positions(expected - 1, item.position - 1))
                missing = [p for p in range(expected, item.position) if p not in void]
                if missing:
                    seen = [self._seen.setdefault(p, now) for p in missing]
                    if any(now - at < timedelta(seconds=self.gap_timeout_s) for at in seen):
                        return passable, gaps, True
                    gaps.extend(_ranges(missing, dict(zip(missing, seen, strict=True)), now))
            passable.append(item)
            expected = item.position + 1
        return passable, gaps, False

    def run_once(self) -> Cycle:
        """Hold the lease, read one batch, hand it to the handler and checkpoint it; what happened.

        A ``LeaseLost`` on the checkpoint is a cycle without the lease; a
        ``CheckpointFenced`` one (an operator rewound, paused or skipped
        meanwhile) a cycle that changed nothing; an exception of
        :meth:`checkpoint` propagates (the batch will be handed again).
        """
        now = self.clock()
        if not self._lease(now):
            return Cycle()
        state = self.store.get(self.name)
        if state is None:  # deleted under us: take it again next cycle
            self._lease_until = None
            return Cycle()
        if state.poison is None and self._stalled(state):
            return Cycle(leader=True, stopped=True, position=state.position)
        if state.paused or state.poison is not None:
            return Cycle(leader=True, stopped=True, position=state.position)
        self._generation = state.generation
        if not self._interrupted:
            self._fenced.clear()
        batch = self.batch
        streams = self.feed.read(state.position, batch)
        full = len(streams) == batch
        self.batch = min(batch * 2, self.max_batch) if full else max(self.min_batch, batch // 2)
        passable, gaps, held = self._passable(state.position, streams, now)
        if not passable:
            return Cycle(leader=True, read=len(streams), full=full, position=state.position, held=held)
        _check_connections()
        self._batch_started = self.clock()
        try:
            with _Heartbeat(self):
                if self.follower.transactional:
                    with transaction.atomic(using=self.store.database_alias):
                        handled, failure, upto = self._handle(passable, gaps, savepoints=True)
                        self._renew()
                        self.checkpoint(upto, tuple(g for g in gaps if g.last < upto))
                else:
                    handled, failure, upto = self._handle(passable, gaps, savepoints=False)
                    self._renew()
                    self.checkpoint(upto, tuple(g for g in gaps if g.last < upto))
            if failure is not None:
                item, exc = failure
                agg = item.stream.aggregate_id
                error = describe_failure(exc)
                logger.error("follower %r stopped on position %s (%s/%s): %s", self.name, item.position,
                             agg.aggregate_name, agg.id, first_line(error), exc_info=exc)
                self.store.set_poison(self.name, self.owner, PoisonEvent(
                    position=item.position, stream_id=item.stream.id, aggregate=f"{agg.aggregate_name}/{agg.id}",
                    error=error, at=self.clock()), now=self.clock(), generation=self._generation)
            progress.notify()
        except CheckpointFenced as exc:
            logger.warning("%s", exc)
            self._seen.clear()
            return Cycle(leader=True, read=len(streams), full=True, position=state.position)  # read on at once
        except LeaseLost as exc:
            logger.warning("%s", exc)
            self._lease_until = None
            self._lost(state.position, passable[0])
            return Cycle(read=len(streams), full=full)
        self._losses = (0, None, None)
        for position in [p for p in self._seen if p <= upto]:
            del self._seen[position]
        if len(passable) > 1 and (self.clock() - self._batch_started).total_seconds() >= self.lease_s / 2:
            self.batch = 1  # a slow batch: hand the next streams one at a time (each checkpointed)
        return Cycle(leader=True, read=len(streams), full=(full or upto < passable[-1].position) and failure is None,
                     handled=handled, position=upto, held=held, failed=failure is not None)

    def _renew(self) -> None:
        """Renew the lease now (the heartbeat, and right before a checkpoint); a lost one shows at the write."""
        now = self.clock()
        if self.store.acquire(self.name, self.owner, self.lease_s, now=now):
            self._lease_until = now + timedelta(seconds=self.lease_s)

    def _lost(self, position: int, item: PositionedStream) -> None:
        """Count the leases lost in a row at ``position`` (see :meth:`_stalled`)."""
        count, at, _ = self._losses
        self._losses = (count + 1 if at == position else 1, position, item)

    def _stalled(self, state) -> bool:
        """After :data:`STALL_LOSSES` leases lost in a row at the same position, stop there as on a poison
        event (status and console show why) instead of handing the same streams again and again."""
        count, at, item = self._losses
        if count < STALL_LOSSES or at != state.position or item is None:
            return False
        agg = item.stream.aggregate_id
        error = (f"LeaseStalled: the lease was lost {count} times in a row while handling the batch from "
                 f"position {item.position}: the handler outlives FOLLOWER_LEASE_S ({self.lease_s}s) although the "
                 "heartbeat renews it (a blocked process, an overloaded database?); retry once fixed")
        logger.error("follower %r: %s", self.name, error)
        try:
            self.store.set_poison(self.name, self.owner, PoisonEvent(
                position=item.position, stream_id=item.stream.id, aggregate=f"{agg.aggregate_name}/{agg.id}",
                error=error, at=self.clock()), now=self.clock(), generation=state.generation)
        except (LeaseLost, CheckpointFenced):
            return False
        self._losses = (0, None, None)
        return True

    def _handle(self, items: list[PositionedStream], gaps: list[Gap] | tuple[Gap, ...] = (), *, savepoints: bool):
        """Hand ``items`` to the handler; (how many were handled, (item, error) of a failure, checkpoint).

        Once the batch has run for half the lease it is checkpointed stream by stream (a transactional
        one, whose checkpoint commits with the handler's writes, ends there instead); an operator's
        rewind or pause seen by the heartbeat ends it at once.
        """
        handled = 0
        upto = items[0].position - 1
        for item in items:
            if self._fenced.is_set():
                return handled, None, upto  # its checkpoint will be refused: hand nothing more
            # A long batch renews the lease as it goes (it would expire under a slow handler, and the batch,
            # never checkpointed, would be handed again and again); lost: stop, the checkpoint refuses.
            if not self._lease(self.clock()):
                return handled, None, upto
            if upto >= items[0].position and self._slow():
                if savepoints:
                    return handled, None, upto
                self.checkpoint(upto, tuple(g for g in gaps if g.last < upto))
            upto = item.position
            if not self.follower.matches(item):
                continue
            try:
                if savepoints:
                    with transaction.atomic(using=self.store.database_alias):
                        self.follower.handler(item)
                else:
                    self.follower.handler(item)
            except Exception as exc:
                if transient(exc):
                    raise  # not the stream's fault: the cycle fails and the batch is handed again
                return handled, (item, exc), item.position - 1
            handled += 1
        return handled, None, items[-1].position

    def _slow(self) -> bool:
        """Whether the current batch has run for half the lease."""
        return (self.clock() - self._batch_started).total_seconds() >= self.lease_s / 2

    def checkpoint(self, position: int, gaps: tuple[Gap, ...]) -> None:
        """Record that everything up to ``position`` is handled (a test overrides it to simulate a crash);
        fenced with the generation the batch was read in. The follower's ``flush`` runs first."""
        if self.follower.flush is not None:
            self.follower.flush()
        self.store.advance(self.name, self.owner, position, now=self.clock(), gaps=gaps, generation=self._generation)

    # --- running ---------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Run on until caught up (as ``until_caught_up``), then return: a process leaving hands over a
        follower with nothing of its own appends left behind."""
        self._finishing = True
        self.wake()

    def interrupt(self) -> None:
        """End the current batch after the stream being handled (its handled streams are checkpointed):
        a process leaving on SIGTERM gives its lease up within one stream, not one batch."""
        self._interrupted = True
        self._fenced.set()
        self.wake()

    def hurry(self) -> None:
        """End the current (or next) linger at once: someone waits for this follower to pass a stream."""
        self._hurry.set()

    def wake(self) -> None:
        """Cut the current wait (or linger) short (a stop request, a test)."""
        self._wake.set()
        self._hurry.set()
        if self.feed.notifier is not None:
            self.feed.notifier.notify()

    def _wait(self, seen: int | None, timeout: float) -> bool:
        notifier = self.feed.notifier
        if notifier is not None and seen is not None:
            woken = notifier.wait(seen, timeout)
        else:
            woken = self._wake.wait(timeout)
        self._wake.clear()
        return woken

    def run(self, stop: threading.Event, until_caught_up: bool = False) -> Cycle:
        """Run cycles until ``stop`` is set (or, with ``until_caught_up``, until a read finds nothing more, or
        the follower is stopped on a poison event or paused); then release the lease. The last cycle.

        Around each cycle a database connection that broke or outlived ``CONN_MAX_AGE`` is closed (as
        Django does around a request); run in a thread other than the main one, the thread's
        connections are closed when it returns.
        """
        wait = MIN_WAIT_S
        cycle = Cycle()
        try:
            self.feed.start_watching()
            while not stop.is_set():
                notifier = self.feed.notifier
                seen = notifier.count if notifier is not None else None
                _release_connections()
                try:
                    cycle = self.run_once()
                except Exception:
                    logger.exception("follower %r: a cycle failed; retrying after %.2fs", self.name, wait)
                    cycle = Cycle()
                    if self._finishing:
                        break
                else:
                    if self._finishing and not cycle.leader:
                        break  # another instance holds the lease: nothing of ours to finish
                    if cycle.leader and cycle.full and not cycle.held:
                        wait = MIN_WAIT_S
                        continue  # behind: read on at once
                    if (until_caught_up or self._finishing) and cycle.leader and (
                            cycle.stopped or cycle.failed or not cycle.held):
                        break
                    if cycle.handled:
                        wait = MIN_WAIT_S
                if stop.is_set():
                    break
                if cycle.handled and self.follower.linger_s and not self._finishing:
                    # Let more streams arrive before the next batch (its writes are gathered per batch),
                    # unless someone waits for this follower (hurry).
                    self._hurry.wait(self.follower.linger_s)
                    self._hurry.clear()
                if self._wait(seen, wait):
                    wait = MIN_WAIT_S
                else:
                    wait = min(wait * 2, self.max_wait_s)
        finally:
            self.close()
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()
        return cycle

    def close(self) -> None:
        """Give the lease up if this instance holds it, whatever it believes (another instance may take
        over at once)."""
        self._lease_until = None
        try:
            self.store.release(self.name, self.owner)
        except Exception:  # leaving anyway: the lease will expire
            logger.exception("follower %r: releasing the lease failed", self.name)


class _Heartbeat:
    """Renews a runner's lease every third of it while a batch is handled (a handler slower than the lease
    keeps it), and ends the batch early when an operator rewound or paused the follower meanwhile."""

    def __init__(self, runner: FollowerRunner):
        self.runner = runner
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Heartbeat:
        self._thread = threading.Thread(target=self._beat, name=f"wow-heartbeat-{self.runner.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)  # a beat stuck on the database ends by itself; it changes only the lease

    def _beat(self) -> None:
        runner = self.runner
        try:
            while not self._stop.wait(runner.lease_s / 3):
                try:
                    runner._renew()
                    state = runner.store.get(runner.name)
                    if state is None or state.paused or state.generation != runner._generation:
                        runner._fenced.set()
                except Exception:  # the checkpoint's own renewal and lease check decide
                    logger.warning("follower %r: renewing the lease failed", runner.name, exc_info=True)
        finally:
            connections.close_all()


def _release_connections() -> None:
    """Between cycles: close a connection that broke, or that outlived a positive ``CONN_MAX_AGE``.

    Unlike a request, a follower keeps its connections between cycles when ``CONN_MAX_AGE`` is 0 (Django's
    default): closing them would reconnect at every poll of a live follower (a round trip to a new
    backend each time); :func:`_check_connections` makes sure they still work before a batch is handed.
    """
    try:
        for connection in connections.all(initialized_only=True):
            if connection.in_atomic_block or connection.connection is None:
                continue
            if (connection.settings_dict.get("CONN_MAX_AGE") == 0 and not connection.errors_occurred
                    and connection.get_autocommit() == connection.settings_dict["AUTOCOMMIT"]):
                continue
            connection.close_if_unusable_or_obsolete()
    except Exception:  # closing a broken connection may fail too; the next use reconnects
        logger.debug("releasing a follower's database connections failed", exc_info=True)


def _check_connections() -> None:
    """Before a batch: a kept connection the server dropped meanwhile (a restart, a failover, an idle
    timeout) is closed, so the handler's first query connects again instead of failing."""
    try:
        for connection in connections.all(initialized_only=True):
            if connection.in_atomic_block or connection.connection is None:
                continue
            if not connection.is_usable():
                connection.close()
    except Exception:
        logger.debug("checking a follower's database connections failed", exc_info=True)


class FollowerThreads:
    """The followers of this process as its threads (``WOW['FOLLOWERS_RUN'] == "threads"``).

    The runtime owns one; :meth:`ensure` (called by the gateway before each
    command) starts a thread for each declared follower not yet running here,
    and stops the runners of followers no longer declared (a test's own
    registry). Every process that handles commands runs them, and the leases
    pick one instance per follower across the processes; the others wait. So
    the threads are cheap where they do not hold the lease: a lease attempt
    every ``FOLLOWER_MAX_WAIT_S``. Started on the first command, never at
    import: a thread started before a fork (gunicorn ``--preload``, Celery's
    prefork pool) would not exist in the children.
    """

    def __init__(self, feed: Callable[[], StreamFeed], store: Callable[[], FollowerStore]):
        self._feed = feed
        self._store = store
        self._lock = threading.Lock()
        self._running: dict[str, tuple[Follower, FollowerRunner, threading.Event, threading.Thread]] = {}
        self._closed = False

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def hurry(self, name: str) -> None:
        """Hurry this process's runner of follower ``name`` (see :meth:`FollowerRunner.hurry`), if it runs one."""
        with self._lock:
            running = self._running.get(name)
        if running is not None:
            running[1].hurry()

    def ensure(self) -> None:
        """Run every declared follower here (and only those)."""
        declared = declared_followers()
        with self._lock:
            if self._closed or all(self._running.get(name, (None,))[0] is f for name, f in declared.items()) \
                    and len(declared) == len(self._running):
                return
            stale = [name for name, (f, *_rest) in self._running.items() if declared.get(name) is not f]
            stopping = [self._running.pop(name) for name in stale]
            for name, declared_follower in declared.items():
                if name in self._running:
                    continue
                runner = FollowerRunner(declared_follower, self._feed(), self._store())
                stop = threading.Event()
                thread = threading.Thread(target=runner.run, args=(stop,), name=f"wow-follower-{name}", daemon=True)
                self._running[name] = (declared_follower, runner, stop, thread)
                thread.start()
        _stop_all(stopping, timeout=5.0)

    def close(self, timeout: float = 5.0) -> None:
        """Stop every runner, after up to ``timeout`` s of catching up: a leader hands over nothing of what
        this process appended (a script that sends a command and exits still has it projected), then
        each gives its lease up. A runner not done by then finishes its batch and stops."""
        with self._lock:
            self._closed = True
            stopping, self._running = list(self._running.values()), {}
        deadline = time.monotonic() + timeout
        for _follower, runner, _stop, _thread in stopping:
            runner.finish()
        for _follower, _runner, _stop, thread in stopping:
            thread.join(max(0.0, deadline - time.monotonic()))
        _stop_all(stopping, timeout)


def _stop_all(running, timeout: float) -> None:
    for _follower, runner, stop, _thread in running:
        stop.set()
        runner.wake()
    deadline = time.monotonic() + timeout
    for _follower, runner, _stop, thread in running:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("follower %r did not stop within %.1fs (its handler is still running)", runner.name, timeout)


class InlineFollowers:
    """The followers of this process run in the calling thread, on demand (the runtime's inline mode).

    :meth:`run` hands each declared follower what it has not seen yet, in the calling thread, until
    none has anything left; the runtime calls it after each command the gateway appends (and
    :func:`~wow_django.application.following.wait_caught_up` before it waits). Inside a Django
    ``TestCase`` every write of a projection, processor or checkpoint then goes through the test's
    own connection, in its transaction, and is rolled back with it; a follower thread would write
    through a connection of its own, outside that transaction. Used by the test isolation of
    :mod:`wow_django.testing`, not in production.

    A handler that sends a command runs the followers again from inside (the others: a follower
    busy in this thread is skipped, and the outer pass hands it the new streams afterwards). One
    thread runs followers at a time. Every inline runner of the process is one lease owner
    (:func:`inline_owner`): a lease an earlier runtime took — in a ``TestCase``'s ``setUpTestData``,
    whose transaction keeps it while that runtime's release is rolled back with a test — is renewed,
    not waited for.
    """

    def __init__(self, feed: Callable[[], StreamFeed], store: Callable[[], FollowerStore]):
        self._feed = feed
        self._store = store
        self._owner = inline_owner()
        self._runners: dict[str, FollowerRunner] = {}
        self._lock = threading.RLock()
        self._local = threading.local()

    def run(self, names: Iterable[str] | None = None) -> None:
        """Run the named followers (default: every declared one) until none has a stream left to handle."""
        wanted = None if names is None else set(names)
        busy: set[str] = self._local.__dict__.setdefault("busy", set())
        with self._lock:
            while True:
                handled = False
                for name, declared in declared_followers().items():
                    if (wanted is not None and name not in wanted) or name in busy:
                        continue
                    busy.add(name)
                    try:
                        handled |= self._catch_up(self._runner(declared))
                    finally:
                        busy.discard(name)
                if not handled:  # a pass that handled nothing appended nothing new
                    return

    def _runner(self, declared: Follower) -> FollowerRunner:
        runner = self._runners.get(declared.name)
        if runner is None or runner.follower is not declared:  # new, or redeclared (a test's registry)
            if runner is not None:
                runner.close()
            runner = self._runners[declared.name] = FollowerRunner(declared, self._feed(), self._store(),
                                                                   owner=self._owner)
        return runner

    @staticmethod
    def _catch_up(runner: FollowerRunner) -> bool:
        handled = False
        while True:
            try:
                cycle = runner.run_once()
            except Exception:  # as a follower thread would: logged, handed again next time
                logger.exception("follower %r: an inline cycle failed", runner.name)
                return handled
            handled |= cycle.handled > 0
            if not (cycle.leader and cycle.full and not cycle.held and not cycle.failed):
                return handled

    def close(self) -> None:
        """Give every lease up."""
        with self._lock:
            runners, self._runners = list(self._runners.values()), {}
        for runner in runners:
            runner.close()


@dataclass(frozen=True)
class Progress:
    """What :meth:`ProjectionWaiter.wait` found: ``done`` when every projection passed (or stopped)."""

    done: bool
    errors: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    #: The store's last error when the checkpoints could not be read (the wait went on until its timeout).
    unread: str = ""


class ProjectionWaiter:
    """``PROJECTED``: wait until the projection followers of a stream's aggregate have passed its position.

    Works whichever process runs them: the followers' checkpoints are read
    from the follower store, re-read at once when a runner of this process
    moves one (:data:`progress`), else after a short backoff (2 ms doubling
    to 50 ms). A projection stopped on a poison event at or before the
    position is reported as an error instead of being waited for. A store
    error while reading them is read again until the timeout, then reported
    in :attr:`Progress.unread`: the command's events are stored, so its
    caller gets the stage they reached, not the store's error.
    """

    def __init__(self, feed: Callable[[], StreamFeed], store: Callable[[], FollowerStore]):
        self._feed = feed
        self._store = store

    def wait(self, stream, timeout: float, *, names: list[str] | None = None) -> Progress:
        """Wait until the followers ``names`` (default: the stream's projection followers) have passed it."""
        what = "projection" if names is None else "follower"
        if names is None:
            names = projection_followers(stream.aggregate_name, [event.name for event in stream.body])
        if not names:
            return Progress(True)
        deadline = time.monotonic() + timeout
        agg = stream.aggregate_id
        position = None
        backoff = 0.002
        pending: list[str] = list(names)
        unread = ""
        while True:
            seen = progress.count
            try:
                if position is None:
                    position = self._feed().position_of(agg.aggregate_name, agg.id, stream.version)
                if position is not None:
                    errors, pending = self._passed(names, position, what)
                    if not pending:
                        return Progress(True, tuple(errors))
                unread = ""
            except RecoverableStoreError as exc:
                unread = str(exc)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Progress(False, (), tuple(pending), unread)
            progress.wait(seen, min(remaining, backoff))
            backoff = min(backoff * 2, 0.05)

    def _passed(self, names: list[str], position: int, what: str = "projection") -> tuple[list[str], list[str]]:
        """(the errors of projections stopped at or before ``position``, the names still short of it)."""
        errors: list[str] = []
        pending: list[str] = []
        for name in names:
            state = self._store().get(name)
            if state is not None and state.position >= position:
                continue
            if state is not None and state.poison is not None and state.poison.position <= position:
                errors.append(f"{what} {name!r} is stopped on position {state.poison.position} "
                              f"({state.poison.aggregate}): {first_line(state.poison.error)}")
                continue
            pending.append(name)
        return errors, pending


class InlineProjectionWaiter(ProjectionWaiter):
    """``PROJECTED`` in inline mode: the followers ran in this thread right after the append, so what the
    checkpoints say is the answer; it never waits (a projection that cannot move from inside this
    thread would otherwise hold the command for the whole timeout)."""

    def wait(self, stream, timeout: float, *, names: list[str] | None = None) -> Progress:
        return super().wait(stream, 0.0, names=names)


def transient(exc: BaseException) -> bool:
    """Whether a handler's error is a store's transient failure (retried) rather than the stream's (poison)."""
    return isinstance(exc, RecoverableStoreError) or (isinstance(exc, DatabaseError) and is_recoverable(exc))


def _ranges(missing: list[int], seen: dict[int, datetime], now: datetime) -> list[Gap]:
    """``missing`` (ascending) as contiguous :class:`Gap` ranges."""
    gaps: list[Gap] = []
    start = prev = missing[0]
    for position in [*missing[1:], None]:
        if position is not None and position == prev + 1:
            prev = position
            continue
        gaps.append(Gap(first=start, last=prev, seen_at=min(seen[p] for p in range(start, prev + 1)), skipped_at=now))
        if position is not None:
            start = prev = position
    return gaps


__all__ = ["Cycle", "Follower", "FollowerRegistry", "FollowerRunner", "FollowerThreads", "InlineFollowers",
           "InlineProjectionWaiter", "ProjectionWaiter",
           "Progress", "declared_followers", "follower", "followers", "handler_follower", "projection_followers",
           "snapshot_follower",
           "use_followers"]

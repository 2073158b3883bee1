"""The runtime: the one object that owns this process's stores, gateway and bus.

::

    from wow_django.application import get_runtime

    runtime = get_runtime()
    runtime.gateway.send(PlaceOrder(...))
    runtime.event_store.load(AggregateId("order", "o-1"))
    runtime.bus.send("order.purchased", {...})

It is built lazily from the ``WOW`` settings, each part on first use (nothing
talks to a server before that), and it is the only holder of process state:

* **settings change** (``override_settings(WOW=...)``): the runtime is closed
  (batchers flushed, dispatch lanes and broker pools closed) and the next
  :func:`get_runtime` builds a new one;
* **fork** (Celery prefork, gunicorn): the child drops the parent's runtime
  without closing it (its threads and server clients belong to the parent),
  forgets the parent's MongoDB server clients and the Django database
  connections the forking thread had open (unclosed: their sessions are the
  parent's, see ``backends.django.connection.after_fork``); the child builds its own
  runtime on first use. Parts taken from a runtime (``get_runtime().gateway``)
  must not be kept across a fork: ask :func:`get_runtime` in the child. (The
  id generator reseeds itself after a fork: it is pure Python and may be used
  without a runtime.)
* **exit**: when the interpreter exits (a gunicorn worker recycled after
  ``--max-requests`` or stopped, a management command ending), the runtime is
  closed, so what the dispatch lanes still hold (event processors,
  projections, snapshot requests of commands already answered) runs first:
  the lanes are daemon threads that would otherwise die with the process. A
  Celery pool process leaves with ``os._exit``: :mod:`wow_django.tasks` closes
  the runtime on ``worker_process_shutdown`` instead.
* :func:`close_runtime` closes it explicitly (tests, shutdown).
* **inline mode** (:func:`inline_background`; the test isolation of
  :mod:`wow_django.testing` turns it on for a test that runs inside a
  transaction): the runtimes built meanwhile do their background work in the
  thread that causes it — the snapshot step before ``send`` returns, this
  process's followers (projections, event processors) right after each
  append, appends unbatched — so that everything they write goes through that
  thread's database connection, inside its transaction. Threads write through
  connections of their own, outside it.

Which backend serves which contract comes from ``WOW['STORAGE']`` and the
per-purpose overrides; each backend is a class in ``wow_django.backends``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.core.signals import setting_changed

from wow_django.application import snapshotting
from wow_django.application.followers import (
    FollowerThreads,
    InlineFollowers,
    InlineProjectionWaiter,
    ProjectionWaiter,
)
from wow_django.application.gateway import CommandGateway
from wow_django.application.ports import TaskQueue
from wow_django.application.projections import InlineDispatcher
from wow_django.application.repository import AggregateRepository
from wow_django.backends.django import DjangoBackend
from wow_django.backends.django.connection import after_fork as django_connections_after_fork
from wow_django.backends.memory import MemoryBackend
from wow_django.backends.mongo import MongoBackend
from wow_django.backends.mongo.client import connections
from wow_django.bus import provider as bus_provider
from wow_django.bus.service import EventBus
from wow_django.bus.transport import BusTransport
from wow_django.conf import wow_settings
from wow_django.persistence.backend import Backend
from wow_django.persistence.batching import BatchingEventStore
from wow_django.persistence.bus import BusStore
from wow_django.persistence.contracts import EventStore, PrepareKey, SnapshotStore
from wow_django.persistence.followers import FollowerStore, StreamFeed
from wow_django.persistence.query import QueryService

#: Backend class per ``WOW['STORAGE']`` value.
BACKENDS: dict[str, type[Backend]] = {"in_memory": MemoryBackend, "mongo": MongoBackend, "django": DjangoBackend}


class Runtime:
    """Stores, gateway, bus and task queue built from the current ``WOW`` settings, each once."""

    #: The snapshot follower's repository over these stores, set on first use (:func:`_snapshot_repository`).
    _snapshot_repository: AggregateRepository

    def __init__(self, *, inline: bool | None = None) -> None:
        self._parts: dict[object, Any] = {}
        self._building: dict[object, threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two dicts only; never held while building
        self._closed = False
        #: Background work in the calling thread (see :func:`inline_background`); fixed for its life.
        self.inline = _inline if inline is None else inline

    @property
    def closed(self) -> bool:
        return self._closed

    def _part(self, key: object, build: Callable[[], Any]) -> Any:
        part = self._parts.get(key)
        if part is not None:
            return part
        with self._lock:
            if self._closed:
                raise RuntimeError("this wow_django runtime is closed; call get_runtime() for the current one")
            lock = self._building.setdefault(key, threading.Lock())
        # Building may talk to a server (a schema check): only builders of the same part wait.
        with lock:
            part = self._parts.get(key)
            if part is None:
                part = build()
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._parts[key] = part
                if closed:  # closed while building: nobody will close it later
                    _close(part)
                    raise RuntimeError("this wow_django runtime is closed; call get_runtime() for the current one")
            return part

    def backend(self, purpose: str) -> Backend:
        """The backend serving ``purpose`` (``"EVENT_STORE"``, ``"SNAPSHOT_STORE"``, ``"PREPARE_STORE"``,
        ``"BUS_STORE"``); one instance per backend kind, shared by its purposes."""
        name = wow_settings.storage_for(purpose)
        return self._part(("backend", name), lambda: BACKENDS[name]())

    # --- stores ------------------------------------------------------------------------------

    @property
    def event_store(self) -> EventStore:
        """The event store; wrapped in a batcher when ``WOW['EVENT_STORE_BATCH']['ENABLED']``."""
        return self._part("event_store", self._build_event_store)

    def _build_event_store(self) -> EventStore:
        store = self.backend("EVENT_STORE").event_store(request_id_index=wow_settings.REQUEST_ID_INDEX)
        batch = wow_settings.EVENT_STORE_BATCH
        if batch["ENABLED"] and not self.inline:  # the batcher appends from lanes: threads of their own
            store = BatchingEventStore(store, max_size=batch["MAX_SIZE"], max_delay_ms=batch["MAX_DELAY_MS"],
                                       max_pending=batch["MAX_PENDING"], lane_count=batch["LANE_COUNT"])
        return store

    @property
    def snapshot_store(self) -> SnapshotStore:
        return self._part("snapshot_store", lambda: self.backend("SNAPSHOT_STORE").snapshot_store())

    def prepare_key(self, name: str) -> PrepareKey:
        """The PrepareKey store named ``name`` (e.g. ``"username"``)."""
        return self._part(("prepare_key", name), lambda: self.backend("PREPARE_STORE").prepare_key(name))

    @property
    def bus_store(self) -> BusStore:
        return self._part("bus_store", lambda: self.backend("BUS_STORE").bus_store())

    # --- followers -------------------------------------------------------------------------------

    @property
    def stream_feed(self) -> StreamFeed:
        """The streams of ``WOW['CONTEXT_NAME']`` by position, on the event store's backend (followers read it)."""
        return self._part("stream_feed", self._build_stream_feed)

    def _build_stream_feed(self) -> StreamFeed:
        store = self.event_store
        if isinstance(store, BatchingEventStore):
            store = store.inner  # reads go straight to the wrapped store
        return self.backend("EVENT_STORE").stream_feed(store, wow_settings.CONTEXT_NAME)

    @property
    def follower_store(self) -> FollowerStore:
        """Followers' checkpoints, leases and operations state, beside the events (the event store's backend)."""
        return self._part("follower_store", lambda: self.backend("EVENT_STORE").follower_store())

    @property
    def follower_threads(self) -> FollowerThreads:
        """This process's follower threads (``WOW['FOLLOWERS_RUN'] == "threads"``), started by the gateway."""
        return self._part("follower_threads",
                          lambda: FollowerThreads(lambda: self.stream_feed, lambda: self.follower_store))

    def _start_followers(self) -> None:
        if not self._closed:
            self.follower_threads.ensure()

    @property
    def inline_followers(self) -> InlineFollowers:
        """This process's followers run in the calling thread (inline mode)."""
        return self._part("inline_followers",
                          lambda: InlineFollowers(lambda: self.stream_feed, lambda: self.follower_store))

    def catch_up_followers(self, names: Iterable[str] | None = None) -> None:
        """Inline mode: run the named followers (default: every declared one) in this thread until none has
        a stream left. Outside inline mode the followers run elsewhere (threads, ``wow_follow``, Celery):
        ``RuntimeError``."""
        if not self.inline:
            raise RuntimeError("catch_up_followers() runs followers in the calling thread, which only an "
                               "inline runtime does (see inline_background); wait for them with "
                               "wow_django.application.following.wait_caught_up instead")
        if not self._closed:
            self.inline_followers.run(names)

    # --- queries ---------------------------------------------------------------------------------

    def snapshot_queries(self, aggregate_name: str) -> QueryService:
        """Snapshot (read model) queries of one aggregate type, on the snapshot store's backend."""
        return self.backend("SNAPSHOT_STORE").snapshot_queries(self.snapshot_store, aggregate_name)

    def event_queries(self, aggregate_name: str) -> QueryService:
        """Event stream queries of one aggregate type, on the event store's backend."""
        store = self.event_store
        if isinstance(store, BatchingEventStore):
            store = store.inner  # reads go straight to the wrapped store
        return self.backend("EVENT_STORE").event_queries(store, aggregate_name)

    # --- services ----------------------------------------------------------------------------------

    @property
    def tasks(self) -> TaskQueue:
        """The task queue of ``WOW['TASK_QUEUE']``."""
        return self._part("tasks", lambda: wow_settings.TASK_QUEUE())

    @property
    def gateway(self) -> CommandGateway:
        return self._part("gateway", self._build_gateway)

    def _build_gateway(self) -> CommandGateway:
        inline = self.inline
        snapshots = self.snapshot_store
        waiter: ProjectionWaiter
        if inline:
            dispatcher = InlineDispatcher(save_snapshot=snapshots.save, queue_snapshot=lambda stream: (
                self.tasks.request_snapshot(stream.aggregate_name, stream.aggregate_id.id)))
            waiter = InlineProjectionWaiter(lambda: self.stream_feed, lambda: self.follower_store)
        else:
            dispatcher = None  # the gateway's own lanes
            waiter = ProjectionWaiter(lambda: self.stream_feed, lambda: self.follower_store)
        threads = wow_settings.FOLLOWERS_RUN == "threads" and not inline
        return CommandGateway(
            self.event_store,
            snapshots,
            context_name=wow_settings.CONTEXT_NAME,
            prepare_keys=self.prepare_key,
            tasks=lambda: self.tasks,
            retry_limit=wow_settings.COMMAND_RETRY_LIMIT,
            retry_backoff_ms=wow_settings.COMMAND_RETRY_BACKOFF_MS,
            wait_timeout_s=wow_settings.COMMAND_WAIT_TIMEOUT_S,
            storage_timeout_s=wow_settings.COMMAND_STORAGE_TIMEOUT_S,
            status_ttl_s=wow_settings.COMMAND_STATUS_TTL_S,
            snapshot_strategy=wow_settings.SNAPSHOT_STRATEGY,
            snapshot_version_offset=wow_settings.SNAPSHOT_VERSION_OFFSET,
            snapshot_time_offset_s=wow_settings.SNAPSHOT_TIME_OFFSET_S,
            snapshot_mode=wow_settings.SNAPSHOT_MODE,
            dispatcher=dispatcher,
            projections=waiter,
            before_send=self._start_followers if threads else None,
            hurry=self.follower_threads.hurry if threads else None,
            after_append=self.catch_up_followers if inline else None,
        )

    @property
    def bus(self) -> EventBus:
        return self._part("bus", self._build_bus)

    def _build_bus(self) -> EventBus:
        transport = BusTransport(wow_settings.BUS_TRANSPORT_URL, wow_settings.BUS_EXCHANGE,
                                 timeout=wow_settings.BUS_PUBLISH_TIMEOUT_S)
        return EventBus(
            self.bus_store, transport,
            service_name=wow_settings.SERVICE_NAME or wow_settings.CONTEXT_NAME,
            rollup_queue=lambda event_ids: self.tasks.rollup_many(event_ids),
            relay_after_s=wow_settings.BUS_RELAY_AFTER_S,
            repush_timeout_s=wow_settings.BUS_REPUSH_TIMEOUT_S,
            repush_max_count=wow_settings.BUS_REPUSH_MAX_COUNT,
            max_page_size=wow_settings.QUERY_MAX_PAGE_SIZE,
            retention_days=wow_settings.BUS_RETENTION_DAYS,
            expired_retention_days=wow_settings.BUS_EXPIRED_RETENTION_DAYS,
            search_fields=wow_settings.BUS_SEARCH_FIELDS,
        )

    # --- life cycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every part built; idempotent.

        This process's follower threads first, then the gateway, while every
        part is still reachable: each follower finishes its batch and gives
        its lease up, the dispatch lanes finish the snapshots they hold. Then the
        runtime refuses new parts and closes the rest (the bus before the
        stores: its transport may still publish).
        """
        threads = self._parts.get("follower_threads")
        if threads is not None:
            threads.close()  # each finishes its batch while the stores are still open
        gateway = self._parts.get("gateway")
        if gateway is not None:
            gateway.close()
        inline = self._parts.get("inline_followers")
        if inline is not None:
            inline.close()  # gives the leases up while the follower store is still open
        with self._lock:
            self._closed = True
            parts, self._parts = self._parts, {}
        order = ["bus", "event_store"]
        closed_first = ("gateway", "follower_threads", "inline_followers")
        for key in order + [k for k in parts if k not in order and k not in closed_first]:
            _close(parts.get(key))


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_inline = False


def get_runtime() -> Runtime:
    """This process's runtime, built on first use (and again after a settings change or a fork)."""
    runtime = _runtime
    if runtime is not None and not runtime.closed:
        return runtime
    return _build()


def _build() -> Runtime:
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.closed:
            _runtime = Runtime()
        return _runtime


#: The bus facade (wow_django.bus.get_bus) finds this process's bus here.
bus_provider.install(lambda: get_runtime().bus)


def _snapshot_repository() -> AggregateRepository:
    """The stores of this process's runtime as a repository, for the snapshot follower (one per runtime)."""
    runtime = get_runtime()
    repository = runtime.__dict__.get("_snapshot_repository")
    if repository is None:
        event_store = runtime.event_store
        if isinstance(event_store, BatchingEventStore):
            event_store = event_store.inner  # reads go straight to the wrapped store
        repository = AggregateRepository(event_store, runtime.snapshot_store, wow_settings.CONTEXT_NAME)
        runtime._snapshot_repository = repository
    return repository


#: The snapshot follower finds the stores here.
snapshotting.install_repository_provider(_snapshot_repository)


def _close(part: Any) -> None:
    close = getattr(part, "close", None)
    if close is not None:
        close()


def close_runtime() -> None:
    """Close this process's runtime; the next :func:`get_runtime` builds a new one.

    It stays the current runtime while it drains (what its dispatch still runs
    may call :func:`get_runtime`), and is replaced only once closed.
    """
    global _runtime
    runtime = _runtime
    if runtime is None:
        return
    runtime.close()
    with _runtime_lock:
        if _runtime is runtime:
            _runtime = None


@contextlib.contextmanager
def inline_background(enabled: bool = True) -> Iterator[None]:
    """Inside the block, the runtimes this process builds are inline (``enabled``) or not.

    The current runtime is closed on the way in and on the way out, so the next
    :func:`get_runtime` builds one in the mode asked for. What the test isolation of
    :mod:`wow_django.testing` uses for a test inside a transaction (a Django ``TestCase``,
    pytest-django's ``db``); see the module docstring.
    """
    global _inline
    previous = _inline
    close_runtime()
    _inline = bool(enabled)
    try:
        yield
    finally:
        try:
            close_runtime()
        finally:
            _inline = previous


def _after_fork_in_child() -> None:
    # The one fork policy: everything that must not cross a fork, in one place.
    global _runtime, _runtime_lock
    _runtime_lock = threading.Lock()
    _runtime = None  # the parent's: not closed, its threads and clients are the parent's
    connections.after_fork()
    django_connections_after_fork()


def _close_at_exit() -> None:
    try:
        close_runtime()
    except Exception:  # the process is leaving anyway: say why, do not hide the exit status
        logging.getLogger(__name__).exception("closing the wow_django runtime at exit failed")


atexit.register(_close_at_exit)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "WOW":
        close_runtime()


setting_changed.connect(_on_setting_changed, dispatch_uid="wow_django.application.runtime")


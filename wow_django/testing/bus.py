"""Helpers for testing code that uses the bus: broker names, clean-up, outages, consumers, waiting.

``WOW_TEST_AMQP_URL`` overrides the RabbitMQ of the integration tests
(default ``amqp://guest:guest@127.0.0.1:5672//``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from kombu import Connection, Exchange, Queue

from wow_django.application.runtime import get_runtime
from wow_django.bus.consumer import ConsumerWorker, consumer, run_in_thread
from wow_django.bus.transport import queue_name

if TYPE_CHECKING:
    from wow_django.bus.consumer import ConsumerContext
    from wow_django.bus.envelope import Envelope
    from wow_django.bus.service import EventBus

_T = TypeVar("_T")

AMQP_ENV = "WOW_TEST_AMQP_URL"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def amqp_url() -> str:
    return os.environ.get(AMQP_ENV) or DEFAULT_AMQP_URL


def unique_exchange(prefix: str = "wow.test") -> str:
    """An exchange name no other test uses (queue names derive from it)."""
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


def wait_for(predicate: Callable[[], _T], timeout: float = 20.0, interval: float = 0.02,
             what: str = "condition") -> _T:
    """Poll ``predicate`` until it returns something truthy; return it, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(interval)


def delete_amqp_entities(url: str, exchange: str, consumer_ids: Iterable[str]) -> None:
    """Delete the queues of ``consumer_ids`` and the exchange (what a test declared)."""
    with Connection(url, connect_timeout=5) as connection:
        channel = connection.channel()
        for consumer_id in consumer_ids:
            with contextlib.suppress(Exception):
                Queue(queue_name(exchange, consumer_id))(channel).delete()
        with contextlib.suppress(Exception):
            Exchange(exchange, type="topic")(channel).delete()


def queue_depth(url: str, exchange: str, consumer_id: str) -> int:
    """Messages ready in a consumer's queue (passive declare: the queue must exist)."""
    with Connection(url, connect_timeout=5) as connection:
        declared = Queue(queue_name(exchange, consumer_id))(connection.channel()).queue_declare(passive=True)
        # kombu is untyped: queue_declare gives a queue_declare_ok_t (queue, message_count, consumer_count).
        message_count: int = declared.message_count
        return message_count


class TcpProxy:
    """A TCP forwarder in front of a broker that a test can take down and bring back.

    ``stop()`` closes the listening socket and every open connection, as a
    broker outage does; ``start()`` listens again on the same port. ``hold()``
    keeps every connection open but forwards nothing until ``release()``, as a
    broker that hangs does.
    """

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = self._free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._flowing = threading.Event()
        self._flowing.set()

    def hold(self) -> None:
        """Forward nothing more (in either direction) until :meth:`release`; connections stay open."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    @staticmethod
    def _free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]  # an AF_INET address: (host, port)
            return port

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/{vhost.lstrip('/')}"

    def start(self) -> None:
        self._flowing.set()
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True, name="tcp-proxy")
        self._thread.start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._thread is not None:
            self._thread.join(5)

    @contextlib.contextmanager
    def running(self) -> Iterator[TcpProxy]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while not self._flowing.wait(0.1):  # held: what came in waits here
                    if source.fileno() < 0:
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(source)
            source.close()


def take_messages(url: str, exchange: str, consumer_id: str, limit: int = 1000) -> list:
    """Remove and return the messages ready in a consumer's queue (kombu ``Message`` objects, acknowledged)."""
    taken: list = []
    with Connection(url, connect_timeout=5, transport_options={"polling_interval": 0.01}) as connection:
        bound = Queue(queue_name(exchange, consumer_id))(connection.channel())
        while len(taken) < limit:
            message = bound.get(no_ack=True, accept=["json"])
            if message is None:
                break
            taken.append(message)
    return taken


class RunningConsumers:
    """``with RunningConsumers("member-service", ...) as workers:`` runs consumer workers in threads.

    Leaving the block stops them and waits for their threads (failing if one hangs).
    """

    def __init__(self, *consumer_ids: str, join_timeout: float = 15.0, bus: EventBus | None = None,
                 **kwargs: Any):
        bus = bus or get_runtime().bus
        self.workers = [ConsumerWorker(c, bus=bus, **kwargs) for c in consumer_ids]
        self.join_timeout = join_timeout
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> list[ConsumerWorker]:
        self.threads = [run_in_thread(w) for w in self.workers]
        return self.workers

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            thread.join(self.join_timeout)
            assert not thread.is_alive(), f"consumer thread {thread.name} did not stop"


def event_status(event_id: str) -> str:
    """The stored status of an event of the process's bus."""
    event = get_runtime().bus.store.get_event(event_id)
    assert event is not None, f"no stored event {event_id}"
    status: str = event["status"]
    return status


@contextlib.contextmanager
def proxied_broker(url: str | None = None) -> Iterator[TcpProxy]:
    """A running :class:`TcpProxy` in front of the broker of ``url`` (default :func:`amqp_url`).

    Point ``WOW['BUS_TRANSPORT_URL']`` at ``proxy.url()``; ``proxy.stop()`` is
    a broker outage, ``proxy.start()`` its end. Stopped when the block ends.
    """
    target = urlparse(url or amqp_url())
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5672)
    with proxy.running():
        yield proxy


class ConsumerRecorder:
    """Handlers for test consumers that record what they did and fail on request.

    ``declare(topic, *consumer_ids)`` registers one handler per consumer id (in
    the current consumer registry: use it inside
    :func:`wow_django.testing.isolated_registry`). Then:

    * ``deliveries[(consumer, eventId)]``: how often the handler was called;
    * ``effects[(consumer, eventId)]``: how often it succeeded (the side effect);
    * ``calls``: ``(consumer, eventId, attempt)`` in call order;
    * ``fail[consumer] = n``: the next ``n`` calls fail (``-1``: every call);
    * ``failing``: consumers whose every call fails.
    """

    def __init__(self) -> None:
        self.effects: Counter = Counter()
        self.deliveries: Counter = Counter()
        self.calls: list[tuple[str, str, int]] = []
        self.fail: dict[str, int] = {}
        self.failing: set[str] = set()
        self.lock = threading.Lock()

    def declare(self, topic: str, *consumer_ids: str) -> ConsumerRecorder:
        for consumer_id in consumer_ids:
            consumer(consumer_id, topics=[topic])(self.handler_for(consumer_id))
        return self

    def handler_for(self, consumer_id: str) -> Callable[[Envelope, ConsumerContext], None]:
        def handle(event: Envelope, ctx: ConsumerContext) -> None:
            self.handle(consumer_id, event, ctx)

        handle.__qualname__ = f"ConsumerRecorder.handle[{consumer_id}]"
        return handle

    def handle(self, consumer_id: str, event: Envelope, ctx: ConsumerContext) -> None:
        with self.lock:
            self.deliveries[(consumer_id, event.event_id)] += 1
            self.calls.append((consumer_id, event.event_id, ctx.attempt))
            if consumer_id in self.failing:
                raise RuntimeError(f"{consumer_id} cannot handle it")
            remaining = self.fail.get(consumer_id, 0)
            if remaining:
                self.fail[consumer_id] = remaining - 1 if remaining > 0 else -1
                raise RuntimeError(f"{consumer_id} is down")
            self.effects[(consumer_id, event.event_id)] += 1

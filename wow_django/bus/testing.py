"""Helpers for testing code that uses the bus: broker names, clean-up, outages, waiting.

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
from collections.abc import Callable, Iterable, Iterator

AMQP_ENV = "WOW_TEST_AMQP_URL"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def amqp_url() -> str:
    return os.environ.get(AMQP_ENV) or DEFAULT_AMQP_URL


def unique_exchange(prefix: str = "wow.test") -> str:
    """An exchange name no other test uses (queue names derive from it)."""
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):
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
    from kombu import Connection, Exchange, Queue

    from wow_django.bus.transport import queue_name

    with Connection(url, connect_timeout=5) as connection:
        channel = connection.channel()
        for consumer_id in consumer_ids:
            with contextlib.suppress(Exception):
                Queue(queue_name(exchange, consumer_id))(channel).delete()
        with contextlib.suppress(Exception):
            Exchange(exchange, type="topic")(channel).delete()


def queue_depth(url: str, exchange: str, consumer_id: str) -> int:
    """Messages ready in a consumer's queue (passive declare: the queue must exist)."""
    from kombu import Connection, Queue

    from wow_django.bus.transport import queue_name

    with Connection(url, connect_timeout=5) as connection:
        declared = Queue(queue_name(exchange, consumer_id))(connection.channel()).queue_declare(passive=True)
        return declared.message_count


class TcpProxy:
    """A TCP forwarder in front of a broker that a test can take down and bring back.

    ``stop()`` closes the listening socket and every open connection, as a
    broker outage does; ``start()`` listens again on the same port.
    """

    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = self._free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _free_port() -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/{vhost.lstrip('/')}"

    def start(self) -> None:
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
    from kombu import Connection, Queue

    from wow_django.bus.transport import queue_name

    taken = []
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

    def __init__(self, *consumer_ids: str, join_timeout: float = 15.0, **kwargs):
        from wow_django.bus.consumer import ConsumerWorker

        self.workers = [ConsumerWorker(c, **kwargs) for c in consumer_ids]
        self.join_timeout = join_timeout
        self.threads: list[threading.Thread] = []

    def __enter__(self):
        from wow_django.bus.consumer import run_in_thread

        self.threads = [run_in_thread(w) for w in self.workers]
        return self.workers

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            thread.join(self.join_timeout)
            assert not thread.is_alive(), f"consumer thread {thread.name} did not stop"


def event_status(event_id: str) -> str:
    """The stored status of an event of the process's bus."""
    from wow_django.bus.service import get_bus

    return get_bus().store.get_event(event_id)["status"]

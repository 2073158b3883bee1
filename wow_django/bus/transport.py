"""Moving envelopes through a broker with kombu.

- One durable **topic exchange** (``WOW['BUS_EXCHANGE']``); the routing key is
  the event's topic.
- One durable **queue per consumer**, ``{exchange}.{consumerId}``, bound to each
  of its topics. Before publishing, the publisher declares the queue and
  binding of every expected consumer, so an event is never routed to nowhere
  because a consumer's worker has not started yet.
- Messages are **persistent** (delivery mode 2) and, on AMQP, **confirmed**
  by the broker (``confirm_publish``): :meth:`BusTransport.publish` returns
  only once the broker has the message, and raises
  :class:`~wow_django.exceptions.TransportUnavailable` otherwise.
- A per-consumer re-push goes straight to that consumer's queue through the
  default exchange.

``memory://`` (the embedded default) works within one process, between threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Iterable

from kombu import Connection, Exchange, Producer, Queue, binding
from kombu.exceptions import OperationalError

from wow_django.exceptions import TransportUnavailable

logger = logging.getLogger("wow_django.bus.transport")

PERSISTENT = 2
CONTENT_TYPE = "application/json"
TARGET_HEADER = "wow-target-consumer"
POOL_SIZE = 8
DEFAULT_EXCHANGE = Exchange("")


def queue_name(exchange: str, consumer_id: str) -> str:
    return f"{exchange}.{consumer_id}"


def connection_errors_of(url: str) -> tuple[type[BaseException], ...]:
    """The errors a kombu connection to ``url`` raises when the broker does not answer."""
    return (OSError, OperationalError, *Connection(url).connection_errors)


def _timed_out(exc: BaseException) -> bool:
    """Whether a publish failed because the broker did not answer in time (py-amqp raises the socket's
    timeout, or a connection error it raised while handling one)."""
    return isinstance(exc, TimeoutError) or isinstance(exc.__context__, TimeoutError)


class _Publisher:
    """One connection, channel and producer; used by one thread at a time."""

    def __init__(self, transport: BusTransport):
        self.connection = transport.new_connection()
        # One try, no sleeping retries: a send must not hang while the broker is down.
        self.connection.ensure_connection(max_retries=0, timeout=transport.timeout)
        try:
            # Every wait on the broker from here on (opening the channel, declares, each publish's write and
            # confirm) gives up after transport.timeout. On AMQP that bound is set on the socket once, now:
            # passed with each publish instead, py-amqp would set it on the socket and put it back around the
            # write and again around the confirm (system calls each time), and leave the rest unbounded. The
            # socket carries nothing but this publisher's frames (no heartbeats).
            self.call_timeout: float | None = transport.timeout
            sock = getattr(getattr(self.connection.connection, "transport", None), "sock", None)
            if transport.is_amqp and sock is not None:
                sock.settimeout(transport.timeout)
                self.call_timeout = None
            self.channel = self.connection.channel()
            self.producer = Producer(self.channel, exchange=transport.exchange, serializer="json")
        except BaseException:
            self.discard()
            raise
        self.declared: set = set()

    def close(self) -> None:
        try:
            self.connection.release()
        except Exception:  # closing a broken connection may fail too
            logger.debug("closing a publisher connection failed", exc_info=True)

    def discard(self) -> None:
        """Drop a connection that failed, without the closing handshake (a broker that stopped answering
        would be waited for once more)."""
        try:
            self.connection.collect()
        except Exception:
            logger.debug("dropping a publisher connection failed", exc_info=True)


class BusTransport:
    def __init__(self, url: str, exchange_name: str, *, timeout: float = 5.0):
        self.url = url
        self.exchange_name = exchange_name
        self.exchange = Exchange(exchange_name, type="topic", durable=True, delivery_mode=PERSISTENT)
        self.timeout = timeout
        self._idle: queue.LifoQueue[_Publisher] = queue.LifoQueue()
        self._closed = False
        self._lock = threading.Lock()

    @property
    def is_amqp(self) -> bool:
        return self.url.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")

    def new_connection(self) -> Connection:
        options: dict = {}
        if self.is_amqp:
            options["confirm_publish"] = True
        elif self.url.startswith("memory://"):
            options["polling_interval"] = 0.01
        return Connection(self.url, connect_timeout=self.timeout, transport_options=options,
                          heartbeat=0)

    def queue(self, consumer_id: str, topics: Iterable[str] = ()) -> Queue:
        """The durable queue of ``consumer_id`` bound to ``topics`` on the bus exchange."""
        bindings = [binding(self.exchange, routing_key=topic) for topic in sorted(set(topics))]
        return Queue(queue_name(self.exchange_name, consumer_id), bindings=bindings or None, durable=True,
                     auto_delete=False)

    # --- publishing -----------------------------------------------------------------

    def publish(self, message: dict, *, topic: str, consumers: Iterable[str], target: str | None = None) -> None:
        """Publish one envelope (wire form); confirmed on AMQP.

        ``consumers`` are declared and bound to ``topic`` first. With ``target``
        the message goes only to that consumer's queue.
        """
        consumers = list(consumers)
        body = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        publisher, pooled = self._acquire()
        while True:
            try:
                self._publish(publisher, body, message, topic=topic, consumers=consumers, target=target)
            except Exception as exc:
                publisher.discard()
                if pooled and not _timed_out(exc):
                    # An idle pooled connection may have died with the broker
                    # (restart, failover): try once more on a fresh one. A
                    # duplicate at worst, which every consumer's inbox absorbs.
                    # (Not after a timeout: a broker that does not answer would
                    # make the send wait once more.)
                    publisher, pooled = self._connect(), False
                    continue
                raise TransportUnavailable(
                    f"publishing {message.get('eventId')!r} to {self.exchange_name!r} failed "
                    f"({type(exc).__name__}: {exc}); the event stays stored and the relay retries it"
                ) from exc
            self._release(publisher)
            return

    def _publish(self, publisher: _Publisher, body: str, message: dict, *, topic: str, consumers: list[str],
                 target: str | None) -> None:
        self._declare(publisher, topic, consumers if target is None else [target])
        headers = {"wow-topic": topic}
        if target is not None:
            headers[TARGET_HEADER] = target
            # The default exchange routes by queue name: only this consumer's queue gets it.
            exchange, routing_key = DEFAULT_EXCHANGE, queue_name(self.exchange_name, target)
        else:
            exchange, routing_key = self.exchange, topic
        publisher.producer.publish(
            body, exchange=exchange, routing_key=routing_key, content_type=CONTENT_TYPE,
            content_encoding="utf-8", delivery_mode=PERSISTENT, message_id=message.get("eventId"),
            headers=headers, retry=False, timeout=publisher.call_timeout, confirm_timeout=publisher.call_timeout,
        )

    def _declare(self, publisher: _Publisher, topic: str, consumers: list[str]) -> None:
        if "exchange" not in publisher.declared:
            self.exchange(publisher.channel).declare()
            publisher.declared.add("exchange")
        for consumer in consumers:
            key = (consumer, topic)
            if key in publisher.declared:
                continue
            self.queue(consumer, [topic])(publisher.channel).declare()
            publisher.declared.add(key)

    def _acquire(self) -> tuple[_Publisher, bool]:
        """An idle pooled publisher (``True``) or a new one (``False``)."""
        try:
            return self._idle.get_nowait(), True
        except queue.Empty:
            return self._connect(), False

    def _connect(self) -> _Publisher:
        try:
            return _Publisher(self)
        except Exception as exc:
            raise TransportUnavailable(
                f"cannot connect to the bus broker ({type(exc).__name__}: {exc}); the event stays stored "
                "and the relay retries it"
            ) from exc

    def _release(self, publisher: _Publisher) -> None:
        with self._lock:
            keep = not self._closed and self._idle.qsize() < POOL_SIZE
        if keep:
            self._idle.put(publisher)
        else:
            publisher.close()

    # --- tearing down ------------------------------------------------------------------

    def delete_entities(self, consumer_ids: Iterable[str]) -> list[str]:
        """Delete the queues of ``consumer_ids`` and this bus's exchange from the broker, messages included:
        what a project (or a demo) that is taken down leaves behind. The exchange stays while queues of other
        consumers are bound to it. Returns the names it found and deleted.
        :class:`~wow_django.exceptions.TransportUnavailable` when the broker does not answer."""
        names = [queue_name(self.exchange_name, c) for c in sorted(set(consumer_ids))]
        try:
            with self.new_connection() as connection:
                connection.ensure_connection(max_retries=0, timeout=self.timeout)
                if self.is_amqp:
                    return self._delete_amqp(connection, names)
                return self._delete_virtual(connection, names)
        except connection_errors_of(self.url) as exc:
            raise TransportUnavailable(f"cannot reach the bus broker to delete its queues ({type(exc).__name__}: "
                                       f"{exc})") from exc

    def _delete_amqp(self, connection: Connection, names: list[str]) -> list[str]:
        deleted = []
        for name in names:
            if self._exists(connection, lambda channel, n=name: channel.queue_declare(n, passive=True)):
                channel = connection.channel()
                channel.queue_delete(name)
                channel.close()
                deleted.append(name)
        if self._exists(connection, lambda channel: channel.exchange_declare(self.exchange_name, "topic",
                                                                             passive=True)):
            # if_unused: an exchange another project's queues are still bound to stays (RabbitMQ would
            # otherwise drop what is published for them): 406 PRECONDITION_FAILED
            if self._exists(connection, lambda channel: channel.exchange_delete(self.exchange_name, if_unused=True)):
                deleted.append(self.exchange_name)
        return deleted

    @staticmethod
    def _exists(connection: Connection, declare) -> bool:
        """Whether ``declare(channel)`` succeeds (a passive declare finds the entity, a conditional delete
        deletes it); a refusal closes its channel, so it gets one of its own."""
        channel = connection.channel()
        try:
            declare(channel)
            return True
        except connection.channel_errors:  # 404 NOT_FOUND
            return False
        finally:
            with contextlib.suppress(Exception):
                channel.close()

    def _delete_virtual(self, connection: Connection, names: list[str]) -> list[str]:
        """kombu's virtual transports (Redis, memory): the bindings are kept by the transport (in Redis, or in
        this process), so they are read back and bound on this channel, which then deletes queue and
        bindings together."""
        channel = connection.channel()
        channel.exchange_declare(self.exchange_name, type="topic", durable=True)
        table = channel.get_table(self.exchange_name)
        wanted = set(names)
        for routing_key, _, bound_queue in table:
            if bound_queue in wanted:
                channel.queue_bind(bound_queue, self.exchange_name, routing_key)
        bound = {bound_queue for _, _, bound_queue in table}
        deleted = []
        for name in names:
            held = channel.queue_purge(name) or 0  # the messages of a queue that has no binding any more
            channel.queue_delete(name)
            if held or name in bound:
                deleted.append(name)
        others = {q for _, _, q in channel.get_table(self.exchange_name)} - wanted
        if self.url.startswith("memory://"):  # its table keeps the bindings of deleted queues: are they there?
            others = {q for q in others if self._exists(connection, lambda ch, q=q: ch.queue_declare(q, passive=True))}
        if table and not others:  # another consumer's queue still bound to it: it stays
            channel.exchange_delete(self.exchange_name)
            deleted.append(self.exchange_name)
        return deleted

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

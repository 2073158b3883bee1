"""Run one bus consumer until stopped: ``manage.py wow_consume member-service``."""

from __future__ import annotations

import signal
import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from wow_django.application.runtime import get_runtime
from wow_django.bus.consumer import ConsumerWorker


class Command(BaseCommand):
    help = (
        "Consume the bus queue of one consumer id (declared with @wow_django.bus.consumer) and run its "
        "handlers, with the idempotent inbox, retries and feedback. SIGTERM or SIGINT stops it gracefully: "
        "the message being handled is finished and acknowledged first."
    )

    def add_arguments(self, parser):
        parser.add_argument("consumer_id", help="The consumer id, e.g. member-service.")
        parser.add_argument("--prefetch", type=int, default=None,
                            help="Unacknowledged messages held at once (default WOW['BUS_CONSUMER_PREFETCH']).")
        parser.add_argument("--max-messages", type=int, default=None,
                            help="Stop after receiving this many messages.")
        parser.add_argument("--idle-timeout", type=float, default=None,
                            help="Stop after this many seconds without a message.")

    def handle(self, *args, consumer_id, prefetch=None, max_messages=None, idle_timeout=None, **options):
        for name, value in (("--prefetch", prefetch), ("--max-messages", max_messages),
                            ("--idle-timeout", idle_timeout)):
            if value is not None and value <= 0:
                raise CommandError(f"{name} must be greater than 0")
        try:
            worker = ConsumerWorker(consumer_id, bus=get_runtime().bus, prefetch=prefetch)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc

        def stop(signum, frame):
            self.stdout.write(f"{signal.Signals(signum).name}: finishing the current message, then stopping.")
            worker.stop()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, stop)
        self.stdout.write(f"Consuming {worker.queue_name} for {consumer_id} (topics: {', '.join(worker.topics)}).")
        try:
            stats = worker.run(max_messages=max_messages, idle_timeout=idle_timeout)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        summary = ", ".join(f"{value} {key}" for key, value in stats.to_json().items())
        self.stdout.write(self.style.SUCCESS(f"Stopped {consumer_id}: {summary}."))

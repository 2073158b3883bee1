"""Fill the sample order service with demo data, and optionally serve it.

The data goes to the project's database (``sample.sqlite3`` by default), so it
outlives the command and every other process of the project sees it. Every
command of the demo has a fixed request id: running it again adds nothing
(the gateway answers the earlier result) and reports what is already there.

``--serve`` then runs the development server with Django's autoreloader, and
beside it the processes the demo needs (:mod:`sample_project.orders.demo_processes`).
The autoreloader runs this command again in a child process (``RUN_MAIN=true``)
to serve, and again after each code change: that child neither refills nor
starts processes; it only serves, and on ``memory://`` runs the bus consumers
in threads beside the server. The processes belong to the first process and
are stopped when it ends (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from collections import Counter
from decimal import Decimal

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV

from sample_project.orders.aggregates import (
    CancelOrder,
    Order,
    OrderLine,
    PayOrder,
    PlaceOrder,
    RegisterCustomer,
    ShipOrder,
)
from sample_project.orders.demo_processes import (
    DemoProcesses,
    bus_crosses_processes,
    celery_is_eager,
    celery_parts,
    clean,
    consume_in_threads,
    consumer_parts,
    end_with_parent,
    follower_parts,
    handed_down_environment,
    separately,
)
from sample_project.orders.integration import configure_topic_consumers
from sample_project.orders.models import OrderSummary
from wow_django.application.followers import FollowerThreads
from wow_django.application.following import wait_caught_up
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import close_runtime, get_runtime
from wow_django.conf import wow_settings
from wow_django.exceptions import DomainError

PRODUCTS = [("TEA-100", Decimal("12.50")), ("CUP-200", Decimal("8.00")), ("POT-300", Decimal("45.00")),
            ("BAG-400", Decimal("3.20"))]
NAMES = ["ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances"]


class Command(BaseCommand):
    help = ("Create demo customers and orders through the command gateway (again: adds nothing); "
            "--serve then runs the site and the workers and consumers it needs.")

    def add_arguments(self, parser):
        parser.add_argument("--orders", type=int, default=12, help="orders to create (default 12)")
        parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
        parser.add_argument("--serve", action="store_true",
                            help="then create the demo admin user and run the development server, the Celery "
                                 "workers and the bus consumers")
        parser.add_argument("--addrport", default="127.0.0.1:8000", help="where --serve listens")
        parser.add_argument("--no-workers", action="store_true",
                            help="with --serve: start no Celery worker or consumer process (run them yourself)")
        parser.add_argument("--noreload", action="store_true",
                            help="with --serve: run the server without Django's autoreloader")
        parser.add_argument("--clean-brokers", action="store_true",
                            help="delete what the demo keeps on the brokers (the bus's exchange and queues, the "
                                 "Celery queues, every Redis key under the demo's prefix), then exit; stop the "
                                 "demo first")

    def handle(self, *args, orders=12, seed=7, serve=False, addrport="127.0.0.1:8000", no_workers=False,
               noreload=False, clean_brokers=False, **options):
        if clean_brokers:
            if not clean(self.stdout.write, self.style):
                raise CommandError("some brokers could not be cleaned (see above); run it again once they answer")
            return
        if orders < 1:
            raise CommandError("--orders must be ≥ 1")
        if serve and not noreload and os.environ.get(DJANGO_AUTORELOAD_ENV) == "true":
            # The autoreloader's serving child: the first process filled the database and runs the rest.
            end_with_parent()
            self.run_server(addrport, use_reloader=True)
            return
        followers = None
        if wow_settings.FOLLOWERS_RUN != "threads":
            # Commands wait for their projections (PROJECTED) and the bus demo for the relay: while filling,
            # this process runs the followers as a wow_follow process would (the leases keep one at work).
            runtime = get_runtime()
            followers = FollowerThreads(lambda: runtime.stream_feed, lambda: runtime.follower_store)
            followers.ensure()
        try:
            self.fill(orders, seed)
        finally:
            if followers is not None:
                followers.close()
        if serve:
            self.serve(addrport, workers=not no_workers, use_reloader=not noreload)

    # --- the data -------------------------------------------------------------------------

    def fill(self, orders: int, seed: int) -> None:
        rng = random.Random(seed)
        # The events, snapshots and the downstream services' rows live in the project's database.
        call_command("migrate", interactive=False, verbosity=0)
        gateway = get_runtime().gateway
        write = self.stdout.write
        # Paid orders publish order.purchased: its consumers must be configured first.
        configure_topic_consumers()

        write(self.style.MIGRATE_HEADING("Customers (unique usernames through PrepareKey)"))
        customers = []
        for name in NAMES[: max(2, min(len(NAMES), orders // 2))]:
            result = gateway.send(RegisterCustomer(username=name, display_name=name.title()),
                                  request_id=f"demo-register-{name}", operator="demo")
            customers.append(result.aggregate_id)
            write(f"  {name:10} → customer {result.aggregate_id}" + (" (already there)" if result.duplicate else ""))
        try:
            gateway.send(RegisterCustomer(username=NAMES[0], display_name="Impostor"), operator="demo")
        except DomainError as exc:
            write(f"  a second {NAMES[0]!r} is refused: {exc.error_code}: {exc}")

        write(self.style.MIGRATE_HEADING("Orders"))
        outcomes: Counter[str] = Counter()
        purchases: list[str] = []  # trace ids of the paid orders' order.purchased
        existing = 0
        for n in range(orders):
            lines = [OrderLine(sku=sku, quantity=rng.randint(1, 3), unit_price=price)
                     for sku, price in rng.sample(PRODUCTS, rng.randint(1, 3))]
            placed = gateway.send(
                PlaceOrder(customer_id=rng.choice(customers), items=lines),
                request_id=f"demo-order-{seed}-{n}", operator="demo", wait=WaitStage.PROJECTED,
            )
            existing += placed.duplicate
            order_id = placed.aggregate_id
            total = sum((line.unit_price * line.quantity for line in lines), Decimal("0"))
            fate = rng.choice(["placed", "paid", "shipped", "shipped", "cancelled", "wrong-amount"])
            try:
                if fate in ("paid", "shipped", "wrong-amount"):
                    amount = total + Decimal("1.00") if fate == "wrong-amount" else total
                    # A fixed trace id: the purchase's bus events can be found again on a rerun.
                    trace_id = f"trace-demo-pay-{seed}-{n}"
                    paid = gateway.send(PayOrder(amount=amount, payment_id=f"pay-{n}"), aggregate_id=order_id,
                                        request_id=f"demo-pay-{seed}-{n}", operator="demo",
                                        header={"traceId": trace_id})
                    if paid.succeeded and not paid.duplicate:  # an earlier run waited for its own
                        purchases.append(trace_id)
                if fate == "shipped":
                    gateway.send(ShipOrder(tracking_number=f"TRK{n:05d}"), aggregate_id=order_id,
                                 request_id=f"demo-ship-{seed}-{n}", operator="demo")
                if fate == "cancelled":
                    gateway.send(CancelOrder(reason="customer changed their mind"), aggregate_id=order_id,
                                 request_id=f"demo-cancel-{seed}-{n}", operator="demo")
            except DomainError as exc:
                write(f"  order {order_id}: refused as expected: {exc.error_code}: {exc}")
            outcomes[fate] += 1
        if existing:
            write(f"  {existing} of these {orders} orders were already there (same request ids): nothing added")
        gateway.dispatcher.close()  # let the snapshots finish
        # Projections and processors run on followers (threads of this process by default, or wow_follow).
        if not wait_caught_up(timeout=30):
            write("  the followers did not catch up within 30s: see manage.py wow_followers")

        counts: Counter[str] = Counter()
        for key in gateway.event_store.iter_all("order"):
            aggregate = gateway.repository.load(Order, key.id, tenant_id=key.tenant_id)
            counts[aggregate.state.status] += 1
        write("  orders by status: " + ", ".join(f"{status} {n}" for status, n in sorted(counts.items())))
        summaries = Counter(OrderSummary.objects.values_list("status", flat=True))
        write("  the order-summaries projection (read model OrderSummary): "
              + ", ".join(f"{status} {n}" for status, n in sorted(summaries.items())))

        self.demo_bus(purchases)

    def demo_bus(self, purchases: list[str]) -> None:
        from sample_project.orders.demo_bus import run_bus_demo

        self.stdout.write(self.style.MIGRATE_HEADING("Integration events (order.purchased → member & message)"))
        run_bus_demo(self.stdout, also_settle=purchases)

    # --- serving ------------------------------------------------------------------------------

    def serve(self, addrport: str, *, workers: bool, use_reloader: bool) -> None:
        from django.contrib.auth import get_user_model

        write = self.stdout.write
        if settings.DEBUG:
            users = get_user_model()
            if not users.objects.filter(username="admin").exists():
                users.objects.create_superuser("admin", "admin@example.invalid", "admin")
        write(self.style.MIGRATE_HEADING("Serving"))
        write(f"  data: {self.where_the_data_is()}")
        write(f"  Celery: {'eager (tasks run inline; no broker reachable)' if celery_is_eager() else settings.CELERY_BROKER_URL}")
        write(f"  bus: {wow_settings.BUS_TRANSPORT_URL} (exchange {wow_settings.BUS_EXCHANGE})")
        # The autoreloader's child and the processes started here decide as this process did.
        os.environ.update(handed_down_environment())
        parts = [*celery_parts(), *consumer_parts(), *follower_parts()] if workers else []
        processes = DemoProcesses(parts, stdout=self.stdout)
        close_runtime()  # this process only waits from now on (with the autoreloader) or serves afresh
        connections.close_all()
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
        try:
            processes.start()
            if not bus_crosses_processes():
                write("  the bus consumers run in the web server's process (memory:// never leaves a process)")
            elif not workers:
                write("  --no-workers: start the consumers yourself (below)")
            write("Each part on its own, as in production (see README.md):")
            for line in separately():
                write(f"  {line}")
            write(f"Home: http://{addrport}/ (links to the API docs, the console and the admin)")
            if settings.DEBUG:
                write(f"Admin: http://{addrport}/admin/ (user admin, password admin — demo only)")
            write(f"API docs: http://{addrport}/api/docs/")
            self.run_server(addrport, use_reloader=use_reloader)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the stopping short
            try:
                processes.stop()
            finally:
                if main_thread:
                    signal.signal(signal.SIGTERM, previous)

    def run_server(self, addrport: str, *, use_reloader: bool) -> None:
        """Serve; with the autoreloader this process only watches while a child serves (RUN_MAIN=true)."""
        serving_here = not use_reloader or os.environ.get(DJANGO_AUTORELOAD_ENV) == "true"
        if serving_here and not bus_crosses_processes():
            consumers = consume_in_threads()
            self.stdout.write(f"Consuming in this process ({os.getpid()}): "
                              + ", ".join(worker.consumer_id for worker in consumers))
        call_command("runserver", addrport, use_reloader=use_reloader)

    @staticmethod
    def where_the_data_is() -> str:
        database = settings.DATABASES["default"]
        if database["ENGINE"].endswith("sqlite3"):
            where = f"SQLite {database['NAME']} (delete it to start over)"
        else:
            where = f"{database['ENGINE'].rsplit('.', 1)[-1]} database {database['NAME']!r}"
        if wow_settings.storage_for("EVENT_STORE") == "mongo":
            where += "; events, snapshots and bus records on MongoDB"
        return where


def _exit_on_sigterm(signum, frame):
    """SIGTERM ends the demo as Ctrl-C does: through the ``finally`` that stops its processes."""
    sys.exit(0)

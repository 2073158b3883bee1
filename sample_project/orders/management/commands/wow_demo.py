"""Fill the sample order service with demo data, and optionally serve it.

On the embedded defaults (mongomock://) the data lives in this process only,
so ``--serve`` runs the development server in the same process.
"""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from sample_project.orders.aggregates import (
    CancelOrder,
    Order,
    OrderLine,
    PayOrder,
    PlaceOrder,
    RegisterCustomer,
    ShipOrder,
)
from sample_project.orders.integration import configure_topic_consumers
from wow_django.application.gateway import WaitStage
from wow_django.application.runtime import get_runtime
from wow_django.exceptions import DomainError

PRODUCTS = [("TEA-100", Decimal("12.50")), ("CUP-200", Decimal("8.00")), ("POT-300", Decimal("45.00")),
            ("BAG-400", Decimal("3.20"))]
NAMES = ["ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances"]


class Command(BaseCommand):
    help = "Create demo customers and orders through the command gateway; --serve then runs the site."

    def add_arguments(self, parser):
        parser.add_argument("--orders", type=int, default=12, help="orders to create (default 12)")
        parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
        parser.add_argument("--serve", action="store_true",
                            help="then migrate, create the demo admin user and run the development server")
        parser.add_argument("--addrport", default="127.0.0.1:8000", help="where --serve listens")

    def handle(self, *args, orders=12, seed=7, serve=False, addrport="127.0.0.1:8000", **options):
        if orders < 1:
            raise CommandError("--orders must be ≥ 1")
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
        for n in range(orders):
            lines = [OrderLine(sku=sku, quantity=rng.randint(1, 3), unit_price=price)
                     for sku, price in rng.sample(PRODUCTS, rng.randint(1, 3))]
            placed = gateway.send(
                PlaceOrder(customer_id=rng.choice(customers), items=lines),
                request_id=f"demo-order-{seed}-{n}", operator="demo", wait=WaitStage.PROJECTED,
            )
            order_id = placed.aggregate_id
            total = sum((line.unit_price * line.quantity for line in lines), Decimal("0"))
            fate = rng.choice(["placed", "paid", "shipped", "shipped", "cancelled", "wrong-amount"])
            try:
                if fate in ("paid", "shipped", "wrong-amount"):
                    amount = total + Decimal("1.00") if fate == "wrong-amount" else total
                    gateway.send(PayOrder(amount=amount, payment_id=f"pay-{n}"), aggregate_id=order_id,
                                 request_id=f"demo-pay-{seed}-{n}", operator="demo")
                if fate == "shipped":
                    gateway.send(ShipOrder(tracking_number=f"TRK{n:05d}"), aggregate_id=order_id,
                                 request_id=f"demo-ship-{seed}-{n}", operator="demo")
                if fate == "cancelled":
                    gateway.send(CancelOrder(reason="customer changed their mind"), aggregate_id=order_id,
                                 request_id=f"demo-cancel-{seed}-{n}", operator="demo")
            except DomainError as exc:
                write(f"  order {order_id}: refused as expected: {exc.error_code}: {exc}")
            outcomes[fate] += 1
        gateway.dispatcher.close()  # let snapshots and projections finish

        counts: Counter[str] = Counter()
        for key in gateway.event_store.iter_all("order"):
            aggregate = gateway.repository.load(Order, key.id)
            counts[aggregate.state.status] += 1
        write("  orders by status: " + ", ".join(f"{status} {n}" for status, n in sorted(counts.items())))

        self.demo_bus()

        if serve:
            self.serve(addrport)

    def demo_bus(self) -> None:
        from sample_project.orders.demo_bus import run_bus_demo

        self.stdout.write(self.style.MIGRATE_HEADING("Integration events (order.purchased → member & message)"))
        run_bus_demo(self.stdout)

    def serve(self, addrport: str) -> None:
        from django.conf import settings
        from django.contrib.auth import get_user_model

        if settings.DEBUG:
            users = get_user_model()
            if not users.objects.filter(username="admin").exists():
                users.objects.create_superuser("admin", "admin@example.invalid", "admin")
            self.stdout.write(f"Admin: http://{addrport}/admin/ (user admin, password admin — demo only)")
        self.stdout.write(f"API docs: http://{addrport}/api/docs/")
        # Same process: the embedded engine's data is only here.
        call_command("runserver", addrport, use_reloader=False)

"""``manage.py kill_probe_orders N``: place and pay N orders (no follower runs in this process)."""

from decimal import Decimal

from django.core.management.base import BaseCommand

from sample_project.orders.aggregates import OrderLine, PayOrder, PlaceOrder
from tests.follower_app.followers import create_tables
from wow_django.application.runtime import get_runtime
from wow_django.bus import get_bus


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("orders", type=int)

    def handle(self, *args, orders, **options):
        create_tables()
        get_bus().set_topic_consumer("order.purchased", "member-service", enabled=True, updated_by="kill test")
        gateway = get_runtime().gateway
        for n in range(orders):
            placed = gateway.send(PlaceOrder(customer_id=f"c-{n % 7}",
                                             items=[OrderLine(sku="SKU-1", quantity=1, unit_price=Decimal("5.00"))]),
                                  request_id=f"kill-place-{n}")
            gateway.send(PayOrder(amount=Decimal("5.00"), payment_id=f"p-{n}"), aggregate_id=placed.aggregate_id,
                         request_id=f"kill-pay-{n}")
        self.stdout.write(f"placed and paid {orders} orders")

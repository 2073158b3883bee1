"""``manage.py fault_orders N``: place N orders (no follower runs in this process)."""

from decimal import Decimal

from django.core.management.base import BaseCommand

from sample_project.orders.aggregates import OrderLine, PlaceOrder
from tests.fault_app.followers import create_tables
from wow_django.application.runtime import get_runtime


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("orders", type=int)

    def handle(self, *args, orders, **options):
        create_tables()
        gateway = get_runtime().gateway
        for n in range(orders):
            gateway.send(PlaceOrder(customer_id=f"c-{n}",
                                    items=[OrderLine(sku="SKU-1", quantity=1, unit_price=Decimal("5.00"))]),
                         request_id=f"fault-place-{n}")

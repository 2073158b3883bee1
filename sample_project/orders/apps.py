from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "sample_project.orders"
    label = "orders"
    verbose_name = "Orders (sample)"

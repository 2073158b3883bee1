from django.apps import AppConfig


class QueryTablesConfig(AppConfig):
    name = "tests.query_app"
    label = "wow_query_tests"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class WowDjangoConfig(AppConfig):
    name = "wow_django"
    verbose_name = "Wow (event sourcing)"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Only checks and signal handlers: nothing talks to a server here.
        from wow_django import checks  # noqa: F401

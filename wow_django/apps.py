from django.apps import AppConfig


class WowDjangoConfig(AppConfig):
    name = "wow_django"
    verbose_name = "Wow (event sourcing)"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Checks, and the declarations of installed apps (like admin's
        # autodiscover). Importing talks to no server.
        from django.utils.module_loading import autodiscover_modules

        from wow_django import checks  # noqa: F401
        from wow_django.application import runtime  # noqa: F401  (installs the bus facade's provider)

        autodiscover_modules("aggregates", "projections", "followers")

from django.apps import AppConfig


class BusConfig(AppConfig):
    """The integration-event bus as an installable app (label ``wow_bus``)."""

    name = "wow_django.bus"
    label = "wow_bus"
    verbose_name = "Wow integration-event bus"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Checks, and the consumers and domain → integration translators of
        # installed apps. Talks to no server.
        from django.utils.module_loading import autodiscover_modules

        from wow_django.application import runtime  # noqa: F401  (installs the bus facade's provider)
        from wow_django.bus import checks  # noqa: F401

        autodiscover_modules("consumers", "integration")

"""wow_django: CQRS and event sourcing for Django, on the project's own SQL database (the default) or MongoDB."""

__version__ = "0.1.0"

"""wow_django: CQRS and event sourcing on MongoDB for Django."""

__version__ = "0.1.0"

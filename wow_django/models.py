"""The ``wow_django`` app's models: the tables of the django storage backend, and the console's.

The storage tables live in :mod:`wow_django.backends.django.models`; importing
them here is what makes Django see them (``manage.py migrate`` creates them;
run it for the database of ``WOW['DATABASE_ALIAS']``, e.g. ``migrate
--database=events``). The console's permission placeholder and audit trail
live in :mod:`wow_django.console.models`.
"""

from wow_django.backends.django.models import EventStreamRow, PrepareKeyRow, SnapshotRow
from wow_django.console.models import Console, ConsoleAudit, FailureNote

__all__ = ["Console", "ConsoleAudit", "FailureNote", "EventStreamRow", "PrepareKeyRow", "SnapshotRow"]

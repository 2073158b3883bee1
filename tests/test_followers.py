"""The follower contracts and the runner on every backend: in-memory, the django backend on SQLite and on
PostgreSQL."""

from __future__ import annotations

import unittest

from django.test import TransactionTestCase

from wow_django.backends.django.event_store import DjangoEventStore
from wow_django.backends.django.followers import DjangoFollowerStore, DjangoStreamFeed
from wow_django.backends.memory.followers import InMemoryFollowerStore, InMemoryStreamFeed
from wow_django.backends.memory.stores import InMemoryEventStore
from wow_django.testing.followers import FollowerRunnerContract, FollowerStoreContract, StreamFeedContract


class InMemory:
    def make_event_store(self):
        return InMemoryEventStore()

    def make_feed(self, store, context_name):
        return InMemoryStreamFeed(store, context_name)

    def make_follower_store(self):
        return InMemoryFollowerStore()


class TestInMemoryStreamFeed(InMemory, StreamFeedContract, unittest.TestCase):
    pass


class TestInMemoryFollowerStore(InMemory, FollowerStoreContract, unittest.TestCase):
    pass


class TestInMemoryFollowerRunner(InMemory, FollowerRunnerContract, unittest.TestCase):
    pass


class OnDjango:
    """The django backend; a ``TransactionTestCase``: the contracts' threads use their own connections."""

    available_apps = ["wow_django"]

    def make_event_store(self):
        return DjangoEventStore(using=self.alias)

    def make_feed(self, store, context_name):
        return DjangoStreamFeed(store, context_name)

    def make_follower_store(self):
        return DjangoFollowerStore(using=self.alias)


class OnSQLite(OnDjango):
    databases = {"default", "wow_sqlite"}
    alias = "wow_sqlite"


class OnPostgreSQL(OnDjango):
    databases = {"default", "wow_pg"}
    alias = "wow_pg"


class TestSQLiteStreamFeed(OnSQLite, StreamFeedContract, TransactionTestCase):
    pass


class TestSQLiteFollowerStore(OnSQLite, FollowerStoreContract, TransactionTestCase):
    pass


class TestSQLiteFollowerRunner(OnSQLite, FollowerRunnerContract, TransactionTestCase):
    pass


class TestPostgreSQLStreamFeed(OnPostgreSQL, StreamFeedContract, TransactionTestCase):
    pass


class TestPostgreSQLFollowerStore(OnPostgreSQL, FollowerStoreContract, TransactionTestCase):
    pass


class TestPostgreSQLFollowerRunner(OnPostgreSQL, FollowerRunnerContract, TransactionTestCase):
    pass

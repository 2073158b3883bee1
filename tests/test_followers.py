"""The follower contracts and the runner on every backend: in-memory, the django backend on SQLite and on
PostgreSQL."""

from __future__ import annotations

import unittest

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

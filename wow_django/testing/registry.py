"""Isolating what a test declares: aggregates, commands, events, projections, consumers, followers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from wow_django.application.followers import followers, use_followers
from wow_django.bus.consumer import ConsumerRegistry, consumers, use_consumers
from wow_django.domain.registry import Registry, current, use_registry


@contextlib.contextmanager
def isolated_registry() -> Iterator[tuple[Registry, ConsumerRegistry]]:
    """Declarations made inside the block vanish after it; those made before stay visible inside.

    Swaps in copies of the current domain registry (aggregates, commands,
    events, prepare keys, projections, processors), consumer registry and
    follower registry; yields ``(registry, consumers)``. Nothing to unregister afterwards::

        with isolated_registry():
            class Ping(Command, name="ping"): ...
    """
    with use_registry(current().copy()) as registry, use_consumers(consumers().copy()) as declared, \
            use_followers(followers().copy()):
        yield registry, declared

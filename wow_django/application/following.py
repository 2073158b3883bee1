"""Running and waiting for followers with the process's runtime: what tests, deploy scripts, the Celery task
``wow_django.follow`` and ``manage.py wow_follow --until-caught-up`` use.

Kept apart from :mod:`wow_django.application.followers` (which the runtime builds on) so that the
followers module never reaches up to the runtime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from wow_django.application.followers import FollowerRunner, declared_followers, progress
from wow_django.application.runtime import Runtime, get_runtime
from wow_django.persistence.followers import FollowerStore, StreamFeed


def run_until_caught_up(names: Iterable[str] | None = None, *, budget_s: float | None = None,
                        feed: StreamFeed | None = None, store: FollowerStore | None = None) -> dict[str, int]:
    """Run the named followers (default: every declared one), one thread each, until each is caught up,
    paused or stopped on a poison event, or ``budget_s`` has passed; their positions afterwards.

    What the Celery beat task ``wow_django.follow`` and ``wow_follow --until-caught-up`` do. An instance
    that cannot take a follower's lease (another runs it) returns at the budget, without processing.
    An inline runtime (the test isolation of :mod:`wow_django.testing`) runs them in the calling thread.
    """
    declared = declared_followers()
    wanted = list(dict.fromkeys(names)) if names is not None else list(declared)
    unknown = [name for name in wanted if name not in declared]
    if unknown:
        raise ValueError(f"unknown follower(s) {', '.join(map(repr, unknown))} (declared: {', '.join(declared)})")
    runtime: Runtime | None = None
    if feed is None or store is None:
        runtime = get_runtime()
        feed = feed or runtime.stream_feed
        store = store or runtime.follower_store
    if runtime is not None and runtime.inline:
        runtime.catch_up_followers(wanted)
        return {name: state.position if (state := store.get(name)) is not None else 0 for name in wanted}
    stop = threading.Event()
    runners = [FollowerRunner(declared[name], feed, store) for name in wanted]
    threads = [threading.Thread(target=runner.run, args=(stop,), kwargs={"until_caught_up": True},
                                name=f"wow-follower-{runner.name}", daemon=True) for runner in runners]
    for thread in threads:
        thread.start()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    stop.set()
    for runner in runners:
        runner.wake()
    for thread in threads:
        thread.join()
    positions = {}
    for name in wanted:
        state = store.get(name)
        positions[name] = state.position if state is not None else 0
    return positions


def wait_caught_up(names: Iterable[str] | None = None, timeout: float = 10.0, *,
                   feed: StreamFeed | None = None, store: FollowerStore | None = None) -> bool:
    """Wait until the named followers (default: every declared one) have passed every stream stored when
    called, wherever they run; True when they have, False at ``timeout``. For tests and deploy scripts::

        assert wait_caught_up(timeout=5)

    An inline runtime (the test isolation of :mod:`wow_django.testing`) first runs them in the calling
    thread, where nothing else would.
    """
    wanted = list(names) if names is not None else list(declared_followers())
    runtime: Runtime | None = None
    if feed is None or store is None:
        runtime = get_runtime()
        feed = feed or runtime.stream_feed
        store = store or runtime.follower_store
    if runtime is not None and runtime.inline:
        runtime.catch_up_followers(wanted)
    head = feed.head()
    deadline = time.monotonic() + timeout
    backoff = 0.002
    while True:
        seen = progress.count
        states = [store.get(name) for name in wanted]
        if all(state is not None and state.position >= head for state in states):
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        progress.wait(seen, min(remaining, backoff))
        backoff = min(backoff * 2, 0.05)


__all__ = ["run_until_caught_up", "wait_caught_up"]

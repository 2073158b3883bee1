"""Command throughput through the gateway, and aggregate load time with and without a snapshot.

Part 1, in one run: ``--aggregates`` aggregates are created, then each gets
``--updates`` update commands (create-then-update), single-threaded:
- wow_django's gateway on the in-memory store and on ``mongomock://``
  (snapshots off, and every version snapshotted inline);
- pyeventsourcing's ``Application`` with its in-memory (POPO) persistence
  doing the same work (``save`` of a new aggregate, then
  ``repository.get`` + method + ``save`` per update), as the baseline.

Part 2: the time to load one aggregate whose history has N events, from
events only and from a snapshot taken at the last version.

    python bench/bench_gateway.py
    python bench/bench_gateway.py --aggregates 500 --updates 9 --history 1000 5000 10000

Needs the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:  # bench_gateway_pg.py configures its own (a PostgreSQL database) and imports this
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "wow_django"],
        DATABASES={},
        WOW={"CONTEXT_NAME": "bench"},
        USE_TZ=True,
    )
    django.setup()

from wow_django.application.gateway import CommandGateway  # noqa: E402
from wow_django.application.repository import snapshot_of  # noqa: E402
from wow_django.backends.memory.stores import InMemoryEventStore, InMemorySnapshotStore  # noqa: E402
from wow_django.backends.mongo.client import MongoConnection  # noqa: E402
from wow_django.backends.mongo.event_store import MongoEventStore  # noqa: E402
from wow_django.backends.mongo.schema import SchemaGuard  # noqa: E402
from wow_django.backends.mongo.snapshot_store import MongoSnapshotStore  # noqa: E402
from wow_django.domain import Aggregate, Command, Event, State, creates, handles, sourcing  # noqa: E402


class RegisterDog(Command, name="bench_register_dog"):
    name: str


class AddTrick(Command, name="bench_add_trick"):
    trick: str


class DogRegistered(Event, name="bench_dog_registered"):
    name: str


class TrickAdded(Event, name="bench_trick_added"):
    trick: str


class DogState(State):
    # Constant-size state, so load times reflect history length, not state size.
    name: str = ""
    trick_count: int = 0
    last_trick: str = ""

    @sourcing(DogRegistered)
    def _registered(self, event: DogRegistered) -> None:
        self.name = event.name

    @sourcing(TrickAdded)
    def _trick(self, event: TrickAdded) -> None:
        self.trick_count += 1
        self.last_trick = event.trick


class Dog(Aggregate, name="bench_dog", state=DogState):
    @creates(RegisterDog)
    def register(self, command: RegisterDog) -> DogRegistered:
        return DogRegistered(name=command.name)

    @handles(AddTrick)
    def add_trick(self, command: AddTrick) -> TrickAdded:
        return TrickAdded(trick=command.trick)


def memory_gateway(strategy: str) -> CommandGateway:
    return CommandGateway(InMemoryEventStore(), InMemorySnapshotStore(), context_name="bench",
                          snapshot_strategy=strategy)


def mongo_gateway(strategy: str) -> CommandGateway:
    connection = MongoConnection("mongomock://localhost/bench")
    guard = SchemaGuard("bench")
    return CommandGateway(MongoEventStore(connection, "bench", schema=guard),
                          MongoSnapshotStore(connection, "bench", schema=guard), context_name="bench",
                          snapshot_strategy=strategy)


def bench_ours(gateway: CommandGateway, aggregates: int, updates: int, settle=None) -> float:
    """Commands/s, the background snapshot work included: the dispatch lanes' (inline mode), and with
    ``settle`` (called at the end) whatever else must finish — the snapshot follower catching up."""
    started = time.perf_counter()
    for n in range(aggregates):
        dog = gateway.send(RegisterDog(name=f"dog {n}")).aggregate_id
        for i in range(updates):
            gateway.send(AddTrick(trick=f"trick {i}"), aggregate_id=dog)
    gateway.dispatcher.close()  # count the snapshot work done in the background too
    if settle is not None:
        settle()
    elapsed = time.perf_counter() - started
    return aggregates * (1 + updates) / elapsed


@functools.cache
def _dog_school():
    """pyeventsourcing's application class, defined once (its topics are registered per class)."""
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate as EsAggregate
    from eventsourcing.domain import event

    class EsDog(EsAggregate):
        @event("Registered")
        def __init__(self, name: str) -> None:
            self.name = name
            self.trick_count = 0
            self.last_trick = ""

        @event("TrickAdded")
        def add_trick(self, trick: str) -> None:
            self.trick_count += 1
            self.last_trick = trick

    class DogSchool(Application):
        def register(self, name: str):
            dog = EsDog(name)
            self.save(dog)
            return dog.id

        def add_trick(self, dog_id, trick: str) -> None:
            dog = self.repository.get(dog_id)
            dog.add_trick(trick)
            self.save(dog)

    return DogSchool


def bench_baseline(aggregates: int, updates: int, env: dict | None = None) -> float:
    """The same work on pyeventsourcing's ``Application`` (POPO persistence unless ``env`` says otherwise)."""
    app = _dog_school()(env=env or {"PERSISTENCE_MODULE": "eventsourcing.popo"})
    try:
        started = time.perf_counter()
        for n in range(aggregates):
            dog = app.register(f"dog {n}")
            for i in range(updates):
                app.add_trick(dog, f"trick {i}")
        return aggregates * (1 + updates) / (time.perf_counter() - started)
    finally:
        app.close()


def load_times(gateway: CommandGateway, history: int, repeat: int = 5) -> tuple[float, float]:
    """Median seconds to load a ``history``-event aggregate: (events only, from snapshot)."""
    dog = f"dog-{uuid.uuid4().hex[:8]}"
    gateway.send(RegisterDog(name="old dog"), aggregate_id=dog)
    for i in range(history - 1):
        gateway.send(AddTrick(trick=f"t{i}"), aggregate_id=dog)
    gateway.dispatcher.close()
    repository = gateway.repository
    aggregate = repository.load(Dog, dog, use_snapshot=False)
    assert aggregate.version == history
    repository.snapshot_store.save(snapshot_of(aggregate, "bench"))

    def median(use_snapshot: bool) -> float:
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            loaded = repository.load(Dog, dog, use_snapshot=use_snapshot)
            samples.append(time.perf_counter() - started)
            assert loaded.version == history
        return statistics.median(samples)

    return median(False), median(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=300)
    parser.add_argument("--updates", type=int, default=9)
    parser.add_argument("--mongomock-aggregates", type=int, default=60,
                        help="aggregates for the embedded engine (it scans on every write)")
    parser.add_argument("--history", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--mongomock-history", type=int, nargs="+", default=[250, 500, 1000])
    args = parser.parse_args()
    a, u, m = args.aggregates, args.updates, args.mongomock_aggregates

    print(f"# Part 1: create then {u} updates per aggregate, single thread; Python {sys.version.split()[0]}")
    baseline = bench_baseline(a, u)
    rows = [
        ("pyeventsourcing Application, POPO (baseline)", a, baseline),
        ("wow_django gateway, in-memory, no snapshots", a, bench_ours(memory_gateway("none"), a, u)),
        ("wow_django gateway, in-memory, snapshot every version", a, bench_ours(memory_gateway("all"), a, u)),
        ("wow_django gateway, mongomock://, no snapshots", m, bench_ours(mongo_gateway("none"), m, u)),
        ("wow_django gateway, mongomock://, snapshot every version", m, bench_ours(mongo_gateway("all"), m, u)),
    ]
    print(f"{'':58} {'aggs':>5} {'commands/s':>12} {'x base':>7}")
    for name, count, rate in rows:
        print(f"{name:58} {count:5} {rate:12,.0f} {rate / baseline:7.2f}")

    print("\n# Part 2: load one aggregate with N events (median of 5)")
    print(f"{'store':14} {'N events':>9} {'events only':>14} {'from snapshot':>14}")
    for label, factory, sizes in (("in-memory", memory_gateway, args.history),
                                  ("mongomock://", mongo_gateway, args.mongomock_history)):
        for size in sizes:
            # Built with a snapshot per version so that building stays linear.
            full, snap = load_times(factory("all"), size)
            print(f"{label:14} {size:9} {full * 1000:12.2f}ms {snap * 1000:12.3f}ms")


if __name__ == "__main__":
    main()

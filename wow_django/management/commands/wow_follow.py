"""Run declared followers in this process: ``manage.py wow_follow [NAME ...] [--until-caught-up]``."""

from __future__ import annotations

import signal
import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from wow_django.application.followers import FollowerRunner, declared_followers
from wow_django.application.runtime import get_runtime


class Command(BaseCommand):
    help = (
        "Run followers (projections, event processors and @follower handlers), one thread each, from their "
        "checkpoints. Two instances of one follower never both process: the second waits for the lease. "
        "SIGTERM or SIGINT ends the current batches after the stream being handled, checkpoints them, releases "
        "the leases and stops."
    )

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", metavar="NAME", help="Followers to run (default: every declared one).")
        parser.add_argument("--until-caught-up", action="store_true",
                            help="Stop each follower once a read finds nothing more (or it is paused or stopped "
                                 "on a poison event).")

    def handle(self, *args, names=(), until_caught_up=False, **options):
        try:
            declared = declared_followers()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        known = list(declared)
        if not known:
            raise CommandError("no follower is declared: declare a @projection, an @event_processor or a "
                               "@follower in an installed app's aggregates, projections or followers module")
        unknown = [name for name in names if name not in declared]
        if unknown:
            raise CommandError(f"NAME: unknown follower(s) {', '.join(map(repr, unknown))} "
                               f"(declared: {', '.join(known)})")
        runtime = get_runtime()
        try:
            runners = [FollowerRunner(declared[name], runtime.stream_feed, runtime.follower_store)
                       for name in (dict.fromkeys(names) or known)]
        except (ImproperlyConfigured, NotImplementedError) as exc:
            raise CommandError(str(exc)) from exc
        stop = threading.Event()

        def on_signal(signum, frame):
            self.stdout.write(f"{signal.Signals(signum).name}: finishing the current batches after the stream "
                              "being handled, releasing the leases, then stopping.")
            stop.set()
            for runner in runners:
                runner.interrupt()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, on_signal)
        threads = [threading.Thread(target=runner.run, args=(stop,), kwargs={"until_caught_up": until_caught_up},
                                    name=f"wow-follower-{runner.name}") for runner in runners]
        self.stdout.write(f"Following {', '.join(r.name for r in runners)} as {runners[0].owner}.")
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)  # short joins: the main thread stays free to take signals
        finally:
            stop.set()
            for runner in runners:
                runner.wake()
            for thread in threads:
                thread.join()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        for runner in runners:
            state = runtime.follower_store.get(runner.name)
            where = f"position {state.position}" if state else "no state"
            self.stdout.write(self.style.SUCCESS(f"Stopped {runner.name} at {where}."))
        watching = runtime.stream_feed.change_status()
        if watching:
            self.stdout.write(f"Other processes' appends: {watching}.")

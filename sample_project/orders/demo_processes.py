"""The processes ``wow_demo --serve`` runs besides the web server, and how to run each one separately.

What the demo needs depends on what the settings found on this machine
(``sample_project.settings``):

- Celery **not eager** (a broker is reachable): a worker for the default
  queue (commands sent with ``SENT``, Celery-mode snapshots) and one serial
  worker for the bus's rollup queue. Eager: none, every task runs inline.
- Followers not run as threads (``WOW_FOLLOWERS_RUN=command``): one
  ``manage.py wow_follow`` for every declared follower.
- A bus transport that **crosses processes** (``amqp://``, ``redis://``): one
  ``manage.py wow_consume <consumer-id>`` per declared consumer. On
  ``memory://`` the consumers must share the web server's process: they run
  there in threads (:func:`consume_in_threads`).

:class:`DemoProcesses` starts them as children of the demo's process, in
sessions of their own (a Ctrl-C in the terminal reaches the demo, which then
stops them in order: SIGTERM, a grace period, SIGKILL). On Linux each child
also gets SIGTERM from the kernel should the demo die without cleaning up
(``PR_SET_PDEATHSIG``), so none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from kombu import Connection
from kombu.exceptions import OperationalError

from wow_django.bus import ConsumerWorker, get_bus, run_in_thread
from wow_django.bus.consumer import consumers
from wow_django.bus.transport import BusTransport
from wow_django.conf import wow_settings
from wow_django.exceptions import RecoverableStoreError, TransportUnavailable

MANAGE_PY = Path(__file__).resolve().parents[2] / "manage.py"
DEFAULT_QUEUE = "celery"  # Celery's task_default_queue


@dataclass(frozen=True)
class Part:
    """One process of the demo: what it is and how the demo starts it."""

    name: str
    argv: tuple[str, ...]


def bus_crosses_processes() -> bool:
    return wow_settings.BUS_TRANSPORT_URL.split("://", 1)[0] != "memory"


def celery_is_eager() -> bool:
    return bool(getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False))


def celery_parts() -> list[Part]:
    """The Celery workers the demo runs when tasks go through the broker (none when Celery is eager)."""
    if celery_is_eager():
        return []
    celery = (sys.executable, "-m", "celery", "-A", "sample_project", "--quiet")  # no banners
    default_queue = getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", DEFAULT_QUEUE)
    rollup_queue = wow_settings.BUS_ROLLUP_QUEUE
    # A thread pool and the solo pool: the workers have no pool processes of their own to clean up.
    return [
        Part("celery worker", (*celery, "worker", "-Q", default_queue, "-P", "threads", "-c", "4",
                               "-n", "demo-default@%h", "-l", "warning")),
        Part("celery rollup worker", (*celery, "worker", "-Q", rollup_queue, "-P", "solo", "-c", "1",
                                      "-n", "demo-rollup@%h", "-l", "warning")),
    ]


def consumer_parts() -> list[Part]:
    """One ``wow_consume`` per declared consumer when the bus crosses processes (none on memory://)."""
    if not bus_crosses_processes():
        return []
    return [Part(f"consumer {consumer_id}", (sys.executable, str(MANAGE_PY), "wow_consume", consumer_id))
            for consumer_id in consumers().consumer_ids()]


def follower_parts() -> list[Part]:
    """A ``wow_follow`` process when the followers do not run as threads of the web and worker processes."""
    if wow_settings.FOLLOWERS_RUN == "threads":
        return []
    return [Part("followers", (sys.executable, str(MANAGE_PY), "wow_follow"))]


def clean(write, style) -> bool:
    """Delete what the demo keeps on the brokers it shares with the machine's other projects (its names:
    ``SAMPLE_BROKER_NAMESPACE``): the bus's exchange and consumer queues, the Celery queues, every Redis key
    under the demo's prefix. Says what it deleted; False when a broker did not answer."""
    done = True
    bus = get_bus()
    consumer_ids = set(consumers().consumer_ids())
    try:
        consumer_ids |= {row["consumerId"] for row in bus.topic_consumers()}
    except (DatabaseError, ImproperlyConfigured, RecoverableStoreError):  # never migrated, or locked
        pass
    # Every broker the demo may have used for the bus: which one the probes pick depends on what answered
    # when it ran, not on what answers now.
    configured = wow_settings.BUS_TRANSPORT_URL
    candidates = dict.fromkeys(url for url in (configured, settings.SAMPLE_AMQP_URL,
                                               settings.SAMPLE_REDIS_BUS_URL) if url and not url.startswith("memory"))
    for url in candidates:
        shown = _without_password(url)
        try:
            names = BusTransport(url, wow_settings.BUS_EXCHANGE, timeout=3).delete_entities(consumer_ids)
            write(f"The bus ({shown}): deleted {', '.join(names) or 'nothing (nothing was there)'}")
        except TransportUnavailable as exc:
            if url == configured:
                write(style.ERROR(f"The bus ({shown}): {exc}"))
                done = False
            else:
                write(style.WARNING(f"The bus ({shown}) does not answer: if the demo ran on it, run this again "
                                    "once it does"))
    broker = settings.CELERY_BROKER_URL
    queues = [getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", DEFAULT_QUEUE), wow_settings.BUS_ROLLUP_QUEUE]
    try:
        with Connection(broker, connect_timeout=3,
                        transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})) as connection:
            connection.ensure_connection(max_retries=0)
            channel = connection.channel()
            for name in queues:
                with contextlib.suppress(*connection.channel_errors):
                    channel.queue_delete(name)
            write(f"Celery ({_without_password(broker)}): deleted the queues {', '.join(queues)} where they were")
    except (OSError, OperationalError) as exc:
        write(style.WARNING(f"Celery's broker ({_without_password(broker)}) does not answer ({exc}): its queues "
                            "stay"))
        done = False
    prefix = getattr(settings, "CELERY_REDIS_KEY_PREFIX", "")
    urls = {url for url in (broker, getattr(settings, "CELERY_RESULT_BACKEND", "")) if url.startswith("redis://")}
    for url in sorted(urls):
        if not prefix:
            break
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=3)
            keys = list(client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])
            client.close()
            write(f"Redis ({_without_password(url)}): deleted {len(keys)} key(s) under {prefix!r}")
        except redis.RedisError as exc:
            write(style.WARNING(f"Redis ({_without_password(url)}) does not answer ({exc}): its keys stay"))
            done = False
    return done


def _glob_escape(text: str) -> str:
    """``text`` matched literally in a Redis SCAN pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def separately() -> list[str]:
    """Every process of a deployment of the sample, as one runs it by hand (production-style)."""
    default_queue = getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", DEFAULT_QUEUE)
    return [
        "gunicorn sample_project.wsgi   (or: python manage.py runserver)",
        f"celery -A sample_project worker -Q {default_queue}",
        f"celery -A sample_project worker -Q {wow_settings.BUS_ROLLUP_QUEUE} -c 1",
        "celery -A sample_project beat   (the bus relay, every 30 s)",
        "python manage.py wow_follow   (projections, processors, the relay: with WOW_FOLLOWERS_RUN=command)",
        *(f"python manage.py wow_consume {consumer_id}" for consumer_id in consumers().consumer_ids()),
    ]


def handed_down_environment() -> dict[str, str]:
    """What this process decided (Celery eager or not, the bus transport), for the processes it starts.

    Every process that imports the sample's settings would otherwise probe on its own; these
    variables make them agree with this one (and skip the probes).
    """
    return {
        "CELERY_EAGER": "1" if celery_is_eager() else "0",
        "WOW_BUS_TRANSPORT_URL": wow_settings.BUS_TRANSPORT_URL,
        "WOW_FOLLOWERS_RUN": wow_settings.FOLLOWERS_RUN,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "sample_project.settings"),
    }


def _parent_death_signal():
    """A function asking Linux to SIGTERM the calling process when its parent dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def die_with_parent() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return die_with_parent


def end_with_parent() -> None:
    """Let this process receive SIGTERM when its parent dies (Linux), e.g. the autoreloader's serving child,
    which Django starts without that: killed with SIGKILL, the demo would otherwise leave it serving."""
    parent = os.getppid()
    die_with_parent = _parent_death_signal()
    if die_with_parent is not None:
        die_with_parent()
        if os.getppid() != parent:  # the parent died before the request: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)


class DemoProcesses:
    """Children of the demo's process, started together and stopped together."""

    def __init__(self, parts: list[Part], *, stdout=None, grace_s: float = 15.0):
        self.parts = parts
        self.stdout = stdout
        self.grace_s = grace_s
        self.running: list[tuple[Part, subprocess.Popen]] = []

    def start(self) -> None:
        env = {**os.environ, **handed_down_environment(), "PYTHONUNBUFFERED": "1"}
        preexec = _parent_death_signal()
        for part in self.parts:
            process = subprocess.Popen(
                part.argv, cwd=MANAGE_PY.parent, env=env, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=preexec,  # noqa: PLW1509 - only prctl, prepared before
            )
            self.running.append((part, process))
            self._write(f"  started {part.name} (pid {process.pid})")

    def stop(self) -> None:
        """SIGTERM every child (each finishes what it is doing), then SIGKILL what is left after the grace period."""
        for _, process in self.running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for part, process in self.running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self._write(f"  killed {part.name} (pid {process.pid}): it did not stop within {self.grace_s:g}s")
            else:
                self._write(f"  stopped {part.name} (pid {process.pid})")
        self.running.clear()

    def _write(self, line: str) -> None:
        if self.stdout is not None:
            self.stdout.write(line)


def consume_in_threads() -> list[ConsumerWorker]:
    """Run every declared consumer in a daemon thread of this process (the bus on memory://)."""
    bus = get_bus()
    workers = [ConsumerWorker(consumer_id, bus=bus) for consumer_id in consumers().consumer_ids()]
    for worker in workers:
        run_in_thread(worker)
    return workers

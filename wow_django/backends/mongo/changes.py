"""One change stream per process that wakes this process's followers when *any* process appends.

On a MongoDB replica set (or sharded cluster) the followers of a process need
not poll for other processes' appends: a :class:`ChangeWatcher` watches the
event stream database for inserts into ``*_event_stream`` collections and
notifies the feed's :class:`~wow_django.persistence.followers.AppendNotifier`,
which every follower of the process waits on. One watcher serves every
follower of the process (it is a part of the feed, which the runtime builds
once), not one stream per follower.

The server does the filtering (:func:`change_pipeline`): a ``$match`` passes only
inserts of this context's streams into ``*_event_stream`` collections (and
``invalidate``), and a ``$project`` keeps only what a wake-up needs (the resume
token ``_id``, ``operationType``, ``ns.coll``). So no process receives the
database's other writes, nor any stream's documents: a 16 MB stream is never
shipped to every process, and its change event cannot outgrow the 16 MB limit
(``BSONObjectTooLarge``, which no resume can get past).

The followers' checkpoint stays their **position** (what makes catch-up,
rewind by position or time and gap safety work the same on every backend); the
change stream only tells them *when* to read. Its **resume token** is kept by
the watcher, advanced on every batch — empty ones too, as pymongo's
``ChangeStream.resume_token`` follows the server's ``postBatchResumeToken`` —
and used to resume after a transient error, so no wake-up is lost while the
watcher reconnects (and a follower's backoff read covers the window anyway).

Only a resumable error (a network error, a lost cursor, or a server error
labelled ``ResumableChangeStreamError``) is retried from the token. When the
stream cannot go on — an ``invalidate`` event (the database was dropped or
renamed), the resume point has left the oplog (error 286,
``ChangeStreamHistoryLost``), or any other non-resumable error (which resuming
from the same token would only meet again) — the watcher reports it (a warning
in the log and in :attr:`ChangeWatcher.status`, shown by ``manage.py
wow_followers``), wakes the followers so they catch up by reading positions
(the polling catch-up), and opens a new stream from the present (no resume
token). A fresh stream that fails again before delivering anything is retried
with backoff, and after :attr:`ChangeWatcher.max_fresh_failures` such failures
in a row the watcher stops (state ``unavailable``): the followers poll. Where
change streams are not available at all — a standalone server (error 40573),
the embedded ``mongomock://`` engine (no ``watch``) — it says so once and the
followers poll with backoff (``FOLLOWER_MAX_WAIT_S``).

The embedded engine has no change streams: the tests check the pipeline's exact
stages and drive the error handling through a fault-injecting fake ``watch()``;
only a real replica set proves that the server applies the filter and that a
large stream no longer breaks the stream.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pymongo import errors as pymongo_errors

from wow_django.persistence.followers import AppendNotifier

logger = logging.getLogger(__name__)

#: The server's codes for a change stream that cannot resume, and for a deployment without change streams.
HISTORY_LOST = 286
NOT_A_REPLICA_SET = 40573
UNSUPPORTED = {NOT_A_REPLICA_SET, 20, 115}  # 20: IllegalOperation, 115: CommandNotSupported

EVENT_STREAM_SUFFIX = "_event_stream"


def change_pipeline(context_name: str) -> list[dict]:
    """The change stream's stages: inserts of ``context_name``'s streams into ``*_event_stream`` collections
    (and ``invalidate``, which ends a stream), each reduced to what a wake-up needs. ``_id`` (the resume
    token) must stay: the server refuses to go on with a change whose ``_id`` was removed."""
    return [
        {"$match": {"$or": [
            {"operationType": "insert", "ns.coll": {"$regex": f".{re.escape(EVENT_STREAM_SUFFIX)}$"},
             "fullDocument.contextName": context_name},
            {"operationType": "invalidate"},
        ]}},
        {"$project": {"operationType": 1, "ns.coll": 1}},
    ]


def resumable(exc: BaseException) -> bool:
    """Whether the change stream can go on from its token after ``exc`` (the drivers' rule)."""
    if isinstance(exc, pymongo_errors.ConnectionFailure | pymongo_errors.CursorNotFound):
        return True
    if isinstance(exc, pymongo_errors.OperationFailure):
        return exc.has_error_label("ResumableChangeStreamError")
    return False


@dataclass(frozen=True)
class WatchStatus:
    """What the watcher is doing, for ``wow_followers`` and the console."""

    state: str = "starting"  # starting | watching | reconnecting | unavailable | stopped
    detail: str = ""
    wakeups: int = 0
    restarts: int = 0
    #: Invalidations and lost histories: each fell back to a polling catch-up.
    fallbacks: tuple[str, ...] = field(default_factory=tuple)
    since: datetime = field(default_factory=lambda: datetime.now(UTC))

    def describe(self) -> str:
        text = f"change stream {self.state}"
        if self.detail:
            text += f" ({self.detail})"
        if self.fallbacks:
            text += f"; {len(self.fallbacks)} fallback(s) to a polling catch-up, last: {self.fallbacks[-1]}"
        return text


class ChangeWatcher:
    """Watches ``database`` for streams of ``context_name`` appended and notifies ``notifier``; a daemon
    thread, started once."""

    #: Non-resumable failures in a row, each followed by a fresh stream that delivered no change before the
    #: next, after which the watcher gives up and the followers poll.
    max_fresh_failures = 5

    def __init__(self, database, notifier: AppendNotifier, *, context_name: str, max_await_ms: int = 1000,
                 retry_s: float = 1.0, max_retry_s: float = 30.0,
                 sleep: Callable[[threading.Event, float], bool] | None = None):
        self.database = database
        self.notifier = notifier
        self.pipeline = change_pipeline(context_name)
        self.max_await_ms = max_await_ms
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.resume_token = None
        self.status = WatchStatus()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream = None
        self._delivered = False
        self._sleep = sleep or (lambda event, seconds: event.wait(seconds))

    # --- life cycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watching thread (idempotent)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self.run, name="wow-change-watcher", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:  # pragma: no cover - closing a broken cursor
                logger.debug("closing the change stream failed", exc_info=True)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._set(state="stopped", detail="")

    def _set(self, **changes) -> None:
        with self._lock:
            if "state" in changes and changes["state"] != self.status.state:
                changes.setdefault("since", datetime.now(UTC))
            self.status = replace(self.status, **changes)

    # --- the loop --------------------------------------------------------------------------------------

    def run(self) -> None:
        """Watch until closed: reconnect with backoff on errors, start afresh after a fallback."""
        backoff = self.retry_s
        failures = 0  # non-resumable failures in a row, no change delivered in between
        while not self._stop.is_set():
            self._delivered = False
            try:
                self._watch_once()
                backoff, failures = self.retry_s, 0
            except _Unavailable as exc:
                self._set(state="unavailable", detail=str(exc))
                logger.info("change streams unavailable (%s): followers poll with backoff", exc)
                return
            except pymongo_errors.PyMongoError as exc:
                if isinstance(exc, pymongo_errors.OperationFailure) and exc.code in UNSUPPORTED:
                    self._set(state="unavailable", detail=f"the server refused a change stream: {exc}")
                    logger.info("change streams unavailable (%s): followers poll with backoff", exc)
                    return
                if self._delivered:
                    backoff, failures = self.retry_s, 0
                if resumable(exc):
                    self._retry(exc, backoff)
                    backoff = min(backoff * 2, self.max_retry_s)
                    continue
                # Resuming from the same token would meet the same error: start afresh from the present.
                if isinstance(exc, pymongo_errors.OperationFailure) and exc.code == HISTORY_LOST:
                    self._fallback(f"the resume point left the oplog (error {HISTORY_LOST})")
                else:
                    code = getattr(exc, "code", None)
                    self._fallback(f"non-resumable error {type(exc).__name__}{f' {code}' if code else ''}: {exc}")
                failures += 1
                if failures >= self.max_fresh_failures:
                    self._set(state="unavailable", detail=f"{failures} change streams in a row failed without "
                                                          f"delivering a change, last: {exc}")
                    logger.error("change streams keep failing (%s): followers poll with backoff", exc)
                    return
                if failures > 1:  # the first fresh start is at once; a failing server is not hammered
                    self._sleep(self._stop, backoff)
                    backoff = min(backoff * 2, self.max_retry_s)
            except Exception as exc:  # a bug or an unexpected driver error: keep the followers polling
                logger.exception("the change watcher failed; followers poll with backoff")
                self._set(state="unavailable", detail=f"failed: {exc!r}")
                return

    def _retry(self, exc: BaseException, backoff: float) -> None:
        self._set(state="reconnecting", detail=f"{type(exc).__name__}: {exc}; retrying in {backoff:.1f}s",
                  restarts=self.status.restarts + 1)
        logger.warning("change stream interrupted (%s); resuming in %.1fs", exc, backoff)
        self.notifier.notify()  # the followers read once: whatever came meanwhile is caught up by position
        self._sleep(self._stop, backoff)

    def _fallback(self, why: str) -> None:
        """The stream cannot resume: report, wake the followers for a catch-up by position, start afresh."""
        logger.warning("change stream lost: %s; followers catch up by position and a new stream starts", why)
        self.resume_token = None
        self._set(fallbacks=(*self.status.fallbacks, f"{datetime.now(UTC).isoformat(timespec='seconds')} {why}"),
                  restarts=self.status.restarts + 1)
        self.notifier.notify()

    def _open(self):
        watch = getattr(self.database, "watch", None)
        if watch is None:
            raise _Unavailable("this engine has no change streams")
        options = {"max_await_time_ms": self.max_await_ms}
        if self.resume_token is not None:
            options["resume_after"] = self.resume_token
        try:
            return watch(self.pipeline, **options)
        except NotImplementedError as exc:  # mongomock
            raise _Unavailable("the embedded engine has no change streams") from exc

    def _watch_once(self) -> None:
        stream = self._stream = self._open()
        try:
            self._set(state="watching", detail="")
            while not self._stop.is_set():
                change = stream.try_next()
                token = stream.resume_token
                if token is not None:
                    self.resume_token = token  # advanced on empty batches too (postBatchResumeToken)
                if change is None:
                    if not stream.alive:
                        return  # the server closed the cursor: reopen from the token
                    continue
                self._delivered = True
                if change.get("operationType") == "invalidate":
                    self._fallback("the stream was invalidated (the database was dropped or renamed)")
                    return
                collection = (change.get("ns") or {}).get("coll", "")
                if collection.endswith(EVENT_STREAM_SUFFIX):
                    self._set(wakeups=self.status.wakeups + 1)
                    self.notifier.notify()
        finally:
            self._stream = None
            try:
                stream.close()
            except Exception:  # pragma: no cover - closing a broken cursor
                logger.debug("closing the change stream failed", exc_info=True)


class _Unavailable(Exception):
    """Change streams cannot be had here at all."""


__all__ = ["ChangeWatcher", "HISTORY_LOST", "WatchStatus", "change_pipeline", "resumable"]

"""One change stream per process that wakes this process's followers when *any* process appends.

On a MongoDB replica set (or sharded cluster) the followers of a process need
not poll for other processes' appends: a :class:`ChangeWatcher` watches the
event stream database for inserts into ``*_event_stream`` collections and
notifies the feed's :class:`~wow_django.persistence.followers.AppendNotifier`,
which every follower of the process waits on. One watcher serves every
follower of the process (it is a part of the feed, which the runtime builds
once), not one stream per follower.

The followers' checkpoint stays their **position** (what makes catch-up,
rewind by position or time and gap safety work the same on every backend); the
change stream only tells them *when* to read. Its **resume token** is kept by
the watcher, advanced on every batch — empty ones too, as pymongo's
``ChangeStream.resume_token`` follows the server's ``postBatchResumeToken`` —
and used to resume after a transient error, so no wake-up is lost while the
watcher reconnects (and a follower's backoff read covers the window anyway).

When the stream cannot go on — an ``invalidate`` event (the database was
dropped or renamed), or the resume point has left the oplog (error 286,
``ChangeStreamHistoryLost``) — the watcher reports it (a warning in the log and
in :attr:`ChangeWatcher.status`, shown by ``manage.py wow_followers``), wakes the
followers so they catch up by reading positions (the polling catch-up), and
opens a new stream from the present. Where change streams are not available at
all — a standalone server (error 40573), the embedded ``mongomock://`` engine
(no ``watch``) — it says so once and the followers poll with backoff
(``FOLLOWER_MAX_WAIT_S``).
"""

from __future__ import annotations

import logging
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

#: The change stream's filter: inserts into event stream collections.
PIPELINE = [{"$match": {"operationType": {"$in": ["insert", "invalidate"]}}}]


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
    """Watches ``database`` for appended streams and notifies ``notifier``; a daemon thread, started once."""

    def __init__(self, database, notifier: AppendNotifier, *, max_await_ms: int = 1000,
                 retry_s: float = 1.0, max_retry_s: float = 30.0,
                 sleep: Callable[[threading.Event, float], bool] | None = None):
        self.database = database
        self.notifier = notifier
        self.max_await_ms = max_await_ms
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.resume_token = None
        self.status = WatchStatus()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream = None
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
        while not self._stop.is_set():
            try:
                self._watch_once()
                backoff = self.retry_s
            except _Unavailable as exc:
                self._set(state="unavailable", detail=str(exc))
                logger.info("change streams unavailable (%s): followers poll with backoff", exc)
                return
            except pymongo_errors.OperationFailure as exc:
                if exc.code == HISTORY_LOST:
                    self._fallback(f"the resume point left the oplog (error {HISTORY_LOST})")
                    continue
                if exc.code in UNSUPPORTED:
                    self._set(state="unavailable", detail=f"the server refused a change stream: {exc}")
                    logger.info("change streams unavailable (%s): followers poll with backoff", exc)
                    return
                self._retry(exc, backoff)
                backoff = min(backoff * 2, self.max_retry_s)
            except pymongo_errors.PyMongoError as exc:
                self._retry(exc, backoff)
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
            return watch(PIPELINE, **options)
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
                if change.get("operationType") == "invalidate":
                    self._fallback("the stream was invalidated (the database was dropped or renamed)")
                    return
                collection = (change.get("ns") or {}).get("coll", "")
                if collection.endswith("_event_stream"):
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


__all__ = ["ChangeWatcher", "HISTORY_LOST", "WatchStatus"]

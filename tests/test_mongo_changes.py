"""The change watcher: one change stream per process waking the followers on MongoDB.

The embedded engine has no change streams: the pipeline is checked stage by stage (and its stages run by
the embedded engine's ``aggregate`` over change-event-shaped documents), and the error paths run against a
fault-injecting fake ``watch()`` handing out scripted streams. Only a real replica set
(``WOW_TEST_MONGO_URI``) proves that the server applies the filter and what a large stream does.
"""

from __future__ import annotations

import threading
import time
import unittest
import uuid

import pytest
from pymongo import errors as pymongo_errors

from wow_django.application.followers import Follower, FollowerRunner
from wow_django.backends.mongo.changes import HISTORY_LOST, ChangeWatcher, change_pipeline
from wow_django.backends.mongo.event_store import MongoEventStore
from wow_django.backends.mongo.followers import MongoFollowerStore, MongoStreamFeed
from wow_django.persistence.followers import AppendNotifier
from wow_django.persistence.records import AggregateId
from wow_django.testing import make_stream
from wow_django.testing.mongo import EmbeddedMongoDatabase, RealMongoDatabase, requires_real_mongo

from .support import wait_for


def insert(collection: str = "order_event_stream") -> dict:
    return {"operationType": "insert", "ns": {"db": "d", "coll": collection}}


class FakeStream:
    """Steps: a change dict, None (an empty batch), or an exception raised by ``try_next``; then idle."""

    def __init__(self, steps, tokens):
        self.steps = list(steps)
        self.tokens = list(tokens)
        self.resume_token = None
        self.alive = True
        self.closed = threading.Event()

    def try_next(self):
        if not self.steps:
            self.closed.wait(0.01)  # the server's await: nothing new
            return None
        step = self.steps.pop(0)
        token = self.tokens.pop(0) if self.tokens else None
        if isinstance(step, BaseException):
            raise step
        self.resume_token = token
        return step

    def close(self):
        self.alive = False
        self.closed.set()


class FakeDatabase:
    """``watch`` hands out the scripted streams in turn and records each call's options."""

    def __init__(self, *streams, refuse: BaseException | None = None):
        self.streams = list(streams)
        self.calls: list[dict] = []
        self.pipelines: list[list] = []
        self.refuse = refuse

    def watch(self, pipeline, **options):
        self.calls.append(options)
        self.pipelines.append(pipeline)
        if self.refuse is not None:
            raise self.refuse
        if self.streams:
            return self.streams.pop(0)
        return FakeStream([], [])


def watcher_on(database) -> tuple[ChangeWatcher, AppendNotifier]:
    notifier = AppendNotifier()
    watcher = ChangeWatcher(database, notifier, context_name="ctx", retry_s=0.01,
                            sleep=lambda event, seconds: event.wait(0))
    return watcher, notifier


@pytest.fixture
def running():
    started: list[ChangeWatcher] = []

    def start(database):
        watcher, notifier = watcher_on(database)
        watcher.start()
        started.append(watcher)
        return watcher, notifier

    yield start
    for watcher in started:
        watcher.close()


def test_appends_wake_the_followers_and_the_token_follows_every_batch(running):
    stream = FakeStream([insert(), None, insert("order_snapshot"), insert("customer_event_stream"), None],
                        ["t1", "t2", "t3", "t4", "t5"])
    database = FakeDatabase(stream)
    watcher, notifier = running(database)
    wait_for(lambda: watcher.resume_token == "t5", timeout=5, what="the whole script is read")
    assert notifier.count == 2  # two event stream inserts; the snapshot insert wakes nobody
    assert watcher.status.state == "watching" and watcher.status.wakeups == 2
    assert database.calls == [{"max_await_time_ms": 1000}]  # one stream for the process, opened once


def test_a_transient_error_resumes_from_the_last_token(running):
    first = FakeStream([insert(), None, pymongo_errors.AutoReconnect("primary stepped down")], ["t1", "t2", None])
    second = FakeStream([insert()], ["t3"])
    database = FakeDatabase(first, second)
    watcher, notifier = running(database)
    wait_for(lambda: watcher.resume_token == "t3", timeout=5, what="the second stream is read")
    assert database.calls[1] == {"max_await_time_ms": 1000, "resume_after": "t2"}  # the empty batch's token
    assert watcher.status.restarts == 1 and watcher.status.fallbacks == ()
    assert notifier.count >= 3  # two inserts, and one catch-up read while reconnecting


def test_lost_history_falls_back_to_a_catch_up_and_starts_afresh(running):
    first = FakeStream([insert(), pymongo_errors.OperationFailure("history lost", code=HISTORY_LOST)], ["t1", None])
    database = FakeDatabase(first, FakeStream([insert()], ["fresh"]))
    watcher, notifier = running(database)
    wait_for(lambda: watcher.resume_token == "fresh", timeout=5, what="a new stream")
    assert "resume_after" not in database.calls[1]  # from the present: the old point is gone
    assert len(watcher.status.fallbacks) == 1 and "error 286" in watcher.status.fallbacks[0]
    assert "1 fallback(s) to a polling catch-up" in watcher.status.describe()
    assert notifier.count >= 3


def test_an_invalidate_event_is_reported_and_a_new_stream_opened(running):
    first = FakeStream([insert(), {"operationType": "invalidate"}], ["t1", "t2"])
    database = FakeDatabase(first, FakeStream([None], ["t9"]))
    watcher, _ = running(database)
    wait_for(lambda: watcher.resume_token == "t9", timeout=5, what="a new stream")
    assert "resume_after" not in database.calls[1]
    assert "invalidated" in watcher.status.fallbacks[0]


def test_a_standalone_server_leaves_the_followers_polling(running):
    database = FakeDatabase(refuse=pymongo_errors.OperationFailure(
        "The $changeStream stage is only supported on replica sets", code=40573))
    watcher, notifier = running(database)
    wait_for(lambda: watcher.status.state == "unavailable", timeout=5, what="the watcher gives up")
    time.sleep(0.05)
    assert len(database.calls) == 1 and notifier.count == 0  # asked once, no retry loop
    assert "replica sets" in watcher.status.describe()


def test_an_unexpected_error_stops_watching_without_killing_the_process(running):
    database = FakeDatabase(FakeStream([ValueError("driver bug")], [None]))
    watcher, _ = running(database)
    wait_for(lambda: watcher.status.state == "unavailable", timeout=5, what="the watcher gives up")
    assert "driver bug" in watcher.status.detail


def test_the_stream_carries_only_this_contexts_stream_inserts_reduced_to_a_wake_up(running):
    """The server filters and trims (issue 22, item 8): no other write of the database, and no stream's
    documents, reach the process — a 16 MB stream cannot make a change event too large to ship."""
    assert change_pipeline("ctx") == [
        {"$match": {"$or": [
            {"operationType": "insert", "ns.coll": {"$regex": r"._event_stream$"}, "fullDocument.contextName": "ctx"},
            {"operationType": "invalidate"},
        ]}},
        {"$project": {"operationType": 1, "ns.coll": 1}},
    ]
    database = FakeDatabase()
    watcher, _ = running(database)
    wait_for(lambda: database.pipelines, timeout=5, what="the stream is opened")
    assert database.pipelines == [change_pipeline("ctx")]


def test_the_pipeline_run_over_change_events_passes_what_wakes_and_nothing_else():
    """The stages as the embedded engine's ``aggregate`` runs them over change-event-shaped documents (the
    server runs them on its change events; only a replica set proves that)."""
    import mongomock

    body = {"body": [{"body": {"blob": "x" * 1000}}]}
    changes = [
        {"_id": {"_data": "1"}, "operationType": "insert", "ns": {"db": "d", "coll": "order_event_stream"},
         "documentKey": {"_id": "s1"}, "fullDocument": {"_id": "s1", "contextName": "ctx", **body}},
        {"_id": {"_data": "2"}, "operationType": "insert", "ns": {"db": "d", "coll": "order_event_stream"},
         "fullDocument": {"_id": "s2", "contextName": "other", **body}},
        {"_id": {"_data": "3"}, "operationType": "insert", "ns": {"db": "d", "coll": "order_snapshot"},
         "fullDocument": {"_id": "o1", "contextName": "ctx"}},
        {"_id": {"_data": "4"}, "operationType": "update", "ns": {"db": "d", "coll": "order_event_stream"},
         "fullDocument": {"_id": "s1", "contextName": "ctx"}},
        {"_id": {"_data": "5"}, "operationType": "insert", "ns": {"db": "d", "coll": "_event_stream"},
         "fullDocument": {"_id": "s3", "contextName": "ctx"}},
        {"_id": {"_data": "6"}, "operationType": "insert", "ns": {"db": "d", "coll": "order_event_stream_old"},
         "fullDocument": {"_id": "s4", "contextName": "ctx"}},
        {"_id": {"_data": "7"}, "operationType": "invalidate"},
    ]
    collection = mongomock.MongoClient().db.changes
    collection.insert_many(changes)
    passed = list(collection.aggregate(change_pipeline("ctx")))
    assert passed == [
        {"_id": {"_data": "1"}, "operationType": "insert", "ns": {"coll": "order_event_stream"}},
        {"_id": {"_data": "7"}, "operationType": "invalidate"},
    ]


def test_a_non_resumable_error_starts_a_fresh_stream_instead_of_resuming(running):
    """BSONObjectTooLarge (10334) or any server error without the ResumableChangeStreamError label would meet
    resuming from the same token again: the watcher reports it, wakes the followers for a catch-up by
    position and opens a stream from the present."""
    too_large = pymongo_errors.OperationFailure("BSONObj size: 16800000 is invalid", code=10334)
    first = FakeStream([insert(), None, too_large], ["t1", "t2", None])
    database = FakeDatabase(first, FakeStream([insert()], ["fresh"]))
    watcher, notifier = running(database)
    wait_for(lambda: watcher.resume_token == "fresh", timeout=5, what="a new stream")
    assert database.calls[1] == {"max_await_time_ms": 1000}  # no resume_after: from the present
    assert len(watcher.status.fallbacks) == 1 and "10334" in watcher.status.fallbacks[0]
    assert notifier.count >= 3  # two inserts, and the catch-up


def test_a_server_error_labelled_resumable_resumes_from_the_token(running):
    stepped_down = pymongo_errors.OperationFailure(
        "not primary", code=10107, details={"errorLabels": ["ResumableChangeStreamError"], "code": 10107})
    first = FakeStream([insert(), None, stepped_down], ["t1", "t2", None])
    database = FakeDatabase(first, FakeStream([insert()], ["t3"]))
    watcher, _ = running(database)
    wait_for(lambda: watcher.resume_token == "t3", timeout=5, what="the second stream is read")
    assert database.calls[1] == {"max_await_time_ms": 1000, "resume_after": "t2"}
    assert watcher.status.fallbacks == ()


def test_fresh_streams_that_keep_failing_leave_the_followers_polling(running):
    """A non-resumable error at every fresh start (say, a user without the changeStream privilege) is not
    retried forever: after ``max_fresh_failures`` in a row the watcher stops and says why."""
    refused = pymongo_errors.OperationFailure("not authorized on d to execute command", code=13)
    database = FakeDatabase(refuse=refused)
    watcher, _ = running(database)
    wait_for(lambda: watcher.status.state == "unavailable", timeout=5, what="the watcher gives up")
    time.sleep(0.05)
    assert len(database.calls) == ChangeWatcher.max_fresh_failures
    assert all("resume_after" not in call for call in database.calls)
    assert "not authorized" in watcher.status.detail


def test_close_stops_the_thread():
    watcher, _ = watcher_on(FakeDatabase())
    watcher.start()
    wait_for(lambda: watcher.status.state == "watching", timeout=5, what="watching")
    watcher.close()
    assert watcher.status.state == "stopped" and not watcher._thread.is_alive()
    watcher.start()  # closed for good
    assert watcher.status.state == "stopped"


class TestOnTheEmbeddedEngine(EmbeddedMongoDatabase, unittest.TestCase):
    def test_no_watcher_and_the_status_says_why(self):
        connection, name, guard = self.mongo()
        feed = MongoStreamFeed(MongoEventStore(connection, name, schema=guard), "ctx", watch_changes=True)
        assert feed.watcher is None
        feed.start_watching()  # nothing to start
        assert "embedded engine has no change streams" in feed.change_status()


@requires_real_mongo
class TestOnARealReplicaSet(RealMongoDatabase, unittest.TestCase):
    """Another process's append (a second client) wakes a follower that is far into its backoff."""

    def test_another_clients_append_wakes_the_follower(self):
        connection, name, guard = self.mongo()
        context = f"ctx-{uuid.uuid4().hex[:8]}"
        feed = MongoStreamFeed(MongoEventStore(connection, name, schema=guard), context, watch_changes=True)
        self.addCleanup(feed.close)
        other_connection = self.connection()
        self.addCleanup(other_connection.close)
        other = MongoEventStore(other_connection, name, schema=guard)
        handled = []
        runner = FollowerRunner(Follower("wake-me", handled.append), feed,
                                MongoFollowerStore(connection, name, schema=guard), max_wait_s=60)
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,))
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(stop.set)
        self.addCleanup(runner.wake)
        wait_for(lambda: feed.watcher.status.state in ("watching", "unavailable"), timeout=10,
                 what="the change stream")
        if feed.watcher.status.state == "unavailable":
            self.skipTest(f"not a replica set: {feed.watcher.status.detail}")
        time.sleep(3)  # the follower's backoff has grown past a second
        other.append(make_stream(AggregateId("order", uuid.uuid4().hex, context, "t"), 1))
        wait_for(lambda: handled, timeout=10, what="the follower handles the other client's append")
        assert feed.watcher.status.wakeups >= 1

"""The PrepareKey contract (DESIGN part D)."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta

from wow_django.exceptions import KeyAlreadyPrepared, KeyNotHeld
from wow_django.persistence.contracts import Clock, PrepareKey
from wow_django.persistence.records import PreparedValue
from wow_django.testing._case import TestCaseMixin
from wow_django.testing.clock import FakeClock


class PrepareKeyContract(TestCaseMixin):
    """Mix into ``unittest.TestCase``; implement :meth:`make_prepare_key`.

    ``self.clock`` is a :class:`~wow_django.testing.clock.FakeClock`: the
    store under test must take its time from it, and the tests move it
    instead of sleeping.
    """

    def make_prepare_key(self, name: str, clock: Clock) -> PrepareKey:  # pragma: no cover - abstract
        raise NotImplementedError("return the prepare key under test, built with clock=clock")

    def setUp(self) -> None:
        super().setUp()
        self.clock = FakeClock()
        self.keys = self.make_prepare_key("username", self.clock)

    def key(self) -> str:
        return f"user-{uuid.uuid4().hex[:10]}"

    def test_prepare_then_get(self):
        key = self.key()
        self.assertTrue(self.keys.prepare(key, "customer-1"))
        prepared = self.keys.get(key)
        self.assertEqual(prepared.value, "customer-1")
        self.assertFalse(prepared.expired(self.clock()))

    def test_prepare_of_a_taken_key_fails_and_keeps_the_value(self):
        key = self.key()
        self.assertTrue(self.keys.prepare(key, "customer-1"))
        self.assertFalse(self.keys.prepare(key, "customer-2"))
        self.assertEqual(self.keys.get(key).value, "customer-1")

    def test_get_of_unknown_key_is_none(self):
        self.assertIsNone(self.keys.get(self.key()))

    def test_structured_values_round_trip(self):
        key = self.key()
        self.assertTrue(self.keys.prepare(key, {"customerId": "c-1", "tags": ["a", "b"]}))
        self.assertEqual(self.keys.get(key).value, {"customerId": "c-1", "tags": ["a", "b"]})

    def test_expired_reservation_is_gone_and_can_be_prepared_again(self):
        key = self.key()
        self.assertTrue(self.keys.prepare(key, "first", timedelta(minutes=5)))
        self.assertEqual(self.keys.get(key), PreparedValue("first", self.clock() + timedelta(minutes=5)))
        self.clock.advance(minutes=5, milliseconds=-1)  # its last millisecond
        self.assertEqual(self.keys.get(key).value, "first")
        self.assertFalse(self.keys.prepare(key, "too-early"))
        self.clock.advance(milliseconds=1)  # its end: expired
        self.assertIsNone(self.keys.get(key))
        self.assertFalse(self.keys.rollback(key))
        self.assertFalse(self.keys.reprepare(key, "late"))
        self.assertTrue(self.keys.prepare(key, "second"))
        self.assertEqual(self.keys.get(key).value, "second")

    def test_ttl_as_a_moment(self):
        key = self.key()
        until = self.clock() + timedelta(hours=1)
        self.assertTrue(self.keys.prepare(key, "v", until))
        self.assertEqual(self.keys.get(key).ttl_at, until)
        self.clock.advance(hours=1)
        self.assertIsNone(self.keys.get(key))

    def test_bad_ttl_and_key_are_refused(self):
        with self.assertRaisesRegex(ValueError, "ttl must be positive"):
            self.keys.prepare(self.key(), "v", timedelta(seconds=-1))
        with self.assertRaisesRegex(ValueError, "timezone-aware"):
            self.keys.prepare(self.key(), "v", datetime(2030, 1, 1))
        with self.assertRaisesRegex(ValueError, "prepare key"):
            self.keys.prepare("", "v")

    def test_rollback_without_value(self):
        key = self.key()
        self.keys.prepare(key, "v")
        self.assertTrue(self.keys.rollback(key))
        self.assertIsNone(self.keys.get(key))
        self.assertFalse(self.keys.rollback(key))
        self.assertTrue(self.keys.prepare(key, "again"))

    def test_rollback_with_value_only_releases_a_matching_reservation(self):
        key = self.key()
        self.keys.prepare(key, "mine")
        self.assertFalse(self.keys.rollback(key, "theirs"))
        self.assertEqual(self.keys.get(key).value, "mine")
        self.assertTrue(self.keys.rollback(key, "mine"))
        self.assertIsNone(self.keys.get(key))

    def test_a_value_that_looks_like_an_operator_is_matched_literally(self):
        key = self.key()
        self.keys.prepare(key, "mine")
        # On MongoDB a raw {"value": {...}} filter would run these as operators and match "mine".
        for probe in ({"$ne": None}, {"$exists": True}, {"$gt": ""}):
            with self.subTest(probe=probe):
                self.assertFalse(self.keys.rollback(key, probe))
                self.assertFalse(self.keys.reprepare(key, "stolen", old_value=probe))
                self.assertEqual(self.keys.get(key).value, "mine")
        self.assertTrue(self.keys.reprepare(key, {"n": 1}, old_value="mine"))
        self.assertFalse(self.keys.rollback(key, {"n": 2}))
        self.assertTrue(self.keys.rollback(key, {"n": 1}))  # a document value matches itself

    def test_change_key_moves_a_reservation(self):
        old, new = self.key(), self.key()
        self.keys.prepare(old, "customer-1")
        self.assertTrue(self.keys.change_key(old, "customer-1", new, "customer-1"))
        self.assertIsNone(self.keys.get(old))
        self.assertEqual(self.keys.get(new).value, "customer-1")

    def test_change_key_to_a_taken_key_changes_nothing(self):
        old, taken = self.key(), self.key()
        self.keys.prepare(old, "customer-1")
        self.keys.prepare(taken, "customer-2")
        self.assertFalse(self.keys.change_key(old, "customer-1", taken, "customer-1"))
        self.assertEqual(self.keys.get(old).value, "customer-1")
        self.assertEqual(self.keys.get(taken).value, "customer-2")

    def test_change_key_onto_itself_is_an_argument_error(self):
        """As in Wow: a move needs two keys (:meth:`reprepare` replaces a value in place)."""
        key = self.key()
        self.keys.prepare(key, "v1")
        with self.assertRaises(ValueError):
            self.keys.change_key(key, "v1", key, "v2")
        self.assertEqual(self.keys.get(key).value, "v1")

    def test_change_key_from_a_missing_or_foreign_old_key_fails_and_releases_the_new_one(self):
        """As in Wow: the old key must be held with the old value; otherwise the move fails and the new key,
        taken for it, is released (nothing changes)."""
        missing, foreign, new = self.key(), self.key(), self.key()
        with self.assertRaises(KeyNotHeld) as caught:
            self.keys.change_key(missing, "customer-1", new, "customer-1")
        self.assertEqual((caught.exception.key, caught.exception.new_key), (missing, new))
        self.assertIsNone(self.keys.get(new))
        self.keys.prepare(foreign, "customer-9")
        with self.assertRaises(KeyNotHeld):
            self.keys.change_key(foreign, "customer-1", new, "customer-1")
        self.assertIsNone(self.keys.get(new))
        self.assertEqual(self.keys.get(foreign).value, "customer-9")  # not ours: kept
        self.assertTrue(self.keys.prepare(new, "someone-else"))  # the new key is free again

    def test_reprepare_without_old_value(self):
        key = self.key()
        self.assertFalse(self.keys.reprepare(key, "nothing-there"))
        self.keys.prepare(key, "v1")
        self.assertTrue(self.keys.reprepare(key, "v2"))
        self.assertEqual(self.keys.get(key).value, "v2")

    def test_reprepare_with_old_value(self):
        key = self.key()
        self.keys.prepare(key, "v1")
        self.assertFalse(self.keys.reprepare(key, "v3", old_value="wrong"))
        self.assertEqual(self.keys.get(key).value, "v1")
        self.clock.advance(minutes=1)
        self.assertTrue(self.keys.reprepare(key, "v2", old_value="v1", ttl=timedelta(hours=1)))
        self.assertEqual(self.keys.get(key), PreparedValue("v2", self.clock() + timedelta(hours=1)))  # from now

    def test_using_prepare_keeps_the_key_when_the_block_succeeds(self):
        key = self.key()
        with self.keys.using_prepare(key, "c-1", timedelta(minutes=10)) as prepared:
            self.assertEqual(prepared, PreparedValue("c-1", self.clock() + timedelta(minutes=10)))
        self.assertEqual(self.keys.get(key), prepared)

    def test_using_prepare_rolls_back_when_the_block_raises(self):
        key = self.key()
        with self.assertRaisesRegex(RuntimeError, "boom"):
            with self.keys.using_prepare(key, "c-1"):
                raise RuntimeError("boom")
        self.assertIsNone(self.keys.get(key))

    def test_using_prepare_on_a_taken_key_raises_and_keeps_the_holder(self):
        key = self.key()
        self.keys.prepare(key, "holder")
        with self.assertRaises(KeyAlreadyPrepared):
            with self.keys.using_prepare(key, "intruder"):
                self.fail("the block must not run")
        self.assertEqual(self.keys.get(key).value, "holder")

    def test_keys_of_different_names_are_independent(self):
        key = self.key()
        emails = self.make_prepare_key("email", self.clock)
        self.assertTrue(self.keys.prepare(key, "a"))
        self.assertTrue(emails.prepare(key, "b"))
        self.assertEqual(emails.get(key).value, "b")

    def test_concurrent_prepares_have_one_winner(self):
        key = self.key()
        barrier = threading.Barrier(8, timeout=60)
        results: list[bool] = []
        lock = threading.Lock()

        def attempt(n: int) -> None:
            barrier.wait()
            won = self.keys.prepare(key, f"c-{n}")
            with lock:
                results.append(won)

        threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results.count(True), 1)

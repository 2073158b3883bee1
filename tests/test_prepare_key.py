"""PrepareKey on the real clock (the conformance suite drives a FakeClock), on each local backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from wow_django.application.runtime import get_runtime
from wow_django.persistence.records import FOREVER


@pytest.fixture
def keys(wow):
    return get_runtime().prepare_key("username")


def test_the_default_clock_is_the_real_time(keys):
    before = datetime.now(UTC)
    assert keys.prepare("ada", "c-1", timedelta(hours=1))
    after = datetime.now(UTC)
    held = keys.get("ada")
    assert held.value == "c-1"
    # BSON keeps milliseconds: allow for the truncation.
    assert before + timedelta(hours=1) - timedelta(milliseconds=1) <= held.ttl_at <= after + timedelta(hours=1)


def test_a_reservation_that_ended_in_the_past_is_free_again(keys):
    ended = datetime.now(UTC) - timedelta(seconds=1)
    assert keys.prepare("bob", "c-1", ended)
    assert keys.get("bob") is None
    assert keys.prepare("bob", "c-2", timedelta(minutes=5))
    assert keys.get("bob").value == "c-2"


def test_using_prepare_holds_forever_by_default_and_rolls_back_on_error(keys):
    with keys.using_prepare("cy", "c-1") as held:
        assert held.ttl_at == FOREVER
        assert keys.get("cy").ttl_at == FOREVER
    assert keys.get("cy").value == "c-1"  # kept: the block succeeded
    with pytest.raises(RuntimeError), keys.using_prepare("dee", "c-1"):
        raise RuntimeError("the command failed")
    assert keys.get("dee") is None  # rolled back

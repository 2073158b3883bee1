"""The combiner: concurrent calls written in batches by one of their own threads (no thread of its own)."""

from __future__ import annotations

import threading
import time

import pytest

from wow_django.persistence.combining import TIMED_OUT, BatchFailed, Combiner

from .support import in_forked_child

WAIT_S = 10


class GatedWrite:
    """A write whose first call blocks until :meth:`open`; records every batch and the thread that wrote it."""

    def __init__(self, result=lambda item: item * 10):
        self.batches: list[list] = []
        self.writers: list[int] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.result = result

    def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        self.writers.append(threading.get_ident())
        if len(self.batches) == 1:
            self.entered.set()
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return [self.result(item) for item in items]


def submit_in_threads(combiner: Combiner, items, results: dict) -> list[threading.Thread]:
    def run(item):
        results[item] = combiner.submit(item)

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    return threads


def first_then_queued(run, write: GatedWrite, combiner: Combiner, queued: tuple) -> None:
    """``run(1)`` in a thread, held in its write while ``run(n)`` for each of ``queued`` queues behind it;
    then the gate opens and every thread ends."""
    first = threading.Thread(target=run, args=(1,))
    first.start()
    assert write.entered.wait(WAIT_S)
    others = [threading.Thread(target=run, args=(n,)) for n in queued]
    for thread in others:
        thread.start()
    wait_until(lambda: len(combiner._queue) == len(queued), f"{len(queued)} calls are queued")
    write.gate.set()
    for thread in [first, *others]:
        thread.join(WAIT_S)
        assert not thread.is_alive()


def held_first_write(**kwargs) -> tuple[GatedWrite, Combiner, dict, list[threading.Thread]]:
    """A combiner whose first write (of the call ``1``, from a thread of its own) is held at the gate."""
    write = GatedWrite()
    combiner = Combiner(write, **kwargs)
    results: dict = {}
    first = submit_in_threads(combiner, [1], results)
    assert write.entered.wait(WAIT_S)
    return write, combiner, results, first


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


def test_a_lone_call_is_written_at_once_as_a_batch_of_one_in_its_own_thread():
    write = GatedWrite()
    write.gate.set()
    combiner = Combiner(write)
    assert combiner.submit(4) == 40
    assert combiner.submit(5) == 50
    assert write.batches == [[4], [5]]
    assert write.writers == [threading.get_ident()] * 2


def test_calls_arriving_while_a_batch_is_written_go_together_into_the_next_each_with_its_own_result():
    write, combiner, results, first = held_first_write()
    others = submit_in_threads(combiner, [2, 3, 4, 5], results)
    wait_until(lambda: len(combiner._queue) == 4, "four calls are queued")
    write.gate.set()
    for thread in first + others:
        thread.join(WAIT_S)
    assert results == {1: 10, 2: 20, 3: 30, 4: 40, 5: 50}
    assert write.batches[0] == [1]
    assert sorted(write.batches[1]) == [2, 3, 4, 5]  # one write for the four, by one of their threads
    assert len(write.batches) == 2
    assert write.writers[1] != write.writers[0]


def test_a_batch_holds_at_most_max_size_and_every_call_is_written_once():
    write = GatedWrite()
    combiner = Combiner(write, max_size=2)
    results: dict = {}
    first = submit_in_threads(combiner, [0], results)
    assert write.entered.wait(WAIT_S)
    others = submit_in_threads(combiner, list(range(1, 8)), results)
    wait_until(lambda: len(combiner._queue) == 7, "seven calls are queued")
    write.gate.set()
    for thread in first + others:
        thread.join(WAIT_S)
    assert results == {n: n * 10 for n in range(8)}
    assert all(len(batch) <= 2 for batch in write.batches)
    assert sorted(item for batch in write.batches for item in batch) == list(range(8))


def test_a_caller_returns_when_its_batch_is_written_not_when_the_writer_is_done():
    # max_size 1: whoever writes after "first" writes the calls queued before its own one at a time; each
    # of their callers returns as soon as its call is written, while the writer goes on. The write of
    # "last" waits until the three others are back: if they waited for the writer, it never would.
    holding, go, release_last = threading.Event(), threading.Event(), threading.Event()
    returned: list = []

    def write(items):
        if items == ["first"]:
            holding.set()
            assert go.wait(WAIT_S)
        if items == ["last"]:
            assert release_last.wait(WAIT_S), "the callers written before did not return"
        return [f"{item}!" for item in items]

    combiner = Combiner(write, max_size=1)
    results: dict = {}

    def run(item):
        results[item] = combiner.submit(item)
        returned.append(item)
        if len(returned) == 3:
            release_last.set()

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert holding.wait(WAIT_S)
    queued = []
    for item in ("a", "b", "last"):
        thread = threading.Thread(target=run, args=(item,))
        thread.start()
        queued.append(thread)
        count = len(queued)
        wait_until(lambda: len(combiner._queue) == count, f"{item} is queued")  # noqa: B023
    go.set()
    for thread in [first, *queued]:
        thread.join(WAIT_S)
    assert results == {"first": "first!", "a": "a!", "b": "b!", "last": "last!"}
    assert returned[-1] == "last"


def test_a_write_that_fails_gives_every_call_of_its_batch_the_failure_and_the_writer_is_known():
    class Broken(Exception):
        pass

    write = GatedWrite()
    calls = []

    def failing(items):
        calls.append(list(items))
        if len(calls) == 1:
            return write(items)  # the first batch (gated) works
        raise Broken("the writer's connection is gone")

    combiner = Combiner(failing)
    results: dict = {}
    writers: dict = {}

    def run(item):
        result = combiner.submit(item)
        results[item] = result
        if isinstance(result, BatchFailed):
            writers[item] = result.by_this_thread

    first_then_queued(run, write, combiner, (2, 3, 4))
    assert results[1] == 10
    failed = [results[n] for n in (2, 3, 4)]
    assert all(isinstance(r, BatchFailed) and isinstance(r.error, Broken) for r in failed)
    assert sorted(writers.values()) == [False, False, True]  # exactly one of them wrote the batch


def test_a_write_returning_the_wrong_number_of_results_fails_its_batch():
    combiner = Combiner(lambda items: [])
    result = combiner.submit("x")
    assert isinstance(result, BatchFailed)
    assert "0 results for 1 items" in str(result.error)
    assert result.by_this_thread


def test_an_interrupted_writer_raises_and_leaves_no_call_waiting():
    write = GatedWrite()
    calls = []

    def interrupted(items):
        calls.append(list(items))
        if len(calls) == 1:
            return write(items)
        raise KeyboardInterrupt

    combiner = Combiner(interrupted)
    outcomes: dict = {}

    def run(item):
        try:
            outcomes[item] = combiner.submit(item)
        except KeyboardInterrupt:
            outcomes[item] = "interrupted"

    first_then_queued(run, write, combiner, (2, 3))
    assert outcomes[1] == 10
    assert sorted(str(type(outcomes[n]).__name__) for n in (2, 3)) == ["BatchFailed", "str"]
    # The combiner is free again.
    combiner._write = lambda items: [f"ok {item}" for item in items]
    assert combiner.submit(9) == "ok 9"


def test_a_forked_child_does_not_wait_for_the_parents_writer():
    write = GatedWrite()
    combiner = Combiner(write)
    holder = threading.Thread(target=combiner.submit, args=(1,))
    holder.start()
    assert write.entered.wait(WAIT_S)  # the parent's writer is busy (and its lock may be held) at the fork

    def probe():
        combiner._write = lambda items: [item + 1 for item in items]
        answers: dict = {}
        threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, combiner.submit(n))) for n in (41, 50)]
        for thread in threads:  # two first calls at once in the child
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        return (answers == {41: 42, 50: 51}, not any(thread.is_alive() for thread in threads))

    try:
        assert in_forked_child(probe) == (True, True)
    finally:
        write.gate.set()
        holder.join(WAIT_S)


def test_a_call_that_waits_in_the_queue_past_its_timeout_is_taken_back_out_and_never_written():
    write, combiner, results, first = held_first_write()
    started = time.monotonic()
    assert combiner.submit(2, timeout=0.05) is TIMED_OUT
    assert time.monotonic() - started < WAIT_S
    assert list(combiner._queue) == []
    write.gate.set()
    first[0].join(WAIT_S)
    assert results == {1: 10}
    assert write.batches == [[1]]
    assert combiner.submit(3, timeout=0.05) == 30  # no writer: written at once


def test_the_queue_timeout_counts_only_time_in_which_no_write_finished():
    # Writes that take 30 ms each, one call per write: the last of five callers waits about 120 ms in all,
    # past its 50 ms timeout, but a write finished within every 50 ms of it: a busy writer, not a stuck one.
    write_started = threading.Event()

    def slow(items):
        write_started.set()
        time.sleep(0.03)
        return [item * 10 for item in items]

    combiner = Combiner(slow, max_size=1)
    results: dict = {}

    def run(item):
        results[item] = combiner.submit(item, timeout=0.05)

    threads = [threading.Thread(target=run, args=(1,))]
    threads[0].start()
    assert write_started.wait(WAIT_S)
    for item in (2, 3, 4, 5):
        thread = threading.Thread(target=run, args=(item,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(WAIT_S)
    assert results == {n: n * 10 for n in range(1, 6)}


def test_a_caller_interrupted_while_it_waits_takes_its_call_back_out():
    write, combiner, results, first = held_first_write()
    interrupted = threading.Event()

    class Interrupting(threading.Condition):
        def wait(self, timeout=None):
            if threading.current_thread().name == "interrupted":
                raise KeyboardInterrupt
            return super().wait(timeout)

    cond = combiner._cond
    combiner._cond = Interrupting(cond._lock)  # type: ignore[attr-defined]

    def run():
        try:
            combiner.submit(2)
        except KeyboardInterrupt:
            interrupted.set()

    thread = threading.Thread(target=run, name="interrupted")
    thread.start()
    thread.join(WAIT_S)
    assert interrupted.is_set()
    assert list(combiner._queue) == []
    write.gate.set()
    first[0].join(WAIT_S)
    assert write.batches == [[1]]  # 2 was never written


def test_max_size_must_be_positive():
    with pytest.raises(ValueError, match="max_size must be ≥ 1"):
        Combiner(lambda items: items, max_size=0)

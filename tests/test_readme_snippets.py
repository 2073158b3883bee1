"""The README's snippets, run as written (issue 13: every snippet is exercised). Each test names its snippet."""

from __future__ import annotations

import re
import unittest
from pathlib import Path

import pytest

from wow_django.application.followers import FollowerRegistry, use_followers
from wow_django.domain.registry import Registry, use_registry

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def block(starting_with: str) -> str:
    """The README's python block whose text contains ``starting_with`` (exactly one)."""
    [found] = [code for code in PYTHON_BLOCKS if starting_with in code]
    return found


def test_the_modeling_snippet_and_its_aggregate_spec_tests_run_as_written():
    """"## Modeling": the Order declarations, then the AggregateSpec tests written against them."""
    namespace: dict = {}
    with use_registry(Registry()):  # the README's "order" beside the sample's own
        exec(compile(block("class Order(Aggregate"), "README.md (modeling)", "exec", dont_inherit=True), namespace)
        exec(compile(block("from wow_django.testing import AggregateSpec"), "README.md (AggregateSpec)", "exec", dont_inherit=True),
             namespace)
        tests = [name for name in namespace if name.startswith("test_")]
        assert tests == ["test_paying_the_total", "test_a_wrong_amount_is_refused"]
        for name in tests:
            namespace[name]()


def test_the_expected_version_snippet_runs_as_written():
    """"## The command gateway", **Expected version**: on the modeling snippet's Order, in-memory stores."""
    from django.test import override_settings

    from .support import fresh_wow

    namespace: dict = {}
    with use_registry(Registry()), override_settings(WOW=fresh_wow("in_memory")):
        exec(compile(block("class Order(Aggregate"), "README.md (modeling)", "exec", dont_inherit=True), namespace)
        exec(compile(block("except CommandExpectVersionConflict"), "README.md (expected version)", "exec",
                     dont_inherit=True), namespace)
        from wow_django.application.runtime import get_runtime
        from wow_django.persistence.records import AggregateId

        stored = get_runtime().event_store.load(AggregateId("order", namespace["placed"].aggregate_id))
        assert [s.version for s in stored] == [1, 2]  # the third send was refused: nothing appended


@pytest.mark.django_db(transaction=True)
def test_the_isolation_snippet_runs_as_written(wow_isolation):
    """"### Testing your aggregates": the TestCase with the mixin (its two tests in both orders, each
    reusing one request id) and the pytest function with the fixture, on the suite's settings (the django
    backend) and the README's Order."""
    namespace: dict = {"__name__": "README"}
    with use_registry(Registry()), use_followers(FollowerRegistry()):
        exec(compile(block("class Order(Aggregate"), "README.md (modeling)", "exec", dont_inherit=True), namespace)
        exec(compile(block("from wow_django.testing import IsolatedWowMixin"), "README.md (isolation)", "exec",
                     dont_inherit=True), namespace)
        cases = namespace["PlacingOrders"]
        names = ["test_placing_an_order", "test_the_same_request_in_another_test"]
        for order in (names, names[::-1]):
            result = unittest.TestResult()
            unittest.TestSuite(cases(name) for name in order).run(result)
            assert result.errors + result.failures == [] and result.testsRun == 2
        namespace["test_placing_an_order"](wow_isolation)

"""The README's snippets, run as written (issue 13: every snippet is exercised). Each test names its snippet."""

from __future__ import annotations

import re
from pathlib import Path

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

"""The package's shape: one-way layers, no import cycles, a pure domain.

Every module of ``wow_django`` is parsed (not imported) and every import is
read, also those inside functions and ``TYPE_CHECKING`` blocks. See README
"Architecture" for the layers.
"""

from __future__ import annotations

import pytest

from .support import imports_of, modules

# Lowest first. A module may import modules of its own layer and of lower ones.
# The bus package (its facade get_bus/send included: the runtime installs the process's bus through
# wow_django.bus.provider) sits below the application; its Django app parts are edges. The app's models
# module and migrations are edges too: they expose the django backend's tables to Django.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("wow_django", "wow_django.exceptions")),
    ("domain", ("wow_django.domain",)),
    ("query", ("wow_django.query",)),
    ("settings", ("wow_django.conf",)),
    ("persistence", ("wow_django.persistence",)),
    ("backends", ("wow_django.backends",)),
    ("bus", ("wow_django.bus",)),
    ("application", ("wow_django.application",)),
    ("edges", ("wow_django.http", "wow_django.tasks", "wow_django.management", "wow_django.testing",
               "wow_django.checks", "wow_django.apps", "wow_django.models", "wow_django.migrations",
               "wow_django.admin", "wow_django.console", "wow_django.templatetags",
               "wow_django.bus.apps", "wow_django.bus.models", "wow_django.bus.checks", "wow_django.bus.migrations")),
]
FOREIGN_TO_DOMAIN = ("django", "pymongo", "bson", "mongomock", "rest_framework", "celery", "kombu", "redis",
                     "drf_spectacular")


def internal_graph() -> dict[str, set[str]]:
    return {name: {target for target, _ in imports_of(name) if target in modules() and target != name}
            for name in modules()}


def layer_of(name: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = name == prefix
            under = prefix.endswith(".") and name.startswith(prefix) or name.startswith(prefix + ".")
            if (exact or under) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS in tests/test_architecture.py")
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_scan_sees_function_level_imports():
    # The apps' ready() import the runtime and the checks inside the method: the scan must see it.
    assert "wow_django.application.runtime" in {t for t, _ in imports_of("wow_django.apps")}
    assert len(modules()) > 60


def test_the_bus_facade_finds_the_bus_without_importing_the_application():
    """get_bus() answers through the provider the runtime installs; the bus package never imports upward."""
    from wow_django.application.runtime import get_runtime
    from wow_django.bus import get_bus, provider

    assert not any(t.startswith("wow_django.application") for t, _ in imports_of("wow_django.bus"))
    assert get_bus() is get_runtime().bus
    installed = provider._provider
    provider.install(None)
    try:
        with pytest.raises(Exception, match="INSTALLED_APPS"):
            get_bus()
    finally:
        provider.install(installed)


def test_a_backend_is_one_folder():
    """The query package is the DSL, its semantics and the evaluator; each compiler is in its backend's folder,
    and nothing outside a backend's folder imports its compiler."""
    query_modules = {n for n in modules() if n.startswith("wow_django.query")}
    assert {"wow_django.query.orm", "wow_django.query.mongo"} & query_modules == set()
    assert {"wow_django.backends.django.compiler", "wow_django.backends.mongo.compiler"} <= set(modules())
    for name in modules():
        for target, line in imports_of(name):
            if target.startswith("wow_django.backends.") and target.endswith(".compiler"):
                folder = target.rsplit(".", 1)[0]
                assert name.startswith(folder + ".") or name == folder, f"{name}:{line} imports {target}"


def test_no_import_cycles_inside_wow_django():
    assert cycles(internal_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_flow_one_way_between_layers():
    upward = []
    for name in modules():
        own = layer_of(name)
        for target, line in imports_of(name):
            if target in modules() and layer_of(target) > own:
                upward.append(f"{name}:{line} ({LAYERS[own][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    assert upward == []


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith("wow_django.domain")))
def test_the_domain_is_pure(name):
    foreign = [f"{target} (line {line})" for target, line in imports_of(name)
               if target.split(".")[0] in FOREIGN_TO_DOMAIN]
    assert foreign == [], f"{name} imports {', '.join(foreign)}"


def test_the_domain_imports_nothing_of_wow_django_but_the_domain_and_exceptions():
    for name in modules():
        if name.startswith("wow_django.domain"):
            others = {t for t, _ in imports_of(name) if t.startswith("wow_django")
                      and not t.startswith("wow_django.domain") and t != "wow_django.exceptions"}
            assert others == set(), f"{name} imports {others}"


def test_no_test_module_imports_another_test_module():
    """Shared helpers live in tests/support.py or wow_django.testing, never in a test module."""
    import ast
    from pathlib import Path

    offenders = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                if any(n.rpartition(".")[2].startswith("test_") or n.startswith("tests.test_") for n in names):
                    offenders.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Import):
                if any(a.name.rpartition(".")[2].startswith("test_") for a in node.names):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []

"""A pytest plugin: the ``wow_isolation`` fixture (every wow_django store isolated per test).

Enable it in the project's root ``conftest.py``::

    pytest_plugins = ["wow_django.testing.pytest_plugin"]

(or ``-p wow_django.testing.pytest_plugin``; or import the fixture into a conftest:
``from wow_django.testing.pytest_plugin import wow_isolation``), then ask for it::

    def test_opening_a_cart(wow_isolation):
        send(OpenCart(customer="c-1"), request_id="req-1")

or for every test of a directory, in its ``conftest.py``::

    @pytest.fixture(autouse=True)
    def _isolated_wow(wow_isolation):
        pass

It yields the test's :class:`~wow_django.testing.isolation.WowIsolation`. When a store is on the
``django`` backend it asks pytest-django for the database (the ``db`` fixture, which honours the
test's ``django_db`` mark: ``transaction=True``, ``databases=[...]`` for a ``DATABASE_ALIAS`` other
than ``default``). Inside the test's transaction the runtime is inline, as for a ``TestCase``; see
:mod:`wow_django.testing.isolation`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from wow_django.testing.isolation import WowIsolation, isolated_wow, uses_django_storage


@pytest.fixture
def wow_isolation(request: pytest.FixtureRequest) -> Iterator[WowIsolation]:
    """Every wow_django store empty at the start of the test, and what the test wrote gone after it."""
    if uses_django_storage() and request.config.pluginmanager.hasplugin("django"):
        request.getfixturevalue("db")  # set up before this fixture, torn down after it
    with isolated_wow() as isolation:
        yield isolation


__all__ = ["wow_isolation"]

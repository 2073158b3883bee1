"""The base class the contract mixins of this package declare for the type checker only."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import unittest

    # What the mixins are mixed into: the type checker sees its assertions, setUp and addCleanup.
    TestCaseMixin = unittest.TestCase
else:
    # At run time a mixin stays a plain class, mixed in before unittest.TestCase as the docs say.
    TestCaseMixin = object

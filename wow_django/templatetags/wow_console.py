"""Template filters of the console: times people can read, and JSON.

``{% load wow_console %}``, then ``{{ value|when }}`` for a time (epoch milliseconds as Wow's documents
hold them, a datetime, or ISO text) and ``{{ value|as_json }}`` for a value as indented JSON.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

from wow_django.console.base import moment, pretty

register = template.Library()


@register.filter
def when(value: Any) -> str:
    """A ``<time>`` element: the moment in the current time zone, with the zone's name, to the millisecond;
    its ``datetime`` attribute is ISO 8601 in UTC and its title the epoch milliseconds (what queries take).
    A naive datetime is UTC (the stores' times). Anything that is not a time is shown as it is."""
    return _time_element(value, moment(value))


@register.filter
def when_local(value: Any) -> str:
    """:func:`when` for a Django model's datetime field: naive (``USE_TZ = False``) means the default zone."""
    return _time_element(value, moment(value, naive_is_local=True))


def _time_element(value: Any, found: dict | None) -> str:
    if found is None:
        return "" if value is None else str(value)
    return format_html('<time datetime="{}" title="{} ms since 1970-01-01 UTC">{}</time>',
                       found["iso"], found["ms"], found["text"])


@register.filter
def as_json(value: Any) -> str:
    """``value`` as indented JSON (decimals with their exact digits, times as ISO text)."""
    return pretty(value)

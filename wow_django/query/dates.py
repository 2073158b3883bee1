"""Date windows for the date operators, computed from an explicit ``now``.

Every function here is pure: the caller passes ``now`` (an aware datetime), so
the Mongo compiler and the Python evaluator agree and tests are deterministic.

A window is half-open, ``start <= field < end``; ``start`` is ``None`` for the
operators that only have an upper bound (BEFORE_TODAY, EARLIER_DAYS). Days start
at 00:00 in the condition's zone and weeks run Monday to Sunday:

=============  ===============================================================
TODAY          [today, tomorrow)
TOMORROW       [tomorrow, the day after)
BEFORE_TODAY   (-inf, today at T): T a time of day (Wow's value: seconds of the day or "HH:mm[:ss[.SSS]]"),
               00:00 when none is given
THIS_WEEK      [this Monday, next Monday)
NEXT_WEEK      [next Monday, the Monday after)
LAST_WEEK      [last Monday, this Monday)
THIS_MONTH     [the 1st of this month, the 1st of next month)
LAST_MONTH     [the 1st of last month, the 1st of this month)
RECENT_DAYS N  [today - (N - 1) days, tomorrow): the last N calendar days, today included
EARLIER_DAYS N (-inf, today - (N - 1) days): everything before the RECENT_DAYS N window
=============  ===============================================================

A field holds epoch milliseconds unless the condition names a ``datePattern``;
then it holds text in that pattern and the bounds are formatted the same way.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

NO_ARGUMENT_OPERATORS = frozenset(
    {"TODAY", "TOMORROW", "THIS_WEEK", "NEXT_WEEK", "LAST_WEEK", "THIS_MONTH", "LAST_MONTH"}
)
DAY_COUNT_OPERATORS = frozenset({"RECENT_DAYS", "EARLIER_DAYS"})
#: Operators whose value is a time of day (optional).
TIME_OF_DAY_OPERATORS = frozenset({"BEFORE_TODAY"})
DATE_OPERATORS = NO_ARGUMENT_OPERATORS | DAY_COUNT_OPERATORS | TIME_OF_DAY_OPERATORS

SECONDS_PER_DAY = 86_400
#: A time of day as text, as Java's ``LocalTime.parse`` reads it: HH:mm, HH:mm:ss or HH:mm:ss.fraction.
TIME_OF_DAY_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,9})?)?$"
TIME_OF_DAY_RULE = ("a time of day: whole seconds from 0 to 86399, or text HH:mm, HH:mm:ss or HH:mm:ss.SSS "
                    "(24-hour clock)")
_TIME_OF_DAY = re.compile(TIME_OF_DAY_PATTERN)


def parse_time_of_day(raw) -> time:
    """The time of day BEFORE_TODAY's value names (:data:`TIME_OF_DAY_RULE`, or a naive ``time`` given in
    Python); ValueError otherwise."""
    if isinstance(raw, time) and raw.tzinfo is None:
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        if 0 <= raw < SECONDS_PER_DAY:
            return time(raw // 3600, raw // 60 % 60, raw % 60)
    elif isinstance(raw, str) and len(raw) <= 18 and _TIME_OF_DAY.fullmatch(raw):
        hours, minutes, *rest = raw.split(":")
        seconds, _, fraction = (rest[0] if rest else "0").partition(".")
        return time(int(hours), int(minutes), int(seconds), int((fraction + "000000")[:6]))
    raise ValueError(f"must be {TIME_OF_DAY_RULE}")

# RECENT_DAYS / EARLIER_DAYS accept 1..MAX_DAYS (a century), far from date.min.
MAX_DAYS = 36_500


@dataclass(frozen=True, slots=True)
class DateWindow:
    """``start <= instant < end``; a ``None`` start means unbounded below (every window has an end)."""

    start: datetime | None
    end: datetime


def resolve_now(now: datetime | None) -> datetime:
    """``now`` itself (it must be timezone-aware), or the current UTC time when ``None``."""
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {now!r}")
    return now


def start_of_day(day: date, zone: tzinfo) -> datetime:
    """00:00 of ``day`` in ``zone``."""
    return datetime.combine(day, time(0, 0), tzinfo=zone)


def monday_of(day: date) -> date:
    """The Monday of the week holding ``day``."""
    return day - timedelta(days=day.weekday())


def first_of_month(day: date, months_later: int = 0) -> date:
    """The 1st of the month ``months_later`` months after ``day``'s month (negative goes back)."""
    index = day.year * 12 + (day.month - 1) + months_later
    return date(index // 12, index % 12 + 1, 1)


def date_window(operator: str, *, now: datetime, zone: tzinfo, days: int | time | None = None) -> DateWindow:
    """The window of a date operator at ``now`` in ``zone`` (see the module table).

    ``days`` is the operator's value: the N of RECENT_DAYS and EARLIER_DAYS (an integer >= 1), BEFORE_TODAY's
    time of day (a ``time``; None: 00:00).
    """
    today = resolve_now(now).astimezone(zone).date()
    one_day = timedelta(days=1)

    def day_range(first: date, after_last: date) -> DateWindow:
        return DateWindow(start_of_day(first, zone), start_of_day(after_last, zone))

    if operator == "TODAY":
        return day_range(today, today + one_day)
    if operator == "TOMORROW":
        return day_range(today + one_day, today + 2 * one_day)
    if operator == "BEFORE_TODAY":
        at = days if isinstance(days, time) else time(0, 0)
        # Today at that wall-clock time in the zone (as Wow: now, in the zone, with that time of day).
        return DateWindow(None, datetime.combine(today, at, tzinfo=zone))
    if operator in ("THIS_WEEK", "NEXT_WEEK", "LAST_WEEK"):
        shift = {"THIS_WEEK": 0, "NEXT_WEEK": 1, "LAST_WEEK": -1}[operator]
        monday = monday_of(today) + timedelta(weeks=shift)
        return day_range(monday, monday + timedelta(weeks=1))
    if operator in ("THIS_MONTH", "LAST_MONTH"):
        shift = 0 if operator == "THIS_MONTH" else -1
        return day_range(first_of_month(today, shift), first_of_month(today, shift + 1))
    if operator in DAY_COUNT_OPERATORS:
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
            raise ValueError(f"{operator} needs a whole number of days between 1 and {MAX_DAYS}, got {days!r}")
        first = today - timedelta(days=days - 1)
        if operator == "RECENT_DAYS":
            return day_range(first, today + one_day)
        return DateWindow(None, start_of_day(first, zone))
    raise ValueError(f"{operator!r} is not a date operator")


def to_epoch_ms(moment: datetime) -> int:
    """``moment`` as epoch milliseconds (exact integer arithmetic, no float rounding)."""
    return (moment - EPOCH) // timedelta(milliseconds=1)


# --- Java-style date patterns ------------------------------------------------------------

# Fields in the only order that keeps text order equal to time order.
PATTERN_FIELDS = ("yyyy", "MM", "dd", "HH", "mm", "ss", "SSS")
_FORMATTERS = {
    "yyyy": lambda m: f"{m.year:04d}",
    "MM": lambda m: f"{m.month:02d}",
    "dd": lambda m: f"{m.day:02d}",
    "HH": lambda m: f"{m.hour:02d}",
    "mm": lambda m: f"{m.minute:02d}",
    "ss": lambda m: f"{m.second:02d}",
    "SSS": lambda m: f"{m.microsecond // 1000:03d}",
}


@dataclass(frozen=True, slots=True)
class DatePattern:
    """A parsed Java-style pattern such as ``yyyy-MM-dd HH:mm:ss``.

    ``parts`` alternates fields (``("field", "yyyy")``) and fixed text
    (``("text", "-")``).
    """

    pattern: str
    parts: tuple[tuple[str, str], ...]

    def format(self, moment: datetime) -> str:
        """The wall-clock fields of ``moment`` (in its own zone) written in this pattern."""
        return "".join(_FORMATTERS[value](moment) if kind == "field" else value for kind, value in self.parts)


@functools.lru_cache(maxsize=256)
def parse_date_pattern(pattern: str) -> DatePattern:
    """Parse ``pattern`` or raise ``ValueError`` saying what is wrong.

    Supported letters: ``yyyy MM dd HH mm ss SSS``; other characters are kept
    as fixed text, and ``'...'`` quotes letters as text (``''`` is a quote).
    The fields must come in that order, starting with ``yyyy``, ``MM``,
    ``dd`` and stopping anywhere after: only then does comparing the stored
    text compare the instants, which is what the date operators do.
    """
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("must be a non-empty string such as 'yyyy-MM-dd'")
    parts: list[tuple[str, str]] = []
    text: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "'":
            end = pattern.find("'", i + 1)
            if end == -1:
                raise ValueError(f"unclosed quote in {pattern!r}")
            text.append(pattern[i + 1 : end] if end > i + 1 else "'")
            i = end + 1
        elif char.isascii() and char.isalpha():
            run_end = i
            while run_end < len(pattern) and pattern[run_end] == char:
                run_end += 1
            run = pattern[i:run_end]
            if run not in _FORMATTERS:
                raise ValueError(
                    f"unsupported letters {run!r} in {pattern!r}; use {', '.join(PATTERN_FIELDS)} "
                    "and quote other letters ('T')"
                )
            if text:
                parts.append(("text", "".join(text)))
                text = []
            parts.append(("field", run))
            i = run_end
        else:
            text.append(char)
            i += 1
    if text:
        parts.append(("text", "".join(text)))
    fields = tuple(value for kind, value in parts if kind == "field")
    if len(fields) < 3 or fields != PATTERN_FIELDS[: len(fields)]:
        raise ValueError(
            f"{pattern!r} must list its fields from the year down (yyyy, MM, dd, then optionally HH, mm, ss, "
            "SSS) so that text order is time order"
        )
    return DatePattern(pattern, tuple(parts))


def window_bounds(window: DateWindow, pattern: DatePattern | None = None) -> tuple[int | str | None, int | str]:
    """``(low, high)`` to compare a stored field with: epoch ms, or text in ``pattern`` (no low: unbounded below;
    a window always ends)."""

    def bound(moment: datetime) -> int | str:
        return pattern.format(moment) if pattern is not None else to_epoch_ms(moment)

    return (None if window.start is None else bound(window.start)), bound(window.end)

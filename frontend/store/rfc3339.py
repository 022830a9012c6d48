"""RFC 3339 times as kube-proxy reads them: Go's ``time.Parse(time.RFC3339Nano, value)``.

An annotation is any string (the apiserver validates only the annotations' total size),
so this parse is total: it never raises, and answers None for what Go refuses or what
a google.protobuf.Timestamp cannot carry (before year 1 or after year 9999 once the
offset is applied: 0000-12-31T23:59:59Z and 9999-12-31T23:59:59-01:00 both parse in Go).

Go's grammar for that layout, as its general parser applies it (stricter readers of
RFC 3339 refuse some of these; kube-proxy's parse accepts them):
four-digit year; two-digit month 01-12 and day valid in that month (proleptic
Gregorian: year 0 is a leap year); ``T`` (upper case only); hour of one or two digits,
0-23; two-digit minute 0-59 and second 0-59 (no leap second ``:60``); an optional
fraction of one or more digits after ``.`` or ``,`` (beyond nine, truncated to
nanoseconds); then ``Z`` or ``±hh:mm`` with hh up to 24 and mm up to 60; nothing after.
"""

from __future__ import annotations

import re

from svcproxy.wirevalues import TIMESTAMP_MAX, TIMESTAMP_MIN

_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(?:Z|([+-])([0-9]{2}):([0-9]{2}))")
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse(text: str) -> tuple[int, int] | None:
    """``text`` as UTC (seconds since 1970, nanoseconds), or None (Go refuses it, or a
    Timestamp cannot hold it)."""
    match = _TIME.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, sign, off_hours, off_minutes = match.groups()[6:]
    if not (1 <= month <= 12 and 1 <= day <= _days_in(year, month) and hour < 24
            and minute < 60 and second < 60):
        return None
    offset = 0
    if sign is not None:
        if int(off_hours) > 24 or int(off_minutes) > 60:
            return None
        offset = (int(off_hours) * 60 + int(off_minutes)) * 60 * (1 if sign == "+" else -1)
    seconds = (_days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60
               + second - offset)
    if not TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX:
        return None
    nanos = int(fraction[:9].ljust(9, "0")) if fraction else 0
    return seconds, nanos


def _days_in(year: int, month: int) -> int:
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 29 if month == 2 and leap else _DAYS[month - 1]


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to the date (proleptic Gregorian)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468

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
from datetime import datetime, timedelta

from svcproxy.wirevalues import TIMESTAMP_MAX, TIMESTAMP_MIN

_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(?:Z|([+-])([0-9]{2}):([0-9]{2}))")
_HOURS = frozenset([str(h) for h in range(10)] + [f"{h:02d}" for h in range(24)])
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)


def parse(text: str) -> tuple[int, int] | None:
    """``text`` as UTC (seconds since 1970, nanoseconds), or None (Go refuses it, or a
    Timestamp cannot hold it)."""
    match = _TIME.fullmatch(text) if isinstance(text, str) else None
    if match is None or match.group(4) not in _HOURS:
        return None
    hour_end = match.end(4)
    # The shape is Go's; datetime (in C) checks month, day in month, minute and second.
    local = ("0400" if text.startswith("0000") else text[:4]) + text[4:11] \
        + ("0" if hour_end == 12 else "") + text[11:match.end(6)]
    try:
        seconds = (datetime.fromisoformat(local) - _EPOCH) // _SECOND
    except ValueError:
        return None
    if text.startswith("0000"):  # as year 400, 400 Gregorian years (146,097 days) back
        seconds -= 146_097 * 86_400
    fraction, sign, off_hours, off_minutes = match.group(7, 8, 9, 10)
    if sign is not None:
        if off_hours > "24" or off_minutes > "60":  # Go's range check is > (two digits)
            return None
        offset = (int(off_hours) * 60 + int(off_minutes)) * 60
        seconds += -offset if sign == "+" else offset
    if not TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX:
        return None
    return seconds, int(fraction[:9].ljust(9, "0")) if fraction else 0

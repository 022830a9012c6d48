"""The last-change-trigger-time annotation is read as kube-proxy reads it (Go's
time.Parse(time.RFC3339Nano)): every time Go takes, over its whole range, is the same
instant here or, past what a Timestamp carries, no trigger time; anything else is no
trigger time; and no string at all makes the parse raise."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.edge import rfc3339
from svcproxy.frontend.edge.endpointslice import trigger_time_problem
from svcproxy.frontend.edge.objects import parse_time
from svcproxy.wirevalues import LATEST, TIMESTAMP_MAX, TIMESTAMP_MIN, timestamp_parts

EPOCH = datetime(1970, 1, 1)


@st.composite
def go_times(draw: st.DrawFn) -> tuple[str, int, int]:
    """A time Go's parse takes (year 0000-9999, offsets up to ±24:60, a fraction of any
    length after . or ,), its UTC seconds and nanoseconds."""
    year = draw(st.integers(0, 9999))
    month = draw(st.integers(1, 12))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    day = draw(st.integers(1, days))
    hour, minute, second = (draw(st.integers(0, 23)), draw(st.integers(0, 59)),
                            draw(st.integers(0, 59)))
    hour_text = draw(st.sampled_from([f"{hour:02d}", str(hour)]))
    digits = draw(st.text("0123456789", min_size=1, max_size=20) | st.just(""))
    fraction = draw(st.sampled_from(".,")) + digits if digits else ""
    zone, offset = "Z", 0
    if draw(st.booleans()):
        sign = draw(st.sampled_from("+-"))
        oh, om = draw(st.integers(0, 24)), draw(st.integers(0, 60))
        zone = f"{sign}{oh:02d}:{om:02d}"
        offset = (oh * 60 + om) * 60 * (1 if sign == "+" else -1)
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour_text}:{minute:02d}:{second:02d}" \
        f"{fraction}{zone}"
    # Year 0 as year 400 (the Gregorian calendar repeats every 400 years, 146,097 days),
    # 400 years back: Python's calendar starts at year 1.
    local = datetime(year + 400 if year == 0 else year, month, day, hour, minute, second)
    seconds = (local - EPOCH) // timedelta(seconds=1) - offset
    if year == 0:
        seconds -= 146_097 * 86_400
    return text, seconds, int(digits[:9].ljust(9, "0")) if digits else 0


@given(go_times())
@example(("9999-12-31T23:59:59.999999999Z", TIMESTAMP_MAX, 999_999_999))
@example(("0001-01-01T00:00:00Z", TIMESTAMP_MIN, 0))
@example(("9999-12-31T23:59:59-00:01", TIMESTAMP_MAX + 60, 0))  # just past, in UTC
@example(("0001-01-01T00:00:00+00:01", TIMESTAMP_MIN - 60, 0))
@example(("9999-12-31T23:59:59-24:60", TIMESTAMP_MAX + 90_000, 0))
@example(("0000-12-31T23:59:59Z", TIMESTAMP_MIN - 1, 0))  # Go takes year 0
@example(("0000-12-31T23:00:00-01:00", TIMESTAMP_MIN, 0))  # ... which may be year 1 in UTC
@example(("2026-03-01T10:00:00+24:00", 1_772_272_800, 0))
@example(("2026-03-01T10:00:00.1234567891234+00:60", 1_772_355_600, 123_456_789))
@example(("2026-03-01T1:02:03,5Z", 1_772_326_923, 500_000_000))
@settings(max_examples=150, deadline=None)
def test_every_time_go_takes_is_the_same_instant_or_none(
        case: tuple[str, int, int]) -> None:
    text, seconds, nanos = case
    parsed = rfc3339.parse(text)
    if not TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX:
        assert parsed is None
        return
    assert parsed == (seconds, nanos)
    unix = parse_time(text)
    assert unix == (min(seconds + nanos / 1e9, LATEST) if seconds >= 0 else 0.0)
    assert (trigger_time_problem(text) is None) == (parsed > (0, 0))
    if unix:
        assert timestamp_parts(unix) is not None  # and so it reaches the wire


@pytest.mark.parametrize("text", [
    "2026-03-01T10:00:60Z",  # no leap second
    "2026-03-01T24:00:00Z",
    "2026-03-01T10:60:00Z",
    "2026-02-29T10:00:00Z",  # not a leap year
    "1900-02-29T10:00:00Z",
    "2026-13-01T10:00:00Z",
    "2026-00-01T10:00:00Z",
    "2026-03-00T10:00:00Z",
    "2026-03-01T10:00:00+25:00",
    "2026-03-01T10:00:00+24:61",
    "2026-03-01t10:00:00Z",  # Go's layout matches T and Z in upper case only
    "2026-03-01T10:00:00z",
    "2026-03-01 10:00:00Z",
    "2026-03-01T10:00:00",  # no offset
    "2026-03-01",
    "2026-03-01T10:00Z",
    "2026-03-01T10:00:00.Z",
    "2026-03-01T10:00:00Z\n",
    "2026-03-01T10:00:00+0100",
    "20260301T100000Z",
    "+2026-03-01T10:00:00Z",
    "\uff12026-03-01T10:00:00Z",  # a full-width digit
    "2026-03-01T123:00:00Z",
    "",
])
def test_what_go_refuses_is_no_trigger_time(text: str) -> None:
    assert rfc3339.parse(text) is None
    assert parse_time(text) == 0.0
    assert trigger_time_problem(text) is not None


@given(st.text() | st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T.*", fullmatch=True))
def test_no_string_makes_the_parse_raise(text: str) -> None:
    parsed = rfc3339.parse(text)
    assert parsed is None or TIMESTAMP_MIN <= parsed[0] <= TIMESTAMP_MAX


def test_a_value_not_a_string_is_no_trigger_time() -> None:
    for value in (None, 0, 1.5, ["2026-03-01T10:00:00Z"], {"a": 1}):
        assert rfc3339.parse(value) is None  # type: ignore[arg-type]
        assert parse_time(value) == 0.0

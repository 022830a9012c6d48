"""The clock the packet path stamps flows with (CLOCK_MONOTONIC, bpf_ktime_get_ns's: time
since boot). A test that ages a flow by writing its last-seen time back needs that clock
to have run at least as long as the age: a flow cannot have been idle since before the
machine booted, and a machine booted minutes ago (a fresh CI machine) has not run an hour."""

from __future__ import annotations

import time

NS = 1_000_000_000


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def clock_past(age_s: float) -> int:
    """The clock, once it is past ``age_s`` seconds since boot; on a machine booted less
    than that ago, waits until it is (at most ``age_s``)."""
    age = int(age_s * NS)
    while (now := now_ns()) <= age:
        time.sleep(min(1.0, (age - now) / NS + 0.001))
    return now


def stamp_aged(age_s: float) -> int:
    """The last-seen time of a flow idle ``age_s`` seconds now."""
    return clock_past(age_s) - int(age_s * NS)

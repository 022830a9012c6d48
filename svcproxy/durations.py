"""Go-style durations as kube-proxy's flags accept them ("1s", "500ms", "1m30s", "0")."""

from __future__ import annotations

import re

_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek small mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
# Go's time.Duration is an int64 of nanoseconds: time.ParseDuration refuses more.
_MAX_NANOSECONDS = 2**63 - 1
# time.ParseDuration's grammar: a number (digits, a point, digits; one side may be empty)
# and a unit: the run of characters up to the next digit or point.
_PART = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")


def parse_duration(text: str) -> float:
    """Seconds in a duration Go's ``time.ParseDuration`` accepts, negative ones excepted
    (kube-proxy's validation refuses those for every duration it reads); raises
    ValueError for anything else."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return 0.0
    if text.startswith("-") or not body:
        raise ValueError(f"invalid duration {text!r} (examples: 1s, 500ms, 1m30s, 0)")
    total = 0
    pos = 0
    while pos < len(body):
        match = _PART.match(body, pos)
        assert match is not None  # every group of _PART may be empty
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        if not (whole or fraction) or unit not in _NANOSECONDS:
            raise ValueError(f"invalid duration {text!r} (examples: 1s, 500ms, 1m30s, 0)")
        scale = _NANOSECONDS[unit]
        total += int(whole or 0) * scale + int(fraction or 0) * scale // 10 ** len(fraction)
        if total > _MAX_NANOSECONDS:
            raise ValueError(f"invalid duration {text!r}: longer than Go's longest, "
                             "2562047h47m16.854775807s")
        pos = match.end()
    return total / 1e9


def format_duration(seconds: float) -> str:
    """A short human form of a duration, for log lines and --help defaults."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"

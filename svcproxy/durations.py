"""Go-style durations as kube-proxy's flags accept them ("1s", "500ms", "1m30s", "0")."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration; raises ValueError for anything else (negative included)."""
    text = text.strip()
    if text in ("0", "+0"):
        return 0.0
    body = text[1:] if text.startswith("+") else text
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        raise ValueError(f"invalid duration {text!r} (examples: 1s, 500ms, 1m30s, 0)")
    return total


def format_duration(seconds: float) -> str:
    """A short human form of a duration, for log lines and --help defaults."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"

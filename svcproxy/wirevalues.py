"""The values that cross the wire, one converter per type on each side, each total.

The frontend's encoder turns every model value into what a protobuf field can carry
(``timestamp_parts``, ``utf8``; integers go as they are); the SDK's decoder turns every value a
field can carry back into a model value (``unix_seconds``; strings and integers come
out of protobuf as they are). Neither raises for any input: a value past what the
field holds degrades that field (no trigger time, an empty string is never made up),
and every value Kubernetes allows is carried exactly. docs/wire-values.md lists each
domain and what happens past it.
"""

from __future__ import annotations

import codecs
import math
import re

# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
TIMESTAMP_MIN = -62_135_596_800
TIMESTAMP_MAX = 253_402_300_799
NANOS = 1_000_000_000
# The latest float (Unix seconds) a Timestamp holds: the float model cannot tell
# 9999-12-31T23:59:59.99999x from the second after, so intake rounds down to this.
LATEST = math.nextafter(float(TIMESTAMP_MAX + 1), 0.0)

_SURROGATES = re.compile("[\ud800-\udfff]")
# str.encode's error handler writing U+FFFD for each lone surrogate: valid UTF-8 in one
# C call, the handler called only when there is one.
REPLACE = "svcproxy.wire-replace"


def _replace(err: UnicodeError) -> tuple[bytes, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return "\ufffd".encode() * (err.end - err.start), err.end


codecs.register_error(REPLACE, _replace)


def timestamp_parts(unix: float) -> tuple[int, int] | None:
    """A trigger time (Unix seconds; 0.0 none) as a Timestamp's (seconds, nanos), or
    None when there is none or it lies outside what a Timestamp holds (NaN, infinite,
    before year 1 or after year 9999 once rounded to nanoseconds)."""
    if not unix or not TIMESTAMP_MIN - 1 <= unix <= TIMESTAMP_MAX + 1:  # NaN is neither
        return None
    seconds = math.floor(unix)  # exact, as the fraction is (unix * NANOS is not)
    nanos = round((unix - seconds) * NANOS)
    if nanos == NANOS:
        seconds, nanos = seconds + 1, 0
    if not TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX:
        return None
    return seconds, nanos


def unix_seconds(seconds: int, nanos: int) -> float:
    """A Timestamp's (seconds, nanos) as Unix seconds, 0.0 (no trigger time) for any pair
    outside a valid Timestamp (seconds past year 1..9999, nanos outside 0..999999999)."""
    if not TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX or not 0 <= nanos < NANOS:
        return 0.0
    return (seconds * NANOS + nanos) / NANOS


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, which a protobuf string must be: a lone surrogate (a JSON or
    YAML escape of half a pair) becomes U+FFFD, as the apiserver's JSON decoding stores
    it; every other code point as it is."""
    return text.encode("utf-8", REPLACE)


def wire_text(text: str) -> str:
    """``text`` as a protobuf string field takes it (what ``utf8`` writes, as a str)."""
    return text if text.isascii() or not _SURROGATES.search(text) \
        else _SURROGATES.sub("\ufffd", text)


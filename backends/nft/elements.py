"""The elements of the sets and maps the backend fills, as the kernel holds them (pure).

The renderer writes an element as text (``10.96.0.1 . tcp . 80`` -> ``goto lb-1``); the
kernel holds its key as the concatenated fields' bytes (each padded to 4), a data map's
value likewise, a verdict map's value as a verdict (read back as its text). The drift
check compares the two in these terms, each applied element encoded once.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from .context import TableContext
from .kernel_view import ADDR, PORT, PROTO, U32, Encoder, Layout, encoder
from .names import lb_map
from .render_skeleton import SETS

Held = bytes | str  # an element's value as read: data bytes, a verdict's text, b"" (a set)

_SERVICE = (ADDR, PROTO, PORT)
_NODEPORT = (PROTO, PORT)
_ENDPOINTS = ((ADDR, PROTO, PORT, U32), (ADDR, PORT))
LAYOUTS: dict[str, tuple[Layout, Layout]] = {
    "cluster-ips": ((ADDR,), ()),
    "hairpin": ((ADDR, ADDR), ()),
    "service-ips": (_SERVICE, ()),
    "no-endpoint-services": (_SERVICE, ()),
    "firewall-ips": (_SERVICE, ()),
    "service-nodeports": (_NODEPORT, ()),
    "no-endpoint-nodeports": (_NODEPORT, ()),
}


def layouts(ctx: TableContext, lb_sizes: set[int]) -> dict[str, tuple[Layout, Layout]]:
    """The sets and maps whose elements are compared, with their key and value layouts."""
    found = dict(LAYOUTS)
    if ctx.nodeport_ips is not None:
        found["nodeport-ips"] = ((ADDR,), ())
    for n in lb_sizes:
        found[lb_map(n)] = _ENDPOINTS
    return found


@cache
def _encoders(ipx: str, container: str) -> tuple[Encoder, Encoder]:
    key, value = _ENDPOINTS if container.startswith("endpoints-") else LAYOUTS[container]
    return encoder(key, ipx), encoder(value, ipx)


def encode(ipx: str, container: str, key: str, value: str) -> tuple[bytes, Held]:
    """An element as the kernel holds it: (key bytes, value as read)."""
    encode_key, encode_value = _encoders(ipx, container)
    if container in SETS:
        return encode_key(key), b""
    if container.startswith("endpoints-"):
        return encode_key(key), encode_value(value)
    return encode_key(key), value


Encoded = dict[str, dict[bytes, Held]]  # container -> key bytes -> value as held


def encode_all(ipx: str, applied: Mapping[tuple[str, str], tuple[str, object]]) -> Encoded:
    """Every applied element, encoded (once per table: commits keep it up to date)."""
    out: Encoded = {}
    for (container, key), (value, _) in applied.items():
        items = out.get(container)
        if items is None:
            items = out[container] = {}
        raw, held = encode(ipx, container, key, value)
        items[raw] = held
    return out


def update(encoded: Encoded, ipx: str, eid: tuple[str, str], old: str | None,
           new: str | None) -> None:
    """One element's applied value changed from ``old`` to ``new`` (None: absent)."""
    container, key = eid
    items = encoded.setdefault(container, {})
    if old is not None:
        items.pop(encode(ipx, container, key, old)[0], None)
    if new is not None:
        raw, held = encode(ipx, container, key, new)
        items[raw] = held

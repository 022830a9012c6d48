"""Netlink messages and attributes, built and read with ``struct`` (pure: no sockets).

The one reader and writer of netlink framing for every kernel client in svcproxy
(rtnetlink, generic netlink for IPVS, nfnetlink for conntrack and nfacct); a backend
author speaking another netlink family can use it too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
ATTR_HEADER = struct.Struct("=HH")  # nlattr: length, type
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_ERRNO = struct.Struct("=i")


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    """One netlink message: its header, then ``body``."""
    return HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes."""
    length = ATTR_HEADER.size + len(payload)
    return ATTR_HEADER.pack(length, kind) + payload + b"\0" * (-length % 4)


def nested(kind: int, *children: bytes) -> bytes:
    """An attribute holding ``children``, flagged NLA_F_NESTED."""
    return attr(kind | NLA_F_NESTED, b"".join(children))


def message_spans(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, body start, body end) of each message in a received buffer;
    stops at a truncated or malformed header."""
    at = 0
    while at + HEADER.size <= len(data):
        length, kind, flags, seq, _pid = HEADER.unpack_from(data, at)
        if length < HEADER.size:
            return
        yield kind, flags, seq, at + HEADER.size, min(at + length, len(data))
        at += (length + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, body) of each message in a received buffer."""
    for kind, flags, seq, start, end in message_spans(data):
        yield kind, flags, seq, data[start:end]


def error_code(data: bytes, at: int = 0) -> int:
    """The errno (positive, 0 for an ACK) of the NLMSG_ERROR body at ``at``."""
    return -int(_ERRNO.unpack_from(data, at)[0])


def attr_spans(data: bytes, start: int = 0, end: int | None = None
               ) -> Iterator[tuple[int, int, int]]:
    """(type without flags, payload start, payload end) of the attributes in
    ``data[start:end]``; stops at a truncated or malformed one."""
    end = len(data) if end is None else end
    while start + ATTR_HEADER.size <= end:
        length, kind = ATTR_HEADER.unpack_from(data, start)
        if length < ATTR_HEADER.size or start + length > end:
            return
        yield kind & NLA_TYPE_MASK, start + ATTR_HEADER.size, start + length
        start += (length + 3) & ~3


def iter_attrs(data: bytes, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each attribute from ``start`` on."""
    for kind, a, b in attr_spans(data, start):
        yield kind, data[a:b]


def attrs(data: bytes, start: int = 0) -> dict[int, bytes]:
    """The attributes from ``start`` on, by type (the last of each type)."""
    return {kind: data[a:b] for kind, a, b in attr_spans(data, start)}

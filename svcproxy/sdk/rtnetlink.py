"""The network namespace's addresses and default routes, read with one rtnetlink dump each.

A few dozen lines of netlink instead of pyroute2, whose package import alone (~0.2 s of
CPU: it loads every netlink family it supports) was a seventh of a backend's cold start.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from svcproxy.sdk import netlink

_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
# rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTM_NEWADDR, _RTM_GETADDR, _RTM_NEWROUTE, _RTM_GETROUTE = 20, 22, 24, 26
_IFA_ADDRESS, _IFA_FLAGS = 1, 8
_RTA_DST, _RTA_OIF, _RTA_PRIORITY, _RTA_PREFSRC = 1, 4, 6, 7


@dataclass(frozen=True, slots=True)
class AddressEntry:
    """One RTM_NEWADDR: the interface's index, the family (socket.AF_INET/AF_INET6), the
    address (IFA_ADDRESS), its scope and flags (IFA_FLAGS when given, else ifa_flags)."""

    family: int
    index: int
    address: str
    scope: int
    flags: int


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """One default route (no RTA_DST): its family, output interface, preferred source and
    metric (0 when absent)."""

    family: int
    oif: int
    prefsrc: str
    priority: int


def _dump(kind: int, body: bytes) -> Iterator[tuple[int, bytes]]:
    """(message type, body) of every answer to one dump request; raises OSError for a
    netlink error."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        sock.sendall(netlink.message(kind, netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP, 1, body))
        while True:
            data = sock.recv(1 << 16)
            for mtype, _flags, _seq, msg in netlink.messages(data):
                if mtype == netlink.NLMSG_DONE:
                    return
                if mtype == netlink.NLMSG_ERROR:
                    if code := netlink.error_code(msg):
                        raise OSError(code, os.strerror(code))
                    return
                yield mtype, msg


def _ip(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def addresses() -> list[AddressEntry]:
    """Every address of every interface in this network namespace (both families)."""
    out = []
    body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    for mtype, msg in _dump(_RTM_GETADDR, body):
        if mtype != _RTM_NEWADDR:
            continue
        family, _prefix, flags, scope, index = _IFADDRMSG.unpack_from(msg)
        attrs = netlink.attrs(msg, _IFADDRMSG.size)
        if family not in (socket.AF_INET, socket.AF_INET6) or _IFA_ADDRESS not in attrs:
            continue
        if _IFA_FLAGS in attrs:
            flags = struct.unpack("=I", attrs[_IFA_FLAGS])[0] or flags
        out.append(AddressEntry(family, index, _ip(attrs[_IFA_ADDRESS]), scope, flags))
    return out


def default_routes(family: int) -> list[RouteEntry]:
    """The routes of ``family`` without a destination (default routes), any table."""
    out = []
    body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    for mtype, msg in _dump(_RTM_GETROUTE, body):
        if mtype != _RTM_NEWROUTE or msg[0] != family:
            continue
        attrs = netlink.attrs(msg, _RTMSG.size)
        if _RTA_DST in attrs:
            continue
        oif = struct.unpack("=I", attrs[_RTA_OIF])[0] if _RTA_OIF in attrs else 0
        metric = struct.unpack("=I", attrs[_RTA_PRIORITY])[0] if _RTA_PRIORITY in attrs else 0
        src = _ip(attrs[_RTA_PREFSRC]) if _RTA_PREFSRC in attrs else ""
        out.append(RouteEntry(family, oif, src, metric))
    return out


def interface_index(name: str) -> int | None:
    """The index of the interface called ``name`` here, None when there is none."""
    try:
        return socket.if_nametoindex(name)
    except OSError:
        return None

"""rtnetlink requests for the service addresses on kube-ipvs0 and local routes (pure).

Thousands of ClusterIPs are bound at start-up; one pyroute2 call per address
costs ~12 ms in the emulated guest, so these requests are built here and sent
in batches like the IPVS ones.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from svcproxy.sdk import netlink

RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_CREATE = 0x400
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_FLAGS = 8
IFA_F_NODAD = 0x02
RTA_DST = 1
RTA_OIF = 4
RTA_TABLE = 15
RT_TABLE_LOCAL = 255
RTPROT_KERNEL = 2
RTN_LOCAL = 2
RT_SCOPE_HOST = 254
ADD_FLAGS = NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE


def _family_and_raw(address: str) -> tuple[int, bytes, int]:
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, ip.packed, ip.max_prefixlen


def address_body(address: str, ifindex: int) -> bytes:
    """ifaddrmsg + attributes for a host address (/32 or /128, no DAD) on ``ifindex``."""
    family, raw, plen = _family_and_raw(address)
    head = struct.pack("=BBBBI", family, plen, 0, 0, ifindex)
    return head + netlink.attr(IFA_LOCAL, raw) + netlink.attr(IFA_ADDRESS, raw) + netlink.attr(
        IFA_FLAGS, struct.pack("=I", IFA_F_NODAD))


def local_route_body(address: str, ifindex: int) -> bytes:
    """rtmsg + attributes for a ``local`` route to ``address`` in the local table."""
    family, raw, plen = _family_and_raw(address)
    head = struct.pack("=BBBBBBBBI", family, plen, 0, 0, RT_TABLE_LOCAL, RTPROT_KERNEL,
                       RT_SCOPE_HOST, RTN_LOCAL, 0)
    return (head + netlink.attr(RTA_DST, raw)
            + netlink.attr(RTA_OIF, struct.pack("=I", ifindex))
            + netlink.attr(RTA_TABLE, struct.pack("=I", RT_TABLE_LOCAL)))


RTM_GETADDR = 22
RTM_GETROUTE = 26
NLM_F_DUMP = 0x300


def dump_addresses_body() -> bytes:
    """An RTM_GETADDR dump request for every family."""
    return struct.pack("=BBBBI", 0, 0, 0, 0, 0)


def dump_routes_body(family: int) -> bytes:
    return struct.pack("=BBBBBBBBI", family, 0, 0, 0, 0, 0, 0, 0, 0)


def _text(family: int, raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if family == socket.AF_INET6 else socket.AF_INET, raw)


def parse_address(payload: bytes) -> tuple[int, str] | None:
    """(ifindex, address) of an RTM_NEWADDR message."""
    family, _plen, _flags, _scope, index = struct.unpack_from("=BBBBI", payload)
    found = netlink.attrs(payload, 8)
    raw = found.get(IFA_LOCAL) or found.get(IFA_ADDRESS)
    if raw is None or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    if family == socket.AF_INET6 and IFA_ADDRESS in found:
        raw = found[IFA_ADDRESS]
    return index, _text(family, raw)


def parse_local_route(payload: bytes) -> tuple[int, str] | None:
    """(output ifindex, destination) of a ``local`` route in the local table, else None."""
    family, dst_len, _s, _t, table, _p, _scope, kind, _f = struct.unpack_from(
        "=BBBBBBBBI", payload)
    found = netlink.attrs(payload, 12)
    if RTA_TABLE in found:
        table = struct.unpack("=I", found[RTA_TABLE][:4])[0]
    if kind != RTN_LOCAL or table != RT_TABLE_LOCAL or RTA_DST not in found:
        return None
    if dst_len != (128 if family == socket.AF_INET6 else 32):
        return None
    oif = struct.unpack("=I", found[RTA_OIF][:4])[0] if RTA_OIF in found else 0
    return oif, _text(family, found[RTA_DST])

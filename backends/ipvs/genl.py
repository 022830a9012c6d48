"""IPVS generic-netlink messages as bytes, and their parsing (pure).

pyroute2's IPVS class sends one request per call and costs ~12 ms per
operation in the emulated guest; programming thousands of virtual servers that
way takes minutes. These encoders build the same messages (checked against
pyroute2's encoder in the tests) so that the adapter can send hundreds of them
in one ``send`` and read the acknowledgements in bulk.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
from dataclasses import dataclass

from svcproxy.sdk import netlink

CMD_NEW_SERVICE = 1
CMD_SET_SERVICE = 2
CMD_DEL_SERVICE = 3
CMD_GET_SERVICE = 4
CMD_NEW_DEST = 5
CMD_SET_DEST = 6
CMD_DEL_DEST = 7
CMD_GET_DEST = 8
CMD_SET_CONFIG = 12
CMD_GET_CONFIG = 13

ATTR_SERVICE = 1
ATTR_DEST = 2
ATTR_TIMEOUT_TCP = 4
ATTR_TIMEOUT_TCP_FIN = 5
ATTR_TIMEOUT_UDP = 6

SVC_AF = 1
SVC_PROTOCOL = 2
SVC_ADDR = 3
SVC_PORT = 4
SVC_FWMARK = 5
SVC_SCHED_NAME = 6
SVC_FLAGS = 7
SVC_TIMEOUT = 8
SVC_NETMASK = 9

DEST_ADDR = 1
DEST_PORT = 2
DEST_FWD_METHOD = 3
DEST_WEIGHT = 4
DEST_U_THRESH = 5
DEST_L_THRESH = 6
DEST_ACTIVE_CONNS = 7
DEST_INACT_CONNS = 8
DEST_PERSIST_CONNS = 9
DEST_ADDR_FAMILY = 11

FLAG_PERSISTENT = 0x1
FLAG_HASHED = 0x2
FWD_MASQ = 0
GENL_VERSION = 1

FWMARK = "FWMARK"
PROTOCOLS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP, "SCTP": 132}
PROTOCOL_NAMES = {v: k for k, v in PROTOCOLS.items()}


@dataclass(frozen=True, slots=True, order=True)
class ServiceId:
    """What identifies an IPVS virtual server: protocol, address, port.

    A firewall-mark virtual server has protocol FWMARK, the family's any-address
    ("0.0.0.0" or "::") and the mark as its port."""

    protocol: str
    address: str
    port: int

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.address else socket.AF_INET

    @property
    def is_fwmark(self) -> bool:
        return self.protocol == FWMARK

    def __str__(self) -> str:
        if self.is_fwmark:
            return f"FWMARK/{self.port:#x}/ipv{6 if ':' in self.address else 4}"
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.protocol}/{host}:{self.port}"


def fwmark_service(family: int, mark: int) -> ServiceId:
    """The id of a firewall-mark virtual server of one IP family (4 or 6)."""
    return ServiceId(FWMARK, "::" if family == 6 else "0.0.0.0", mark)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A virtual server as programmed: scheduler and persistence."""

    id: ServiceId
    scheduler: str = "rr"
    persistence_timeout: int = 0


@dataclass(frozen=True, slots=True, order=True)
class DestId:
    address: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class DestStats:
    """A real server as the kernel reports it."""

    id: DestId
    weight: int
    fwd_method: int
    active: int
    inactive: int


def _u16(kind: int, value: int) -> bytes:
    return netlink.attr(kind, struct.pack("=H", value))


def _u32(kind: int, value: int) -> bytes:
    return netlink.attr(kind, struct.pack("=I", value))


def _be16(kind: int, value: int) -> bytes:
    return netlink.attr(kind, struct.pack(">H", value))


def _addr(address: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)


@functools.lru_cache(maxsize=1 << 16)
def service_key_attrs(service: ServiceId) -> bytes:
    """The attributes that name a virtual server (enough for delete and dest calls)."""
    if service.is_fwmark:
        return _u16(SVC_AF, service.family) + _u32(SVC_FWMARK, service.port)
    return (
        _u16(SVC_AF, service.family)
        + _u16(SVC_PROTOCOL, PROTOCOLS[service.protocol])
        + netlink.attr(SVC_ADDR, _addr(service.address))
        + _be16(SVC_PORT, service.port)
    )


def service_attrs(spec: ServiceSpec) -> bytes:
    """Every attribute the kernel needs to create or change a virtual server."""
    flags = FLAG_PERSISTENT if spec.persistence_timeout else 0
    netmask = 0xFFFFFFFF if spec.id.family == socket.AF_INET else 128
    return (
        service_key_attrs(spec.id)
        + netlink.attr(SVC_SCHED_NAME, spec.scheduler.encode() + b"\0")
        + netlink.attr(SVC_FLAGS, struct.pack("=II", flags, 0xFFFF))
        + _u32(SVC_TIMEOUT, spec.persistence_timeout)
        + _u32(SVC_NETMASK, netmask)
    )


_DEST_LAYOUT = "=HH{n}sHHH2xHHIHHIHHIHHIHHH2x"
_DEST = {4: struct.Struct(_DEST_LAYOUT.format(n=4)), 16: struct.Struct(_DEST_LAYOUT.format(n=16))}


def dest_attrs(dest: DestId, weight: int) -> bytes:
    """A NAT (masquerading) real server with the given weight, in one struct.pack (hot path)."""
    raw = _addr(dest.address)
    family = socket.AF_INET6 if len(raw) == 16 else socket.AF_INET
    return _DEST[len(raw)].pack(
        4 + len(raw), DEST_ADDR, raw, 6, DEST_PORT, socket.htons(dest.port),
        8, DEST_FWD_METHOD, FWD_MASQ, 8, DEST_WEIGHT, weight, 8, DEST_U_THRESH, 0,
        8, DEST_L_THRESH, 0, 6, DEST_ADDR_FAMILY, family,
    )


def genl_body(cmd: int, attrs: bytes) -> bytes:
    """A generic-netlink payload: genlmsghdr, then the attributes."""
    return struct.pack("=BBH", cmd, GENL_VERSION, 0) + attrs


def frame(msg_type: int, body: bytes, seq: int, flags: int = netlink.NLM_F_ACK) -> bytes:
    """One complete netlink message: nlmsghdr, then ``body``."""
    return netlink.message(msg_type, netlink.NLM_F_REQUEST | flags, seq, body)


def message(family_id: int, cmd: int, attrs: bytes, seq: int,
            flags: int = netlink.NLM_F_ACK) -> bytes:
    """One complete IPVS request: nlmsghdr, genlmsghdr, attributes."""
    return frame(family_id, genl_body(cmd, attrs), seq, flags)


def nested(kind: int, payload: bytes) -> bytes:
    """A nested attribute, without NLA_F_NESTED (as pyroute2 and ipvsadm send it)."""
    return netlink.attr(kind, payload)


def add_service(spec: ServiceSpec) -> tuple[int, bytes]:
    return CMD_NEW_SERVICE, nested(ATTR_SERVICE, service_attrs(spec))


def set_service(spec: ServiceSpec) -> tuple[int, bytes]:
    return CMD_SET_SERVICE, nested(ATTR_SERVICE, service_attrs(spec))


def del_service(service: ServiceId) -> tuple[int, bytes]:
    return CMD_DEL_SERVICE, nested(ATTR_SERVICE, service_key_attrs(service))


def add_dest(service: ServiceId, dest: DestId, weight: int) -> tuple[int, bytes]:
    return CMD_NEW_DEST, _service_and_dest(service, dest_attrs(dest, weight))


def set_dest(service: ServiceId, dest: DestId, weight: int) -> tuple[int, bytes]:
    return CMD_SET_DEST, _service_and_dest(service, dest_attrs(dest, weight))


def del_dest(service: ServiceId, dest: DestId) -> tuple[int, bytes]:
    return CMD_DEL_DEST, _service_and_dest(
        service, netlink.attr(DEST_ADDR, _addr(dest.address)) + _be16(DEST_PORT, dest.port)
    )


def set_timeouts(tcp: int, tcp_fin: int, udp: int) -> tuple[int, bytes]:
    """Connection timeouts in seconds; 0 leaves a value unchanged."""
    return CMD_SET_CONFIG, (
        _u32(ATTR_TIMEOUT_TCP, tcp) + _u32(ATTR_TIMEOUT_TCP_FIN, tcp_fin)
        + _u32(ATTR_TIMEOUT_UDP, udp)
    )


def dump_dests(service: ServiceId) -> tuple[int, bytes]:
    return CMD_GET_DEST, nested(ATTR_SERVICE, service_key_attrs(service))


def _service_and_dest(service: ServiceId, dest: bytes) -> bytes:
    return nested(ATTR_SERVICE, service_key_attrs(service)) + nested(ATTR_DEST, dest)


def _nested_attrs(payload: bytes, wanted: int) -> dict[int, bytes]:
    """The attributes inside the top-level attribute ``wanted`` of a genl payload."""
    for kind, value in netlink.iter_attrs(payload[4:]):
        if kind == wanted:
            return dict(netlink.iter_attrs(value))
    return {}


def _ip(family: int, raw: bytes) -> str:
    size = 16 if family == socket.AF_INET6 else 4
    return str(ipaddress.ip_address(raw[:size]))


def parse_service(payload: bytes) -> ServiceSpec | None:
    """A virtual server from a GET_SERVICE reply; None if it is incomplete."""
    attrs = _nested_attrs(payload, ATTR_SERVICE)
    family = struct.unpack("=H", attrs[SVC_AF][:2])[0] if SVC_AF in attrs else 0
    if SVC_FWMARK in attrs and struct.unpack("=I", attrs[SVC_FWMARK][:4])[0]:
        mark = struct.unpack("=I", attrs[SVC_FWMARK][:4])[0]
        sid = fwmark_service(6 if family == socket.AF_INET6 else 4, mark)
    elif SVC_ADDR in attrs and SVC_PORT in attrs and SVC_PROTOCOL in attrs:
        protocol = PROTOCOL_NAMES.get(struct.unpack("=H", attrs[SVC_PROTOCOL][:2])[0], "?")
        sid = ServiceId(protocol, _ip(family, attrs[SVC_ADDR]),
                        struct.unpack(">H", attrs[SVC_PORT][:2])[0])
    else:
        return None
    flags = struct.unpack("=I", attrs[SVC_FLAGS][:4])[0] if SVC_FLAGS in attrs else 0
    timeout = struct.unpack("=I", attrs[SVC_TIMEOUT][:4])[0] if SVC_TIMEOUT in attrs else 0
    sched = attrs.get(SVC_SCHED_NAME, b"").split(b"\0")[0].decode()
    return ServiceSpec(
        id=sid,
        scheduler=sched,
        persistence_timeout=timeout if flags & FLAG_PERSISTENT else 0,
    )


_ATTR = struct.Struct("=HH")
_U32, _U16, _BE16 = struct.Struct("=I"), struct.Struct("=H"), struct.Struct(">H")


def _spans(data: bytes, start: int, end: int) -> dict[int, int]:
    """Where each attribute's payload starts in ``data[start:end]``, by type (one tight
    loop: a drift check parses every real server of the node each sync period)."""
    found: dict[int, int] = {}
    unpack = _ATTR.unpack_from
    while start + 4 <= end:
        length, kind = unpack(data, start)
        if length < 4 or start + length > end:
            break
        found[kind & netlink.NLA_TYPE_MASK] = start
        start += (length + 3) & ~3
    return found


@functools.lru_cache(maxsize=1 << 16)
def _ip_of(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def parse_dest(payload: bytes, family: int) -> DestStats:
    """A real server from a GET_DEST reply."""
    top = _spans(payload, 4, len(payload))
    at = top.get(ATTR_DEST)
    if at is None:
        raise ValueError("a real server reply without its attributes")
    end = at + _ATTR.unpack_from(payload, at)[0]
    attrs = _spans(payload, at + 4, end)

    def u32(kind: int) -> int:
        where = attrs.get(kind)
        return int(_U32.unpack_from(payload, where + 4)[0]) if where is not None else 0

    if DEST_ADDR_FAMILY in attrs:
        family = _U16.unpack_from(payload, attrs[DEST_ADDR_FAMILY] + 4)[0]
    addr = attrs[DEST_ADDR] + 4
    raw = payload[addr:addr + (16 if family == socket.AF_INET6 else 4)]
    return DestStats(
        id=DestId(_ip_of(raw), _BE16.unpack_from(payload, attrs[DEST_PORT] + 4)[0]),
        weight=u32(DEST_WEIGHT),
        fwd_method=u32(DEST_FWD_METHOD) & 0x7,
        active=u32(DEST_ACTIVE_CONNS),
        inactive=u32(DEST_INACT_CONNS),
    )

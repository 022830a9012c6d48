"""The maps' key and value layouts, mirrored from bpf/svcproxy_sock.bpf.c (pure); their
names are in ``names.py``."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import struct
from dataclasses import dataclass
from functools import lru_cache

# struct svc_key {u32 addr[4]; u16 port (network order); u8 proto; u8 family}
SVC_KEY = struct.Struct("=16s2sBB")
# struct svc_val {u32 set_id; u16 count; u16 flags; u32 affinity_timeout; u32 service_id}
SVC_VAL = struct.Struct("=IHHII")
# struct ep_key {u32 set_id; u32 slot}
EP_KEY = struct.Struct("=II")
# struct ep_val {u32 addr[4]; u16 port (network order); u8 family; u8 reserved}
EP_VAL = struct.Struct("=16s2sBB")

F_AFFINITY = 1
F_REFUSE = 2
PROTOCOLS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP}
# The packet path (tc) serves SCTP too; the socket programs see no SCTP socket.
PACKET_PROTOCOLS = {**PROTOCOLS, "SCTP": 132}
PROTOCOL_NAMES = {v: k.lower() for k, v in PACKET_PROTOCOLS.items()}

def _addr(ip: str) -> tuple[bytes, int]:
    """The address as the maps hold it, and its family; ValueError when it is not one."""
    try:
        if ":" in ip:
            return socket.inet_pton(socket.AF_INET6, ip), 6
        return socket.inet_pton(socket.AF_INET, ip) + bytes(12), 4
    except OSError:
        raise ValueError(f"not an IP address: {ip!r}") from None


@lru_cache(maxsize=1 << 17)
def pack_frontend(ip: str, port: int, proto: str) -> bytes:
    raw, family = _addr(ip)
    return SVC_KEY.pack(raw, port.to_bytes(2, "big"), PACKET_PROTOCOLS[proto], family)


@lru_cache(maxsize=1 << 18)
def pack_target(ip: str, port: int) -> bytes:
    """``Target(ip, port).pack()`` without the object (the plan packs 100,000s of these)."""
    raw, family = _addr(ip)
    return EP_VAL.pack(raw, port.to_bytes(2, "big"), family, 0)


def _ip(raw: bytes, family: int) -> str:
    return str(ipaddress.ip_address(raw[:4] if family == 4 else raw))


@dataclass(frozen=True, slots=True, order=True)
class ServiceAddress:
    """A service's address, port and protocol (a services-map key): what a socket may
    connect or send to, or a packet be addressed to."""

    ip: str
    port: int
    proto: str  # "TCP" or "UDP"

    def pack(self) -> bytes:
        return pack_frontend(self.ip, self.port, self.proto)

    @classmethod
    def unpack(cls, data: bytes) -> ServiceAddress:
        raw, port, proto, family = SVC_KEY.unpack(data)
        return cls(_ip(raw, family), int.from_bytes(port, "big"),
                   PROTOCOL_NAMES.get(proto, str(proto)).upper())

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port}/{self.proto.lower()}"


@dataclass(frozen=True, slots=True, order=True)
class Target:
    """An endpoint address and port."""

    ip: str
    port: int

    def pack(self) -> bytes:
        return pack_target(self.ip, self.port)

    @classmethod
    def unpack(cls, data: bytes) -> Target:
        raw, port, family, _ = EP_VAL.unpack(data)
        return cls(_ip(raw, family), int.from_bytes(port, "big"))

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServiceValue:
    """A service entry: which endpoint set it uses and how."""

    set_id: int
    count: int
    flags: int
    affinity_timeout: int
    service_id: int = 0  # with affinity: the service port, shared by all its addresses

    def pack(self) -> bytes:
        return SVC_VAL.pack(self.set_id, self.count, self.flags, self.affinity_timeout,
                            self.service_id)

    @classmethod
    def unpack(cls, data: bytes) -> ServiceValue:
        return cls(*SVC_VAL.unpack(data))


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """A service entry as the kernel holds it; ``slots`` None when its set is incomplete."""

    value: ServiceValue
    slots: tuple[bytes, ...] | None


def service_id(namespace: str, name: str, port_name: str, protocol: str) -> int:
    """A service port's id in the affinity keys (bpf/affinity.h): the same on every
    node and after a restart, never 0 (0: affinity per address)."""
    text = f"{namespace}/{name}/{port_name}/{protocol}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "little") or 1


def ep_key(set_id: int, slot: int) -> bytes:
    return EP_KEY.pack(set_id, slot)

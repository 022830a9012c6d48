"""The packet path's maps' layouts, mirrored from bpf/svcproxy_tc.bpf.c (pure); their
names (``spp_*``) are in ``names.py``.

The services and endpoints maps have the socket programs' layouts (``layout.py``),
except that an endpoint's last byte says whether it runs on this node.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from functools import lru_cache

from .layout import EP_KEY, EP_VAL, SVC_KEY, SVC_VAL, _addr, _ip
from .names import (
    TC_MAP_AFFINITY,
    TC_MAP_CLUSTER_IPS,
    TC_MAP_CT,
    TC_MAP_DEVICES,
    TC_MAP_ENDPOINTS,
    TC_MAP_LOCAL,
    TC_MAP_LOCAL_CIDRS,
    TC_MAP_LOCAL_DEVICES,
    TC_MAP_RANGES,
    TC_MAP_SERVICES,
    TC_MAP_STATS,
    TC_MAP_XDP_STATS,
)

F_MAGLEV = 4  # next to layout.F_AFFINITY and F_REFUSE: pick by the set's Maglev table
F_RANGES = 8  # loadBalancerSourceRanges: only the sources in spp_ranges get through
F_MASQ = 16  # external traffic with externalTrafficPolicy Cluster: SNATed, local endpoints too
F_MASQ_ALL = 32  # --masquerade-all: ClusterIP traffic from outside SNATed too (never DSR)
F_MASQ_NONLOCAL = 64  # a ClusterIP: SNATed unless local traffic (bpf/local_traffic.h)
# How a family tells local traffic (struct local_cfg's modes, bpf/local_traffic.h)
LOCAL_NONE, LOCAL_BY_SOURCE, LOCAL_BY_DEVICE = 0, 1, 2
EP_LOCAL = 1
CT_FORWARD, CT_REPLY = 0, 1
CT_SNAT = 1

# struct ct_key {u32 saddr[4], daddr[4]; u16 sport, dport; u8 proto, family, dir, pad}
CT_KEY = struct.Struct("=16s16s2s2sBBBB")
# struct ct_val {u32 saddr[4], daddr[4]; u16 sport, dport; u8 flags, state, pad[2];
# u32 set_id, pad2; u64 last_ns}
CT_VAL = struct.Struct("=16s16s2s2sBB2xI4xQ")
# struct ct_timeouts (bpf/ct.h, section .rodata.ct) {u32 tcp_syn, tcp_established,
# tcp_close_wait, tcp_fin, udp, udp_stream}: seconds
CT_TIMEOUTS = struct.Struct("=6I")
CT_TIMEOUTS_SECTION = ".rodata.ct"
# struct dev_val {u32 addr4; u32 addr6[4]}
DEV_VAL = struct.Struct("=4s16s")
# struct local_cfg {u32 gen; u8 mode4, mode6, pad[2]}, under the key 0
LOCAL_CFG = struct.Struct("=IBB2x")
# struct local_cidr_key {u32 prefixlen (64 + the prefix's), gen, family; u32 addr[4]}
LOCAL_CIDR_KEY = struct.Struct("=III16s")
# struct local_dev_key {u32 gen, ifindex}
LOCAL_DEV_KEY = struct.Struct("=II")
SIZES = {
    TC_MAP_SERVICES: (SVC_KEY.size, SVC_VAL.size),
    TC_MAP_ENDPOINTS: (EP_KEY.size, EP_VAL.size),
    TC_MAP_CT: (CT_KEY.size, CT_VAL.size),
    TC_MAP_DEVICES: (4, DEV_VAL.size),
    TC_MAP_AFFINITY: (40, 32),
    TC_MAP_RANGES: (40, 1),
    TC_MAP_CLUSTER_IPS: (20, 1),
    TC_MAP_LOCAL: (4, LOCAL_CFG.size),
    TC_MAP_LOCAL_CIDRS: (LOCAL_CIDR_KEY.size, 1),
    TC_MAP_LOCAL_DEVICES: (LOCAL_DEV_KEY.size, 1),
    TC_MAP_XDP_STATS: (4, 8),  # per CPU
    TC_MAP_STATS: (4, 8),  # per CPU
}


@lru_cache(maxsize=1 << 18)
def pack_endpoint(ip: str, port: int, local: bool) -> bytes:
    """An endpoints-map value: address, port, family and whether it is on this node."""
    raw, family = _addr(ip)
    return EP_VAL.pack(raw, port.to_bytes(2, "big"), family, EP_LOCAL if local else 0)


def endpoint_name(slot: bytes) -> bytes:
    """What Maglev hashes for an endpoint: its address and port (not the node-dependent
    flag, so every node builds the same table)."""
    return slot[:18]


def pack_range(frontend: bytes, cidr: str) -> bytes:
    """An spp_ranges key: the service key (160 bits, all matched) and the CIDR's prefix;
    ValueError for a CIDR that is not one."""
    net = ipaddress.ip_network(cidr, strict=False)
    raw = net.network_address.packed.ljust(16, b"\0")
    return struct.pack("=I", 160 + net.prefixlen) + frontend + raw


def pack_cluster_ip(ip: str) -> bytes:
    """An spp_cluster_ips key; ValueError for what is no address."""
    raw, family = _addr(ip)
    return raw + struct.pack("=I", family)


def pack_device(addr4: str, addr6: str) -> bytes:
    return DEV_VAL.pack(socket.inet_aton(addr4) if addr4 else bytes(4),
                        socket.inet_pton(socket.AF_INET6, addr6) if addr6 else bytes(16))


def pack_local_cidr(gen: int, cidr: str) -> bytes:
    """An spp_local_cidrs key: ``cidr`` (a normalized CIDR) under generation ``gen``."""
    net = ipaddress.ip_network(cidr)
    raw = net.network_address.packed.ljust(16, b"\0")
    return LOCAL_CIDR_KEY.pack(64 + net.prefixlen, gen, net.version, raw)


def unpack_local_cidr(key: bytes) -> tuple[int, str]:
    """(generation, CIDR) of an spp_local_cidrs key."""
    prefixlen, gen, family, raw = LOCAL_CIDR_KEY.unpack(key)
    address = ipaddress.ip_address(raw[:4] if family == 4 else raw)
    return gen, f"{address}/{prefixlen - 64}"


@dataclass(frozen=True, slots=True)
class CtEntry:
    """One entry of the BPF connection tracking map (spp_ct): the tuple as seen, and what
    it is rewritten to."""

    direction: int
    proto: int
    source: tuple[str, int]
    destination: tuple[str, int]
    new_source: tuple[str, int]
    new_destination: tuple[str, int]
    snat: bool

    @classmethod
    def unpack(cls, key: bytes, value: bytes) -> CtEntry:
        saddr, daddr, sport, dport, proto, family, direction, _ = CT_KEY.unpack(key)
        nsaddr, ndaddr, nsport, ndport, flags, _state, _set, _last = CT_VAL.unpack(value)

        def at(raw: bytes, port: bytes) -> tuple[str, int]:
            return _ip(raw, family), int.from_bytes(port, "big")

        return cls(direction, proto, at(saddr, sport), at(daddr, dport), at(nsaddr, nsport),
                   at(ndaddr, ndport), bool(flags & CT_SNAT))

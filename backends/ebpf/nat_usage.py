"""What ``--dump`` says of the NAT ports: the range the loaded tc program takes them from
(its constants, pinned as ``spp_constants``; see ``nat_ports.py`` for how the range
follows ``net.ipv4.ip_local_port_range``) and how many are in use and free.

A NAT port is claimed per pool - endpoint address and port, the node address the flow
is SNATed to, protocol - by the reply entry of a SNATed flow, so each pool has the whole
range to itself and fills up alone (``svcproxy_ebpf_tc_nat_port_exhausted_total``).
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import libbpf, nat_ports, rodata
from .libbpf import Map
from .names import TC_CONSTANTS
from .packet_layout import CT_REPLY, CtEntry

PROTOCOLS = {6: "tcp", 17: "udp", 132: "sctp"}
Pool = tuple[str, int, str, int]  # endpoint address, endpoint port, node address, protocol


def loaded_range(tc_dir: Path, object_path: Path) -> tuple[int, int] | None:
    """(first, count) of the NAT ports the loaded program takes, read from its pinned
    constants (offsets from ``object_path``'s BTF); None without the pin."""
    pin = tc_dir / TC_CONSTANTS
    if not pin.exists():
        return None
    fd = libbpf.obj_get(str(pin))
    try:
        info = (ctypes.c_uint32 * 4)()  # struct bpf_map_info: type, id, key_size, value_size
        size = ctypes.c_uint32(ctypes.sizeof(info))
        libbpf.check(libbpf.lib().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)),
                     "constants info")
        value = Map(TC_CONSTANTS, fd, 4, int(info[3])).lookup(bytes(4)) or b""
    finally:
        os.close(fd)
    obj = libbpf.check_ptr(libbpf.lib().bpf_object__open_file(str(object_path).encode(), None),
                           f"open {object_path}")
    try:
        where = rodata.offsets(obj)
    finally:
        libbpf.lib().bpf_object__close(obj)

    def constant(name: str) -> int:
        offset, width = where[name]
        return int.from_bytes(value[offset:offset + width], "little")

    return constant("nat_port_min"), constant("nat_port_span")


def pools(flows: Iterable[CtEntry], first: int, count: int) -> Counter[Pool]:
    """NAT ports in use per pool: the reply entries of SNATed flows whose port (the
    reply's destination port) lies in the range (pure)."""
    used: Counter[Pool] = Counter()
    for f in flows:
        if f.direction == CT_REPLY and f.snat and first <= f.destination[1] < first + count:
            used[(*f.source, f.destination[0], f.proto)] += 1
    return used


def dump_lines(tc_dir: Path, object_path: Path, flows: list[CtEntry],
               samples: int = 5) -> Iterator[str]:
    """The range in use and where it came from, then the fullest pools' ports in use
    and free (at most ``samples``)."""
    try:
        found = loaded_range(tc_dir, object_path)
    except (OSError, KeyError) as err:  # the object missing or older than the pin
        yield f"# NAT ports: the loaded program's range cannot be read ({err})"
        return
    if found is None:
        return
    first, count = found
    local = nat_ports.local_port_range()
    origin = (f"net.ipv4.ip_local_port_range {local[0]} {local[1]}" if local
              else "net.ipv4.ip_local_port_range unreadable")
    if nat_ports.nat_ports(local) != found:
        origin += (f", which now gives {'-'.join(map(str, _bounds(*nat_ports.nat_ports(local))))}"
                   ": a restart takes those")
    used = pools(flows, first, count)
    lo, hi = _bounds(first, count)
    yield (f"# NAT ports {lo}-{hi} ({count} per endpoint and node address; {origin}): "
           f"{sum(used.values())} in use by {len(used)} endpoints")
    for (ip, port, node, proto), n in sorted(used.items(), key=lambda kv: (-kv[1], kv[0]))[
            :samples]:
        host = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        yield (f"nat {host}/{PROTOCOLS.get(proto, proto)} from {node}: {n} in use, "
               f"{count - n} free")


def _bounds(first: int, count: int) -> tuple[int, int]:
    return first, first + count - 1

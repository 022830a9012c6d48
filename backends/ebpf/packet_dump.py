"""``--dump`` of the packet path: the pinned tc maps as services, endpoints and flows."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

from . import device_pins, libbpf, local_traffic, nat_usage, packet_stats, xdp
from .layout import F_AFFINITY, F_REFUSE, PACKET_PROTOCOLS, ServiceAddress, Target
from .libbpf import Map
from .names import (
    TC_MAP_CT,
    TC_MAP_ENDPOINTS,
    TC_MAP_LOCAL,
    TC_MAP_LOCAL_CIDRS,
    TC_MAP_LOCAL_DEVICES,
    TC_MAP_MAGLEV,
    TC_MAP_SERVICES,
    TC_MAP_STATS,
    TC_SUBDIR,
)
from .packet_layout import CT_FORWARD, EP_LOCAL, F_MAGLEV, SIZES, CtEntry
from .packet_loader import OBJECT
from .tables import read_kernel


def _open(tc_dir: Path, name: str, key: int, value: int) -> Map:
    return Map(name, libbpf.obj_get(str(tc_dir / name)), key, value)


def _endpoint(slot: bytes) -> str:
    where = "local" if slot[-1] & EP_LOCAL else "remote"
    return f"{Target.unpack(slot)} ({where})"


def packet_dump_lines(pin_dir: Path, samples: int = 5) -> Iterator[str]:
    """One line per tc services-map entry, a sample of the flows, the NAT ports (range,
    in use, free), how the devices run the programs, then the counts; nothing when the
    packet path has no pins here."""
    tc_dir = pin_dir / TC_SUBDIR
    if not (tc_dir / TC_MAP_SERVICES).exists():
        return
    maps = {name: _open(tc_dir, name, *SIZES[name])
            for name in (TC_MAP_SERVICES, TC_MAP_ENDPOINTS, TC_MAP_CT)}
    try:
        applied, _orphans = read_kernel(maps[TC_MAP_SERVICES], maps[TC_MAP_ENDPOINTS])
        flows = [CtEntry.unpack(k, v) for k, v in maps[TC_MAP_CT].items()]
        per_service = packet_stats.ServiceFlows.of(flows)
        tables = _table_ids(tc_dir / TC_MAP_MAGLEV)
        for fe, entry in sorted((ServiceAddress.unpack(k), a) for k, a in applied.items()):
            value = entry.value
            if value.flags & F_REFUSE:
                what = "refuse (no endpoints: RST / port unreachable)"
            elif not value.count:
                what = "drop (endpoints, none for traffic from outside)"
            elif entry.slots is None:
                what = f"{value.count} endpoints, set {value.set_id} INCOMPLETE"
            else:
                what = " ".join(_endpoint(s) for s in entry.slots)
            extra = ""
            if value.flags & F_MAGLEV:
                extra = (" [maglev]" if value.set_id in tables or not value.count
                         else " [maglev, table missing: flow hash % endpoints]")
            if value.flags & F_AFFINITY:
                extra += f" [affinity ClientIP {value.affinity_timeout}s]"
            proto = PACKET_PROTOCOLS.get(fe.proto, 0)
            yield f"tc {fe} -> {what}{extra}{per_service.line(fe.ip, fe.port, proto)}"
        forward = [f for f in flows if f.direction == CT_FORWARD]
        for flow in forward[:samples]:
            via = f" via {_host(flow.new_source)}" if flow.snat else ""
            yield (f"flow {flow.proto} {_host(flow.source)} -> {_host(flow.destination)} => "
                   f"{_host(flow.new_destination)}{via}")
        yield from nat_usage.dump_lines(tc_dir, OBJECT, flows, samples)
        yield from device_pins.dump_lines(tc_dir)
        yield from xdp.dump_lines(tc_dir)
        yield from _local_lines(tc_dir)
        yield (f"# {len(applied)} tc services, "
               f"{sum(a.value.count for a in applied.values())} endpoint slots, "
               f"{len(tables)} Maglev tables, {len(forward)} flows "
               f"({sum(f.snat for f in forward)} SNATed), "
               f"{sum(per_service.nat.values())} NAT entries, {len(flows)} flow entries")
        if (tc_dir / TC_MAP_STATS).exists():
            fd = libbpf.obj_get(str(tc_dir / TC_MAP_STATS))
            try:
                counts = packet_stats.read_stats(fd)
            finally:
                os.close(fd)
            yield "# tc counters: " + ", ".join(f"{n} {name}" for name, n in counts.items())
    finally:
        for m in maps.values():
            os.close(m.fd)


def _local_lines(tc_dir: Path) -> list[str]:
    """The local-traffic detector's maps (a pin dir from before them: nothing)."""
    names = (TC_MAP_LOCAL, TC_MAP_LOCAL_CIDRS, TC_MAP_LOCAL_DEVICES)
    if not all((tc_dir / name).exists() for name in names):
        return []
    maps = [_open(tc_dir, name, *SIZES[name]) for name in names]
    try:
        return local_traffic.dump_lines(*maps)
    finally:
        for m in maps:
            os.close(m.fd)


def _host(addr: tuple[str, int]) -> str:
    ip, port = addr
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _table_ids(pin: Path) -> set[int]:
    """The set ids holding a Maglev table: keys read one at a time (the values are
    whole tables)."""
    fd = libbpf.obj_get(str(pin))
    try:
        lib = libbpf.lib()
        key, prev = ctypes.create_string_buffer(4), None
        found = set()
        while lib.bpf_map_get_next_key(fd, prev, key) == 0:
            found.add(int.from_bytes(key.raw, "little"))
            prev = ctypes.create_string_buffer(key.raw, 4)
        return found
    finally:
        os.close(fd)

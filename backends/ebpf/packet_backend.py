"""The packet path in BPF (``--ebpf-packet-path bpf``): tc programs on the node's devices
serve what arrives from outside, with connection tracking and NAT in BPF maps and no
nftables or iptables rule.

The same stages as the socket path (``maps_backend.MapsBackend``: render a service port's
entries, the SDK's diff, apply through the claims and ``Tables``: new set first, then the
switch, then the old set deleted); a set of a Maglev service gets its lookup table
written with its slots, before the switch, and deleted with them. The source ranges
and ClusterIPs the programs look up beside the services are written around that
(``sync``): what an entry needs before it, what none needs after.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from svcproxy.sdk import (
    Changes,
    Delta,
    NodeConfig,
    NodeState,
    ServicePortKey,
    ServicePortState,
    resolve_context,
    rtnetlink,
)

from . import maglev, packet_stats, pod_devices, xdp
from .apply import MapApply
from .ct_gc import CtGc
from .layout import ServiceAddress
from .libbpf import Map, list_keys
from .local_traffic import LocalTrafficMaps
from .maps_backend import MapsBackend, node_port_ips
from .names import (
    TC_MAP_AFFINITY,
    TC_MAP_CLUSTER_IPS,
    TC_MAP_CT,
    TC_MAP_DEVICES,
    TC_MAP_ENDPOINTS,
    TC_MAP_LOCAL,
    TC_MAP_LOCAL_CIDRS,
    TC_MAP_LOCAL_DEVICES,
    TC_MAP_MAGLEV,
    TC_MAP_RANGES,
    TC_MAP_SERVICES,
    TC_MAP_STATS,
    TC_MAP_XDP_STATS,
)
from .packet_layout import F_MAGLEV, endpoint_name, pack_cluster_ip, pack_device
from .packet_loader import HOOKS, PacketLayout, PacketPrograms, remove_packet_pins
from .packet_render import packet_entries, source_ranges
from .render import Entry, ServicePortEntries
from .tables import Tables

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)
AFFINITY_ENTRIES = 65536  # spp_affinity's size (svcproxy_tc.bpf.c)


class EndpointSets(Map):
    """The endpoints map as ``Tables`` sees it, with each Maglev set's table beside it:
    written right after the set's slots (so before any service points at it), deleted
    with them."""

    def __init__(self, slots: Map, tables: Map, size: int) -> None:
        super().__init__(slots.name, slots.fd, slots.key_size, slots.value_size)
        self.slots = slots
        self.tables = tables
        self.size = size
        self.maglev_sets: set[tuple[bytes, ...]] = set()  # the slot tuples needing a table
        self.have: set[int] = {int.from_bytes(k, "little") for k in list_keys(tables)}

    def write_table(self, set_id: int, slots: Iterable[bytes]) -> None:
        self.write_tables({set_id: tuple(slots)})

    def write_tables(self, sets: Mapping[int, tuple[bytes, ...]]) -> None:
        """The table of each set, built once per distinct endpoint list (the sets of a
        service port's addresses hold the same endpoints)."""
        names = {set_id: tuple(endpoint_name(s) for s in slots) for set_id, slots in sets.items()}
        built = maglev.tables(names.values(), self.size)
        for set_id, of in names.items():
            self.tables.update(set_id.to_bytes(4, "little"), built[of])
            self.have.add(set_id)

    def update_many(self, keys: list[bytes], values: list[bytes]) -> None:
        self.slots.update_many(keys, values)
        sets: dict[int, list[bytes]] = {}
        for key, value in zip(keys, values, strict=True):
            sets.setdefault(int.from_bytes(key[:4], "little"), []).append(value)
        self.write_tables({set_id: tuple(slots) for set_id, slots in sets.items()
                           if tuple(slots) in self.maglev_sets})

    def delete_many(self, keys: list[bytes]) -> None:
        self.slots.delete_many(keys)
        for set_id in {int.from_bytes(k[:4], "little") for k in keys} & self.have:
            self.tables.delete(set_id.to_bytes(4, "little"))
            self.have.discard(set_id)


def devices_of(ips: Iterable[str]) -> tuple[str, ...]:
    """The devices (in this network namespace) holding any of ``ips``."""
    wanted = set(ips)
    indexes = sorted({a.index for a in rtnetlink.addresses() if a.address in wanted})
    return tuple(socket.if_indextoname(i) for i in indexes)


class PacketBackend(MapsBackend):
    """Loads and attaches the tc programs at ``start`` (or the first sync), then keeps
    the packet path's maps in step with the node's state."""

    name = "ebpf-tc"

    def __init__(self, config: NodeConfig, layout: PacketLayout, algorithm: str = "random",
                 gc_interval: float = 0.0) -> None:
        super().__init__(config)
        self.gc_interval = gc_interval  # seconds between CT GC passes; 0: none in a thread
        self.ct_gc: CtGc | None = None
        self.layout = layout
        self.algorithm = algorithm
        self.programs: PacketPrograms | None = None
        self.tables: Tables | None = None
        self.sets: EndpointSets | None = None
        self.masquerade_all = False  # the node context's, as the applied entries hold it
        self.last_sync_full: bool | None = None
        self._rebuilt = False
        self.ranges: set[bytes] | None = None  # spp_ranges as written; None: read it
        self.cluster_ips: set[bytes] | None = None  # spp_cluster_ips as written
        self.cluster_ips_of: dict[ServicePortKey, tuple[bytes, ...]] = {}
        self.links: pod_devices.LinkMonitor | None = None  # attaches devices as they come
        self.local: LocalTrafficMaps | None = None  # --detect-local-mode's maps
        self._devices_lock = threading.Lock()  # the link monitor's thread and sync's

    def start(self, node_ips: Iterable[str] = ()) -> PacketBackend:
        """Load the programs (adopting pinned maps and links) and attach them to the
        devices named, else to those holding the node IPs."""
        if self.programs is not None:
            return self
        layout = self.layout
        if not layout.devices:
            found = devices_of((*self.config.node_ips, *node_ips))
            if not found:
                raise RuntimeError("no device holds the node's IPs here; name them with "
                                   "--ebpf-devices")
            layout = dataclasses.replace(layout, devices=found)
            self.layout = layout
        programs = PacketPrograms(layout).load()
        self.programs = programs
        self.sets = EndpointSets(programs.maps[TC_MAP_ENDPOINTS], programs.maps[TC_MAP_MAGLEV],
                                 layout.maglev_size)
        self.tables = Tables(programs.maps[TC_MAP_SERVICES], self.sets)
        self.maps = MapApply(self.tables)
        self.forget()
        self._write_devices(programs.maps[TC_MAP_DEVICES])
        self.local = LocalTrafficMaps(programs.maps[TC_MAP_LOCAL],
                                      programs.maps[TC_MAP_LOCAL_CIDRS],
                                      programs.maps[TC_MAP_LOCAL_DEVICES])
        self.ct_gc = CtGc(programs.maps[TC_MAP_CT], layout.ct_timeouts, self.gc_interval).start()
        self.links = pod_devices.LinkMonitor(self._on_link_events).start()
        log.info("tc programs attached to %s, maps pinned in %s", ", ".join(layout.devices),
                 layout.dir)
        return self

    def _on_link_events(self, events: list[pod_devices.LinkEvent]) -> None:
        """A device of --ebpf-devices or --ebpf-pod-devices came or went, or an attached
        one's addresses changed: attach, forget, or write its addresses now (the link
        monitor's thread), not at the next sync; a local-traffic device (written first,
        so its first packet is already known as local)."""
        programs, local = self.programs, self.local
        if local is not None and local.concerns(events):
            with self._devices_lock:
                local.write()
        if programs is None or not pod_devices.concerns(
                events, self.layout.pod_devices, self.layout.devices,
                programs.attached.values()):
            return
        self._refresh_devices(always=True)

    def _refresh_devices(self, always: bool) -> None:
        """Attach the programs to the devices that appeared, forget those that went, and
        write the devices' addresses when any was attached (or ``always``)."""
        with self._devices_lock:
            programs = self.programs
            if programs is None:
                return
            if programs.refresh():
                log.info("tc programs attached to %s", ", ".join(programs.attached))
            elif not always:
                return
            self._write_devices(programs.maps[TC_MAP_DEVICES])

    def _write_devices(self, devices: Map) -> None:
        """Each attached device's first global address of each family: what endpoints on
        other nodes see as the source of what this node forwards to them."""
        found: dict[tuple[int, int], str] = {}
        for a in rtnetlink.addresses():
            if a.scope == 0:
                found.setdefault((a.index, a.family), a.address)
        assert self.programs is not None
        for index in self.programs.attached.values():
            v4, v6 = found.get((index, socket.AF_INET), ""), found.get((index, socket.AF_INET6), "")
            if v4 or v6:
                devices.update(index.to_bytes(4, "little"), pack_device(v4, v6))

    def context(self, state: NodeState) -> Hashable:
        """The NodePort IPs and --masquerade-all as the node context (the frontend's)
        holds them."""
        node_ips = super().context(state)
        self.masquerade_all = (state.context or resolve_context(self.config, state.node)
                               ).masquerade_all
        return node_ips, self.masquerade_all

    def entries(self, record: ServicePortState) -> dict[ServiceAddress, Entry]:
        return packet_entries(record, self.node_ips or (), self.algorithm, self.masquerade_all)

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.start(node_port_ips(self.config, state))
        self._write_local(state)
        self._refresh_devices(always=changes.full)  # a full sync: addresses may have come
        self.refusals.prune(state.services)
        gone = self._write_ranges(state, changes)
        self._write_cluster_ips(state, changes)
        self._rebuilt = False
        super().sync(state, changes)
        for key in sorted(gone):  # an LPM trie has no batch operations
            self._ranges_map().delete(key)
        self.last_sync_full = changes.full or self._rebuilt

    def apply(self, delta: Delta[ServicePortKey, ServicePortEntries]) -> None:
        """Write ``delta`` (``MapApply``), each Maglev set's table with its slots."""
        maps, sets = self.maps, self.sets
        assert maps is not None and sets is not None
        staged = maps.stage(delta)
        sets.maglev_sets = _maglev_sets(staged.changes.values())
        maps.write(staged)
        self._complete_tables(staged.changes)
        self._rebuilt = delta.rebuild

    def _write_local(self, state: NodeState) -> None:
        """The node context's local-traffic detector in the maps (local_traffic.py)."""
        assert self.local is not None
        context = state.context or resolve_context(self.config, state.node)
        with self._devices_lock:
            self.local.set_context({f.family: f.local_traffic for f in context.families})
            self.local.write()

    def _write_cluster_ips(self, state: NodeState, changes: Changes) -> None:
        """Every ClusterIP in spp_cluster_ips (a port no service has there is refused);
        written before the services, removed ones deleted too (no entry depends on
        them)."""
        assert self.programs is not None
        cips = self.programs.maps[TC_MAP_CLUSTER_IPS]
        if self.cluster_ips is None or changes.full:
            self.cluster_ips = set(list_keys(cips))
            self.cluster_ips_of = {k: _cluster_ip_keys(r) for k, r in state.services.items()}
        else:  # only the changed records are packed again (10,000 took 0.2 s a sync)
            for changed in changes.services:
                record = state.services.get(changed)
                if record is None:
                    self.cluster_ips_of.pop(changed, None)
                else:
                    self.cluster_ips_of[changed] = _cluster_ip_keys(record)
        wanted: set[bytes] = set().union(*self.cluster_ips_of.values())
        for key in sorted(wanted - self.cluster_ips):
            cips.update(key, b"\x01")
        for key in sorted(self.cluster_ips - wanted):
            cips.delete(key)
        self.cluster_ips = wanted

    def _ranges_map(self) -> Map:
        assert self.programs is not None
        return self.programs.maps[TC_MAP_RANGES]

    def _write_ranges(self, state: NodeState, changes: Changes) -> set[bytes]:
        """Write the source ranges the services want that the map lacks (before any
        service entry asks for them); return those to delete once no entry does."""
        ranges = self._ranges_map()
        if self.ranges is None or changes.full:
            self.ranges = set(list_keys(ranges))
        wanted = set().union(*(source_ranges(r) for r in state.services.values()
                               if r.service.load_balancer_source_ranges))
        for key in sorted(wanted - self.ranges):
            ranges.update(key, b"\x01")
        gone = self.ranges - wanted
        self.ranges = wanted
        return gone

    def _complete_tables(self, touched: Mapping[bytes, Entry | None]) -> None:
        """A service that became Maglev on a set it already had gets that set's table
        (its slots were not rewritten)."""
        tables, sets = self.tables, self.sets
        assert tables is not None and tables.applied is not None and sets is not None
        for key, entry in touched.items():
            applied = tables.applied.get(key)
            if (entry is not None and entry.flags & F_MAGLEV and applied is not None
                    and applied.value.count and applied.value.set_id not in sets.have):
                sets.write_table(applied.value.set_id, entry.slots)

    def register_metrics(self, registry: object) -> None:
        from prometheus_client.registry import Collector

        backend = self

        class TcMaps(Collector):
            def collect(self) -> Iterator[Metric]:
                yield from backend.collect_metrics()

        registry.register(TcMaps())  # type: ignore[attr-defined]

    def collect_metrics(self) -> Iterator[Metric]:
        """svcproxy_ebpf_tc_map_entries / _max_entries per map and
        svcproxy_ebpf_tc_attached per device and hook, read at scrape time."""
        from prometheus_client.core import GaugeMetricFamily

        entries = GaugeMetricFamily("svcproxy_ebpf_tc_map_entries",
                                    "Entries in each map of the tc packet path", labels=["map"])
        capacity = GaugeMetricFamily("svcproxy_ebpf_tc_map_max_entries",
                                     "Capacity of each map of the tc packet path",
                                     labels=["map"])
        attached = GaugeMetricFamily("svcproxy_ebpf_tc_attached",
                                     "1 when the tc program is attached to the device's hook, "
                                     "by a tcx link or (kernels before 6.6) a clsact qdisc's "
                                     "tc filter (mode); 0 with mode none",
                                     labels=["device", "hook", "mode"])
        programs, tables = self.programs, self.tables
        if programs is not None and tables is not None and tables.applied is not None:
            layout = self.layout
            counts = {TC_MAP_SERVICES: (len(tables.applied), layout.max_services),
                      TC_MAP_ENDPOINTS: (tables.slot_count, layout.max_endpoints),
                      TC_MAP_CT: (len(programs.maps[TC_MAP_CT]), layout.max_flows),
                      TC_MAP_MAGLEV: (len(self.sets.have) if self.sets else 0, layout.max_services),
                      TC_MAP_AFFINITY: (len(programs.maps[TC_MAP_AFFINITY]), AFFINITY_ENTRIES)}
            for name, (count, size) in counts.items():
                entries.add_metric([name], count)
                capacity.add_metric([name], size)
            pods = [d for d in programs.attached if d not in layout.devices]
            for device in (*layout.devices, *pods):
                mode = programs.tc_modes.get(device, "") if device in programs.attached else ""
                for hook in HOOKS:
                    attached.add_metric([device, hook, mode or "none"], 1 if mode else 0)
        yield entries
        yield capacity
        yield attached
        if programs is not None and self.layout.xdp != "off":
            yield from xdp.metrics(programs.xdp_modes, programs.maps[TC_MAP_XDP_STATS].fd)
        if self.ct_gc is not None:
            yield from self.ct_gc.metrics()
        if programs is not None:
            yield from packet_stats.metrics(programs.maps[TC_MAP_STATS].fd)

    def cleanup(self) -> None:
        """Detach the tc programs and remove the packet path's pins."""
        self.close()
        removed = remove_packet_pins(self.layout.pin_dir)
        log.info("Removed %d tc pins from %s", len(removed), self.layout.dir)

    def close(self) -> None:
        if self.links is not None:
            self.links.stop()
            self.links = None
        if self.ct_gc is not None:
            self.ct_gc.stop()
            self.ct_gc = None
        if self.programs is not None:
            self.programs.close()
        self.programs = None
        self.tables = None
        self.sets = None
        self.maps = None
        self.local = None


def _cluster_ip_keys(record: ServicePortState) -> tuple[bytes, ...]:
    """The spp_cluster_ips keys of a service port's ClusterIPs (what is no address aside)."""
    keys = []
    for ip in record.service.cluster_ips:
        try:
            keys.append(pack_cluster_ip(ip))
        except ValueError:
            continue
    return tuple(keys)


def _maglev_sets(entries: Iterable[Entry | None]) -> set[tuple[bytes, ...]]:
    return {e.slots for e in entries if e is not None and e.flags & F_MAGLEV and e.slots}

"""The ebpf backend: the node's services as BPF map entries read by cgroup socket programs.

The SDK's render -> diff -> apply (``maps_backend.MapsBackend``): ``render`` is one
service port's entries (``render.py``, pure), the diff the SDK's, ``apply`` the claims
and the map writes (``apply.py``, ``tables.py``). Every periodic resync (--sync-period)
reads both maps back and compares them with what this process wrote (``find_drift``):
what someone else deleted or altered is written again, entries nobody wrote are
deleted, nothing else is touched."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svcproxy.sdk import Changes, Delta, NodeConfig, NodeState, ServicePortKey, ServicePortState

from .apply import MapApply
from .layout import KernelEntry, ServiceAddress
from .loader import Layout, Programs, remove_pins
from .maps_backend import MapsBackend, node_port_ips
from .names import MAP_AFFINITY, MAP_ENDPOINTS, MAP_REVNAT, MAP_SERVICES, MAPS
from .render import Entry, ServicePortEntries, service_entries
from .sock_destroy import UDP, removed_endpoints, terminate_removed
from .tables import Tables, WriteReport

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What the last sync did (for logs and benchmarks)."""

    full: bool
    services: int
    writes: WriteReport
    plan_seconds: float
    apply_seconds: float


class EbpfBackend(MapsBackend):
    """Loads and attaches the programs (``start``, else the first sync), then keeps the maps
    in step with the node's state."""

    name = "ebpf"

    def __init__(self, config: NodeConfig, layout: Layout) -> None:
        super().__init__(config)
        self.layout = layout
        self.programs: Programs | None = None
        self.tables: Tables | None = None
        self.rejected = 0
        self._rejected_seen = 0
        self._rejected_counter: object = None
        self.last: SyncReport | None = None
        self.last_sync_full: bool | None = None
        self.failures: dict[str, int] = dict.fromkeys(MAPS, 0)
        self._failure_counter: object = None
        self.sockets_destroyed = 0  # connected UDP sockets of removed endpoints
        self._writes = WriteReport()
        self._rebuilt = False
        self._seconds = (0.0, 0.0)  # (render and diff, apply) of the current sync

    def start(self) -> EbpfBackend:
        """Load the programs (adopting pinned maps and links) and attach them."""
        if self.programs is None:
            programs = Programs(self.layout).load()
            self.programs = programs
            self.tables = Tables(programs.maps[MAP_SERVICES], programs.maps[MAP_ENDPOINTS],
                                 on_failure=self._count_failure)
            self.maps = MapApply(self.tables)
            self.forget()
            log.info("ebpf programs attached to %s, maps pinned in %s", self.layout.cgroup,
                     self.layout.pin_dir)
        return self

    def _count_failure(self, map_name: str) -> None:
        self.failures[map_name] += 1
        counter = self._failure_counter
        if counter is not None:
            counter.labels(map=map_name).inc()  # type: ignore[attr-defined]

    def _count_rejected(self) -> None:
        """Count the service ports refused since the last sync (the SDK's refusals)."""
        new = self.refusals.total - self._rejected_seen
        self._rejected_seen = self.refusals.total
        self.rejected += new
        counter = self._rejected_counter
        if new and counter is not None:
            counter.inc(new)  # type: ignore[attr-defined]

    def _node_ips(self, state: NodeState) -> tuple[str, ...]:
        return node_port_ips(self.config, state)

    def entries(self, record: ServicePortState) -> dict[ServiceAddress, Entry]:
        return service_entries(record, self.node_ips or ())

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.start()
        self.refusals.prune(state.services)
        self._writes, self._seconds, self._rebuilt = WriteReport(), (0.0, 0.0), False
        try:
            super().sync(state, changes)
        finally:
            self._count_rejected()
        self.last_sync_full = changes.full or self._rebuilt
        self.last = SyncReport(self.last_sync_full, len(state.services), self._writes,
                               *self._seconds)

    def diff(self, state: NodeState, changes: Changes
             ) -> Delta[ServicePortKey, ServicePortEntries]:
        start = time.perf_counter()
        delta = super().diff(state, changes)
        self._seconds = (time.perf_counter() - start, 0.0)
        return delta

    def apply(self, delta: Delta[ServicePortKey, ServicePortEntries]) -> None:
        """Write ``delta`` to the maps (``MapApply``), then destroy the connected UDP
        sockets whose endpoint it removed."""
        start = time.perf_counter()
        maps, tables = self.maps, self.tables
        assert maps is not None and tables is not None
        staged = maps.stage(delta)
        maps.settle(staged)
        known = tables.applied or {}
        before = _udp_slots(known, known if staged.full else staged.changes)
        self._writes = maps.write(staged)
        self._terminate_removed(tables, before)
        self._rebuilt = delta.rebuild
        self._seconds = (self._seconds[0], time.perf_counter() - start)

    def _terminate_removed(self, tables: Tables,
                           before: dict[bytes, tuple[bytes, ...] | None]) -> None:
        """Destroy the connected UDP sockets whose endpoint the sync just removed."""
        assert self.programs is not None and tables.applied is not None
        removed = removed_endpoints(before, _udp_slots(tables.applied, before))
        if removed:
            self.sockets_destroyed += terminate_removed(self.programs.maps[MAP_REVNAT],
                                                        self.layout.cgroup, removed)

    def cleanup(self) -> None:
        """Detach every program and remove every pin under the pin directory."""
        self.close()
        removed = remove_pins(self.layout.pin_dir)
        log.info("Removed %d ebpf pins from %s", len(removed), self.layout.pin_dir)

    def close(self) -> None:
        """Drop this process's handles; what is pinned keeps working."""
        if self.programs is not None:
            self.programs.close()
        self.programs = None
        self.tables = None
        self.maps = None

    def register_metrics(self, registry: object) -> None:
        from prometheus_client import Counter
        from prometheus_client.registry import Collector

        self._failure_counter = Counter(
            "svcproxy_ebpf_map_update_failures_total",
            "Failed writes (or reads) of an ebpf map; each fails the sync, which is retried "
            "as a full sync", ["map"], registry=registry)  # type: ignore[arg-type]
        for name in MAPS:
            self._failure_counter.labels(map=name)  # type: ignore[attr-defined]
        self._rejected_counter = Counter(
            "svcproxy_ebpf_rejected_service_ports_total",
            "Service ports left unprogrammed because they cannot be written to the maps "
            "(logged with their name)", registry=registry)  # type: ignore[arg-type]
        backend = self

        class Destroyed(Collector):
            def collect(self) -> Iterator[Metric]:
                from prometheus_client.core import CounterMetricFamily

                family = CounterMetricFamily(
                    "svcproxy_ebpf_udp_sockets_destroyed",
                    "Connected UDP sockets destroyed because their endpoint left the "
                    "service they were balanced for")
                family.add_metric([], backend.sockets_destroyed)
                yield family

        registry.register(Destroyed())  # type: ignore[attr-defined]

        class MapSizes(Collector):
            def collect(self) -> Iterator[Metric]:
                yield from backend.collect_map_metrics()

        registry.register(MapSizes())  # type: ignore[attr-defined]

    def collect_map_metrics(self) -> Iterator[Metric]:
        """svcproxy_ebpf_map_entries and svcproxy_ebpf_map_max_entries, read at scrape."""
        from prometheus_client.core import GaugeMetricFamily

        entries = GaugeMetricFamily("svcproxy_ebpf_map_entries",
                                    "Entries in each ebpf map", labels=["map"])
        capacity = GaugeMetricFamily("svcproxy_ebpf_map_max_entries",
                                     "Capacity of each ebpf map", labels=["map"])
        programs, tables = self.programs, self.tables
        if programs is not None and tables is not None and tables.applied is not None:
            counts = {MAP_SERVICES: len(tables.applied), MAP_ENDPOINTS: tables.slot_count}
            for name in (MAP_AFFINITY, MAP_REVNAT):
                try:
                    counts[name] = len(programs.maps[name])
                except OSError:
                    continue
            for name, count in counts.items():
                entries.add_metric([name], count)
                capacity.add_metric([name], programs.capacity(name))
        yield entries
        yield capacity


def _udp_slots(applied: Mapping[bytes, KernelEntry], keys: Iterable[bytes]) -> dict[
        bytes, tuple[bytes, ...] | None]:
    """The endpoint slots of the UDP service keys among ``keys`` (None: no entry)."""
    found: dict[bytes, tuple[bytes, ...] | None] = {}
    for key in keys:
        if key[18] == UDP:
            have = applied.get(key)
            found[key] = have.slots if have is not None else None
    return found

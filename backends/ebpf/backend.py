"""The ebpf backend: the node's services as BPF map entries read by cgroup socket programs.

Every periodic resync (--sync-period) reads both maps back and compares them with what
this process wrote (``Tables.verify``): what someone else deleted or altered is written
again, entries nobody wrote are deleted, nothing else is touched."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svcproxy.sdk import Backend, Changes, NodeConfig, NodeState, resolve_context

from .layout import MAP_AFFINITY, MAP_ENDPOINTS, MAP_REVNAT, MAP_SERVICES, MAPS
from .loader import Layout, Programs, remove_pins
from .plan import Plan
from .sock_destroy import UDP, removed_endpoints, terminate_removed
from .tables import Applied, MapDrift, Tables, WriteReport

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


class EbpfBackend(Backend):
    """Loads and attaches the programs (``start``, else the first sync), then keeps the maps
    in step with the node's state."""

    name = "ebpf"

    def __init__(self, config: NodeConfig, layout: Layout) -> None:
        self.config = config
        self.layout = layout
        self.programs: Programs | None = None
        self.tables: Tables | None = None
        self.rejected = 0
        self._rejected_counter: object = None
        self.plan = Plan(self._reject)
        self.node_ips: tuple[str, ...] | None = None
        self.last: SyncReport | None = None
        self.last_sync_full: bool | None = None
        self.failures: dict[str, int] = dict.fromkeys(MAPS, 0)
        self.last_drift: MapDrift | None = None  # what the last periodic resync found
        self.drift_repairs = 0
        self._failure_counter: object = None
        self.sockets_destroyed = 0  # connected UDP sockets of removed endpoints

    def start(self) -> EbpfBackend:
        """Load the programs (adopting pinned maps and links) and attach them."""
        if self.programs is None:
            programs = Programs(self.layout).load()
            self.programs = programs
            self.tables = Tables(programs.maps[MAP_SERVICES], programs.maps[MAP_ENDPOINTS],
                                 on_failure=self._count_failure)
            log.info("ebpf programs attached to %s, maps pinned in %s", self.layout.cgroup,
                     self.layout.pin_dir)
        return self

    def _count_failure(self, map_name: str) -> None:
        self.failures[map_name] += 1
        counter = self._failure_counter
        if counter is not None:
            counter.labels(map=map_name).inc()  # type: ignore[attr-defined]

    def _reject(self, _key: object) -> None:
        self.rejected += 1
        counter = self._rejected_counter
        if counter is not None:
            counter.inc()  # type: ignore[attr-defined]

    def _node_ips(self, state: NodeState) -> tuple[str, ...]:
        """Where NodePorts answer, named: the node context's ``node_port_ips_listed``
        (never loopback; for a family the CIDRs leave open, the node IPs and every other
        address on the node's interfaces, as IPVS names them)."""
        node = state.context or resolve_context(self.config, state.node)
        return tuple(ip for fam in node.families for ip in fam.node_port_ips_listed)

    def sync(self, state: NodeState, changes: Changes) -> None:
        tables = self.start().tables
        assert tables is not None
        start = time.perf_counter()
        node_ips = self._node_ips(state)
        full = changes.full or tables.applied is None or node_ips != self.node_ips
        if full:
            if node_ips != self.node_ips:
                self.plan = Plan(self._reject)
            self.plan.update(state.services, set(state.services) | set(self.plan.records),
                             node_ips)
            desired = {fe.pack(): entry for fe, entry in self.plan.entries.items()}
            planned = time.perf_counter()
            # A start, a retry or a reset reads the kernel back; a periodic resync compares
            # it with what this process wrote and writes again only what differs.
            periodic = changes.reason == "periodic" and tables.applied is not None
            if periodic:
                self._repair_drift(tables)
            before = _udp_slots(tables.applied or {}, tables.applied or {})
            writes = tables.full(desired, reread=not periodic)
        else:
            touched = self.plan.update(state.services, changes.services, node_ips)
            diff = {fe.pack(): self.plan.entries.get(fe) for fe in touched}
            planned = time.perf_counter()
            before = _udp_slots(tables.applied or {}, diff)
            writes = tables.apply(diff)
        self._terminate_removed(tables, before)
        self.node_ips = node_ips
        self.last_sync_full = full
        self.last = SyncReport(full, len(state.services), writes, planned - start,
                               time.perf_counter() - planned)

    def _terminate_removed(self, tables: Tables,
                           before: dict[bytes, tuple[bytes, ...] | None]) -> None:
        """Destroy the connected UDP sockets whose endpoint the sync just removed."""
        assert self.programs is not None and tables.applied is not None
        removed = removed_endpoints(before, _udp_slots(tables.applied, before))
        if removed:
            self.sockets_destroyed += terminate_removed(self.programs.maps[MAP_REVNAT],
                                                        self.layout.cgroup, removed)

    def _repair_drift(self, tables: Tables) -> None:
        """Find what someone else changed in the maps (``Tables.verify``) and count it;
        the sync's write puts it back."""
        drift = tables.verify()
        self.last_drift = drift
        if drift:
            self.drift_repairs += 1
            log.warning("ebpf maps changed behind the backend's back (%s): writing them "
                        "again", drift)

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


def _udp_slots(applied: Mapping[bytes, Applied], keys: Iterable[bytes]) -> dict[
        bytes, tuple[bytes, ...] | None]:
    """The endpoint slots of the UDP service keys among ``keys`` (None: no entry)."""
    found: dict[bytes, tuple[bytes, ...] | None] = {}
    for key in keys:
        if key[18] == UDP:
            have = applied.get(key)
            found[key] = have.slots if have is not None else None
    return found

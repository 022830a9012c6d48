"""The packet path's counters (bpf/stats.h's per-CPU ``spp_stats``) and the per-service
view of its flows, NAT entries and Maglev tables, for the metrics and ``--dump``."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import libbpf
from .packet_layout import CT_FORWARD, CT_REPLY, CtEntry

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

STATS = ("nat_port_exhausted", "sctp_checksum_failed")  # indexes of bpf/stats.h


def read_stats(fd: int) -> dict[str, int]:
    """The counters, summed over the CPUs."""
    lib = libbpf.lib()
    lib.libbpf_num_possible_cpus.restype = ctypes.c_int
    ncpu = max(libbpf.check(lib.libbpf_num_possible_cpus(), "possible CPUs"), 1)
    found = {}
    for index, name in enumerate(STATS):
        key = ctypes.c_uint32(index)
        values = (ctypes.c_uint64 * ncpu)()
        if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values) == 0:
            found[name] = sum(values)
    return found


def metrics(stats_fd: int) -> Iterator[Metric]:
    """svcproxy_ebpf_tc_nat_port_exhausted_total and
    svcproxy_ebpf_tc_sctp_checksum_failures_total."""
    from prometheus_client.core import CounterMetricFamily

    counts = read_stats(stats_fd)
    exhausted = CounterMetricFamily(
        "svcproxy_ebpf_tc_nat_port_exhausted",
        "New flows dropped because no NAT port was free for them (16 tries among the ports "
        "above net.ipv4.ip_local_port_range, per endpoint and node address): raise "
        "--ebpf-max-flows or spread the clients")
    exhausted.add_metric([], counts.get("nat_port_exhausted", 0))
    sctp = CounterMetricFamily(
        "svcproxy_ebpf_tc_sctp_checksum_failures",
        "SCTP packets whose CRC32c could not be computed again after NAT (longer than "
        "9,216 bytes or not padded to 4): their receiver drops them")
    sctp.add_metric([], counts.get("sctp_checksum_failed", 0))
    yield exhausted
    yield sctp


@dataclass(frozen=True, slots=True)
class ServiceFlows:
    """Per service address (ip, port, protocol number): its flows, how many of them are
    SNATed, and the NAT entries (reply directions of SNATed flows) it holds."""

    flows: Counter[tuple[str, int, int]]
    snat: Counter[tuple[str, int, int]]
    nat: Counter[tuple[str, int, int]]

    @classmethod
    def of(cls, flows: Iterable[CtEntry]) -> ServiceFlows:
        fwd: Counter[tuple[str, int, int]] = Counter()
        snat: Counter[tuple[str, int, int]] = Counter()
        nat: Counter[tuple[str, int, int]] = Counter()
        for f in flows:
            if f.direction == CT_FORWARD:
                key = (*f.destination, f.proto)
                fwd[key] += 1
                snat[key] += f.snat
            elif f.direction == CT_REPLY and f.snat:
                nat[(*f.new_source, f.proto)] += 1
        return cls(fwd, snat, nat)

    def line(self, ip: str, port: int, proto: int) -> str:
        """`` flows 12 (3 SNATed, 3 NAT entries)``, or "" with none."""
        key = (ip, port, proto)
        if not self.flows[key] and not self.nat[key]:
            return ""
        return f" flows {self.flows[key]} ({self.snat[key]} SNATed, {self.nat[key]} NAT entries)"

"""kube-proxy's iptables-mode metrics (names, help and labels as pkg/proxy/metrics, with
the ``ip_family`` label kube-proxy puts on them since its proxiers are split per family)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from svcproxy.backends.iptables.nfacct import INVALID_DROPPED, LOCALHOST_NODEPORTS

log = logging.getLogger(__name__)

# nfacct object -> kube-proxy's metric (without _total) and help.
NFACCT_METRICS = {
    INVALID_DROPPED: ("kubeproxy_iptables_ct_state_invalid_dropped_packets",
                      "packets dropped by iptables to work around conntrack problems"),
    LOCALHOST_NODEPORTS: ("kubeproxy_iptables_localhost_nodeports_accepted_packets",
                          "Number of packets accepted on nodeports of loopback interface"),
}


def ip_family(family: int) -> str:
    """4 -> "IPv4", kube-proxy's label value."""
    return f"IPv{family}"


class IptablesMetrics:
    """The iptables backend's own metrics, in the agent's registry once it hands one over.

    The failure counters of ``families`` are exported at 0 from the start (a dashboard's
    rate() needs the series before the first failure); the rule gauges once synced.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 families: Iterable[str] = (),
                 nfacct: Callable[[str], int] | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.rules_total = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            ["ip_family", "table"],
            registry=r,
        )
        self.rules_last = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            ["ip_family", "table"],
            registry=r,
        )
        self.restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            ["ip_family"],
            registry=r,
        )
        self.partial_restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "Cumulative proxy iptables partial restore failures",
            ["ip_family"],
            registry=r,
        )
        for name in families:
            self.restore_failures.labels(ip_family=name)
            self.partial_restore_failures.labels(ip_family=name)
        if nfacct is not None:
            r.register(NfacctCounters(nfacct))

    def restore_failed(self, family: int, partial: bool) -> None:
        """Count one failed iptables-restore (every failure; partial ones also apart)."""
        self.restore_failures.labels(ip_family=ip_family(family)).inc()
        if partial:
            self.partial_restore_failures.labels(ip_family=ip_family(family)).inc()

    def set_rules(self, family: int, rules: Mapping[str, int]) -> None:
        """Rules in our chains per table, in one family."""
        for table, count in rules.items():
            self.rules_total.labels(ip_family=ip_family(family), table=table).set(count)

    def set_last(self, family: int, written: Mapping[str, int]) -> None:
        """Rules the last sync wrote in the filter and nat tables, in one family."""
        for table in ("filter", "nat"):
            self.rules_last.labels(ip_family=ip_family(family), table=table).set(
                written.get(table, 0))


class NfacctCounters(Collector):
    """kube-proxy's nfacct counters, read from the kernel at each scrape (a counter that
    cannot be read is left out, as kube-proxy does, and logged once)."""

    def __init__(self, packets: Callable[[str], int]) -> None:
        self.packets = packets
        self._failed: set[str] = set()

    def collect(self) -> Iterator[CounterMetricFamily]:
        for counter, (name, text) in NFACCT_METRICS.items():
            try:
                value = self.packets(counter)
            except (OSError, ValueError) as err:
                if counter not in self._failed:
                    self._failed.add(counter)
                    log.warning("Cannot read the nfacct counter %s (%s): %s_total is not "
                                "exported until it can be", counter, err, name)
                continue
            self._failed.discard(counter)
            yield CounterMetricFamily(name, text, value=value)

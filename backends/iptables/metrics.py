"""kube-proxy's iptables-mode metrics (names and help as pkg/proxy/metrics)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge


class IptablesMetrics:
    """The iptables backend's own metrics, in the agent's registry once it hands one over."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.rules_total = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            ["table"],
            registry=r,
        )
        self.restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            registry=r,
        )
        self.partial_restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "Cumulative proxy iptables partial restore failures",
            registry=r,
        )

    def restore_failed(self, partial: bool) -> None:
        """Count one failed iptables-restore (every failure; partial ones also apart)."""
        self.restore_failures.inc()
        if partial:
            self.partial_restore_failures.inc()

    def set_rules(self, per_family: Iterable[Mapping[str, int]]) -> None:
        """Rules in our chains per table, summed over the IP families."""
        totals: dict[str, int] = {}
        for rules in per_family:
            for table, count in rules.items():
                totals[table] = totals.get(table, 0) + count
        for table, count in totals.items():
            self.rules_total.labels(table=table).set(count)

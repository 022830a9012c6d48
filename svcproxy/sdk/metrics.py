"""kube-proxy's metrics (names, help and buckets as pkg/proxy/metrics), one registry per agent."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from svcproxy.model import Endpoint, ServicePortKey, ServicePortState, TrafficPolicy, ip_family
from svcproxy.sdk.backend import NodeState

# prometheus.ExponentialBuckets(0.001, 2, 15)
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
# merge(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59), LinearBuckets(60, 5, 12),
#       LinearBuckets(120, 30, 7)); kube-proxy's merge starts from a 0 bucket.
NETWORK_PROGRAMMING_BUCKETS = (
    (0.0, 0.25, 0.5)
    + tuple(float(s) for s in range(1, 60))
    + tuple(float(s) for s in range(60, 120, 5))
    + tuple(float(s) for s in range(120, 301, 30))
)


FAMILY_LABEL = {4: "IPv4", 6: "IPv6"}  # kube-proxy's ip_family label values


def node_families(node_ips: Iterable[str]) -> tuple[str, ...]:
    """The ip_family label values of a node: those of its IPs (IPv4 when it has none)."""
    found = {ip_family(ip) for ip in node_ips}
    return tuple(FAMILY_LABEL[f] for f in (4, 6) if f in found) or ("IPv4",)


class AgentMetrics:
    """The node agent's metrics in their own CollectorRegistry.

    kube-proxy runs one proxier per IP family and labels its metrics ip_family; one
    svcproxy sync programs every family of the node, so a sync is recorded once per
    family (``families``) with the same duration and time.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 families: tuple[str, ...] = ("IPv4",)) -> None:
        disable_created_metrics()  # kube-proxy exports no *_created series
        self.registry = registry or CollectorRegistry()
        self.families = families
        self._backend: object = None
        r = self.registry
        ProcessCollector(registry=r)  # process_* series, as kube-proxy's /metrics has them
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.sync_full_duration = Histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.sync_partial_duration = Histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            ["ip_family"],
            registry=r,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            ["ip_family"],
            registry=r,
        )
        self.state_mismatches = Counter(
            "svcproxy_sdk_state_mismatches",
            "Batches after which the node's state differed from the frontend's (by the "
            "stream's state digest); each is healed by asking for a full snapshot",
            registry=r,
        )
        self.undecodable_ops = Counter(
            "svcproxy_sdk_undecodable_ops",
            "Ops of the frontend's stream the node could not apply (each named in the "
            "watch's warning: node, op, object, error); the watch resumes after each",
            registry=r,
        )
        self.network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            ["ip_family"],
            buckets=NETWORK_PROGRAMMING_BUCKETS,
            registry=r,
        )
        self.endpoint_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            registry=r,
        )
        self.endpoint_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "Cumulative proxy rules Endpoint changes",
            registry=r,
        )
        self.service_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            registry=r,
        )
        self.service_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "Cumulative proxy rules Service changes",
            registry=r,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            ["ip_family", "traffic_policy"],
            registry=r,
        )
        self.healthz_total = Counter(
            "kubeproxy_proxy_healthz_total",
            "Cumulative proxy healthz HTTP status",
            ["code"],
            registry=r,
        )
        self.livez_total = Counter(
            "kubeproxy_proxy_livez_total",
            "Cumulative proxy livez HTTP status",
            ["code"],
            registry=r,
        )
        self.sync_failures_total = Counter(
            "svcproxy_sync_failures_total",
            "Cumulative failed backend syncs (each is retried with a full sync)",
            registry=r,
        )
        self.refused_services = Gauge(
            "svcproxy_backend_refused_services",
            "Service ports the dataplane refused (the others are programmed); each is "
            "retried when it changes",
            ["backend"],
            registry=r,
        )
        self.refusals_total = Counter(
            "svcproxy_backend_refusals_total",
            "Cumulative service port versions the dataplane refused",
            ["backend"],
            registry=r,
        )
        self._refusals_seen = 0

        self.conntrack_reconcile_duration = Histogram(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.conntrack_deleted_total = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            ["ip_family"],
            registry=r,
        )
        for family in families:
            for metric in (self.sync_duration, self.sync_full_duration,
                           self.sync_partial_duration, self.network_programming,
                           self.conntrack_reconcile_duration, self.conntrack_deleted_total):
                metric.labels(ip_family=family)

    def conntrack_reconciled(self, family: int, seconds: float, deleted: int) -> None:
        """Record one run of the conntrack reconciler over one IP family's table."""
        label = FAMILY_LABEL[family]
        self.conntrack_reconcile_duration.labels(ip_family=label).observe(seconds)
        self.conntrack_deleted_total.labels(ip_family=label).inc(deleted)

    def conntrack_deleted(self, family: int, deleted: int) -> None:
        """Count entries a sync deleted outside a reconciler run (those its changes named)."""
        self.conntrack_deleted_total.labels(ip_family=FAMILY_LABEL[family]).inc(deleted)

    def attach_backend(self, backend: object) -> None:
        """Let the backend export its own metrics here and say what kind of sync it did.

        Both hooks are optional: ``register_metrics(registry)`` is called once,
        now; ``last_sync_full`` (bool, or None to keep the agent's view) is read
        after each successful sync, so the full and partial duration histograms
        count what the backend did (kube-proxy's iptables mode answers most
        periodic syncs with a partial one) rather than what was asked.
        """
        register = getattr(backend, "register_metrics", None)
        if callable(register):
            register(self.registry)
        self._backend = backend
        name = str(getattr(backend, "name", "backend"))
        self.refused_services.labels(backend=name).set_function(lambda: len(self.refused()))
        self.refusals_total.labels(backend=name)
        if name in ModeFailures.NAMES:
            self.registry.register(ModeFailures(name, self.sync_failures_total, self.families))

    def backend_details(self) -> dict[str, object]:
        """The backend's own /healthz keys (``health_details``, a dict), if any."""
        details = getattr(self._backend, "health_details", None)
        return dict(details) if isinstance(details, dict) else {}

    def refused(self) -> dict[ServicePortKey, str]:
        """The service ports the backend reports as refused (``backend.refusals``, see
        svcproxy.sdk.refusals), with the error of each."""
        refusals = getattr(self._backend, "refusals", None)
        errors = getattr(refusals, "errors", None)
        return dict(errors()) if callable(errors) else {}

    def count_refusals(self) -> None:
        """After a sync: count the refusals the backend recorded since the last call."""
        total = getattr(getattr(self._backend, "refusals", None), "total", 0)
        if isinstance(total, int) and total > self._refusals_seen:
            name = str(getattr(self._backend, "name", "backend"))
            self.refusals_total.labels(backend=name).inc(total - self._refusals_seen)
            self._refusals_seen = total

    def queued(self) -> None:
        for family in self.families:
            self.last_queued.labels(ip_family=family).set_to_current_time()

    def track_pending(self, pending: Callable[[], tuple[int, int]]) -> None:
        """Read the *_changes_pending gauges from ``pending`` at every scrape."""
        self.service_changes_pending.set_function(lambda: pending()[0])
        self.endpoint_changes_pending.set_function(lambda: pending()[1])

    def synced(
        self,
        old: NodeState | None,
        new: NodeState,
        keys: Iterable[ServicePortKey],
        full: bool,
        duration: float,
        trigger_times: Iterable[float],
    ) -> None:
        """Record one successful sync."""
        did_full = getattr(self._backend, "last_sync_full", None)
        if isinstance(did_full, bool):
            full = did_full
        for family in self.families:
            self.sync_duration.labels(ip_family=family).observe(duration)
            kind = self.sync_full_duration if full else self.sync_partial_duration
            kind.labels(ip_family=family).observe(duration)
            self.last_sync.labels(ip_family=family).set_to_current_time()
        now = time.time()
        programming = self.network_programming.labels(ip_family=self.families[0])
        for trigger in trigger_times:
            if trigger > 0:
                programming.observe(max(0.0, now - trigger))
        services, endpoints = count_changes(old, new, keys)
        self.service_changes_total.inc(services)
        self.endpoint_changes_total.inc(endpoints)
        local = [s for s in new.services.values()
                 if s.service.internal_traffic_policy is TrafficPolicy.LOCAL
                 or s.service.external_traffic_policy is TrafficPolicy.LOCAL]
        for family in self.families:
            internal, external = count_no_local_endpoints(
                s for s in local if _family_of(s) == family)
            no_local = self.no_local_endpoints
            no_local.labels(ip_family=family, traffic_policy="internal").set(internal)
            no_local.labels(ip_family=family, traffic_policy="external").set(external)


def _family_of(sps: ServicePortState) -> str:
    ips = sps.service.cluster_ips
    return FAMILY_LABEL[ip_family(ips[0])] if ips else "IPv4"


class ModeFailures(Collector):
    """kube-proxy's per-mode failure counters (nftables: sync failures; ipvs: iptables
    restore failures), read from svcproxy_sync_failures_total: a failed sync of the
    backend is one failure for each IP family it programs."""

    NAMES = {
        "nft": ("kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures"),
        "ipvs": ("kubeproxy_sync_proxy_rules_iptables_restore_failures",
                 "Cumulative proxy iptables restore failures"),
    }

    def __init__(self, mode: str, failures: Counter, families: tuple[str, ...]) -> None:
        self.name, self.help = self.NAMES[mode]
        self.mode, self.failures, self.families = mode, failures, families

    def collect(self) -> Iterable[CounterMetricFamily]:
        value = self.failures._value.get()
        family = CounterMetricFamily(self.name, self.help, labels=["ip_family"])
        for label in self.families:
            family.add_metric([label], value)
        yield family
        if self.mode == "nft":  # svcproxy's nft backend has no separate cleanup step
            cleanup = CounterMetricFamily("kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
                                          "Cumulative proxy nftables cleanup failures",
                                          labels=["ip_family"])
            for label in self.families:
                cleanup.add_metric([label], 0)
            yield cleanup


def count_changes(
    old: NodeState | None, new: NodeState, keys: Iterable[ServicePortKey]
) -> tuple[int, int]:
    """(service ports whose service part changed, endpoints set or deleted) among ``keys``."""
    before: Mapping[ServicePortKey, ServicePortState] = old.services if old else {}
    services = endpoints = 0
    for key in keys:
        a, b = before.get(key), new.services.get(key)
        if a is b:  # unchanged (the client hands the same record on), or in neither
            continue
        if a is None or b is None:  # added or removed: its service and every endpoint
            services += 1
            endpoints += len((a or b).endpoints)  # type: ignore[union-attr]
            continue
        if a.service != b.service:
            services += 1
        endpoints += _endpoint_differences(a.endpoints, b.endpoints)
    return services, endpoints


def _endpoint_differences(a: Mapping[str, Endpoint], b: Mapping[str, Endpoint]) -> int:
    return sum(1 for ip in a.keys() | b.keys() if a.get(ip) != b.get(ip))


def count_no_local_endpoints(services: Iterable[ServicePortState]) -> tuple[int, int]:
    """Service ports with a Local policy, some endpoints, but none usable: (internal, external)."""
    internal = external = 0
    for sps in services:
        if not sps.service.has_endpoints:
            continue
        if sps.service.internal_policy_local and not sps.internal_endpoints():
            internal += 1
        if sps.service.external_policy_local and not sps.external_endpoints():
            external += 1
    return internal, external

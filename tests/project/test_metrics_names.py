"""The agent's /metrics against kube-proxy's list: names, types, labels and buckets per mode.

The list is kube-proxy's (pkg/proxy/metrics as published in Kubernetes' generated metrics
reference: 23 kubeproxy_* names, ip_family on the sync metrics since the release that
split the proxiers per family). A metric svcproxy does not export, or exports otherwise, is
listed in GAPS so that the difference is visible and a change to it fails this test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from svcproxy.sdk import (
    Backend,
    Changes,
    Endpoint,
    NodeConfig,
    NodeState,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk.metrics import NETWORK_PROGRAMMING_BUCKETS, SYNC_BUCKETS, AgentMetrics
from tests.support.netns.harness import netns_or_skip

EXP = "exponential(0.001, 2, 15)"
NET = "network programming"
ALL = ("iptables", "ipvs", "nft")
# name: (type, label names, buckets, modes)
KUBE_PROXY = {
    "kubeproxy_conntrack_reconciler_deleted_entries_total": ("counter", {"ip_family"}, None, ALL),
    "kubeproxy_conntrack_reconciler_sync_duration_seconds": ("histogram", {"ip_family"}, EXP,
                                                             ALL),
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total": ("counter", set(), None,
                                                                  ("iptables",)),
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total": ("counter", set(), None,
                                                                      ("iptables",)),
    "kubeproxy_network_programming_duration_seconds": ("histogram", {"ip_family"}, NET, ALL),
    "kubeproxy_proxy_healthz_total": ("counter", {"code"}, None, ALL),
    "kubeproxy_proxy_livez_total": ("counter", {"code"}, None, ALL),
    "kubeproxy_sync_full_proxy_rules_duration_seconds": ("histogram", {"ip_family"}, EXP, ALL),
    "kubeproxy_sync_partial_proxy_rules_duration_seconds": ("histogram", {"ip_family"}, EXP,
                                                            ALL),
    "kubeproxy_sync_proxy_rules_duration_seconds": ("histogram", {"ip_family"}, EXP, ALL),
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending": ("gauge", set(), None, ALL),
    "kubeproxy_sync_proxy_rules_endpoint_changes_total": ("counter", set(), None, ALL),
    "kubeproxy_sync_proxy_rules_iptables_last": ("gauge", {"ip_family", "table"}, None,
                                                 ("iptables",)),
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": (
        "counter", {"ip_family"}, None, ("iptables",)),
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": (
        "counter", {"ip_family"}, None, ("iptables", "ipvs")),
    "kubeproxy_sync_proxy_rules_iptables_total": ("gauge", {"ip_family", "table"}, None,
                                                  ("iptables",)),
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": ("gauge", {"ip_family"}, None,
                                                                 ALL),
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds": ("gauge", {"ip_family"}, None, ALL),
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": ("counter", {"ip_family"},
                                                                   None, ("nft",)),
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total": ("counter", {"ip_family"}, None,
                                                                ("nft",)),
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total": (
        "gauge", {"ip_family", "traffic_policy"}, None, ALL),
    "kubeproxy_sync_proxy_rules_service_changes_pending": ("gauge", set(), None, ALL),
    "kubeproxy_sync_proxy_rules_service_changes_total": ("counter", set(), None, ALL),
}
# What svcproxy's backends do not (yet) export as kube-proxy does, per mode.
GAPS: dict[str, dict[str, str]] = {"iptables": {}, "ipvs": {}, "nft": {}}
BUCKETS = {EXP: SYNC_BUCKETS, NET: NETWORK_PROGRAMMING_BUCKETS}


class ModeBackend:
    """A backend named as the mode (nft and ipvs register no metrics of their own)."""

    def __init__(self, mode: str) -> None:
        self.name = mode


@contextmanager
def iptables_backend() -> Iterator[Backend]:
    """The real iptables backend, programming a namespace of its own (both families)."""
    from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions

    with netns_or_skip("spmet") as netns:
        yield IptablesBackend(NodeConfig("node-a", cluster_cidrs=("10.0.0.0/8",)),
                              IptablesOptions(mode="nft", prefix=("ip", "netns", "exec", netns)))


def nodeport_state() -> NodeState:
    key = ServicePortKey("default", "web", "http", Protocol.TCP)
    port = ServicePort(key, type=ServiceType.NODE_PORT, cluster_ips=("172.30.0.1", "fd00:30::1"),
                       port=80, node_port=30080, has_endpoints=True)
    eps = {ip: Endpoint(ip, 8080, internal=True, external=True, cluster=True)
           for ip in ("10.1.0.1", "fd00:10::1")}
    return NodeState("node-a", 1, None, {key: ServicePortState(port, eps)})


def exposition(mode: str, backend: Backend | None = None,
               ) -> dict[str, tuple[str, set[str], tuple[float, ...]]]:
    """{name: (type, label names, buckets)} of the agent's /metrics for ``mode`` (with
    ``backend``: after its first sync of a NodePort service in both families)."""
    metrics = AgentMetrics(families=("IPv4", "IPv6"))
    metrics.attach_backend(backend if backend is not None else ModeBackend(mode))
    if backend is not None:
        backend.sync(nodeport_state(), Changes(full=True, reason="initial"))
    metrics.healthz_total.labels(code="200")
    metrics.livez_total.labels(code="200")
    metrics.no_local_endpoints.labels(ip_family="IPv4", traffic_policy="internal")
    metrics.queued()
    metrics.last_sync.labels(ip_family="IPv4").set(1)
    text = generate_latest(metrics.registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        buckets = tuple(sorted({float(s.labels["le"]) for s in family.samples
                                if s.name.endswith("_bucket")} - {float("inf")}))
        found[name] = (family.type, labels, buckets)
    return found


@pytest.mark.parametrize("mode", [pytest.param("iptables", marks=pytest.mark.netns), "ipvs",
                                  "nft"])
def test_metrics_match_kube_proxys_list(mode: str) -> None:
    if mode == "iptables":
        with iptables_backend() as backend:
            served = exposition(mode, backend)
    else:
        served = exposition(mode)
    differences = {}
    for name, (kind, labels, buckets, modes) in KUBE_PROXY.items():
        if mode not in modes:
            assert name not in served, f"{name} is not one of mode {mode}'s metrics"
            continue
        if name not in served:
            differences[name] = "missing"
            continue
        got_kind, got_labels, got_buckets = served[name]
        assert got_kind == kind, name
        if got_labels != labels:
            differences[name] = "labels"
        if buckets is not None:
            assert got_buckets == tuple(sorted(BUCKETS[buckets])), name
    assert differences == GAPS[mode]
    ours = {n for n in served if n.startswith("kubeproxy_")} - set(KUBE_PROXY)
    assert not ours, f"kubeproxy_* names kube-proxy does not have: {ours}"
    assert all(n.startswith(("kubeproxy_", "svcproxy_", "process_")) for n in served), \
        served.keys()


def test_process_metrics_are_served_as_kube_proxys_are() -> None:
    """kube-proxy's /metrics carries the process collector's series, which its dashboards'
    CPU and memory panels read (process_cpu_seconds_total, process_resident_memory_bytes)."""
    served = exposition("nft")
    for name, kind in (("process_cpu_seconds_total", "counter"),
                       ("process_resident_memory_bytes", "gauge"),
                       ("process_start_time_seconds", "gauge"), ("process_open_fds", "gauge")):
        assert served.get(name, ("missing",))[0] == kind, name


def test_a_sync_is_recorded_for_each_family_of_the_node() -> None:
    from svcproxy.sdk.metrics import node_families

    assert node_families(["192.0.2.1", "2001:db8::1"]) == ("IPv4", "IPv6")
    assert node_families(["2001:db8::1"]) == ("IPv6",)
    assert node_families([]) == ("IPv4",)
    metrics = AgentMetrics(families=("IPv4", "IPv6"))
    metrics.conntrack_reconciled(6, 0.002, 3)
    text = generate_latest(metrics.registry).decode()
    assert 'kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 3.0' in text
    assert 'kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv6"} 1.0' \
        in text

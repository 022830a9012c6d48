"""Which stale UDP/SCTP conntrack entries are deleted (pure), and the conntrack(8) arguments."""

from __future__ import annotations

from svcproxy.agent.conntrack import ConntrackFilter, stale_conntrack_filters
from svcproxy.agent.conntrack_cli import ConntrackCleaner, conntrack_args
from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk.backend import NodeState

UDP = Protocol.UDP
DNS = ServicePortKey("kube-system", "dns", "dns", UDP)
TCP_DNS = ServicePortKey("kube-system", "dns", "dns-tcp", Protocol.TCP)


def dns(*endpoints: Endpoint, node_port: int = 0, key: ServicePortKey = DNS) -> ServicePortState:
    svc = ServicePort(
        key, type=ServiceType.LOAD_BALANCER if node_port else ServiceType.CLUSTER_IP,
        cluster_ips=("10.96.0.10", "fd00::10"), port=53, node_port=node_port,
        external_ips=("192.0.2.10",),
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.10"),
                               LoadBalancerIngress("198.51.100.11", "Proxy")),
        has_endpoints=bool(endpoints),
    )
    return ServicePortState(svc, {e.ip: e for e in endpoints})


def node(*services: ServicePortState) -> NodeState:
    return NodeState("n1", 1, None, {s.key: s for s in services})


EP1 = Endpoint("10.1.0.1", 5353)
EP2 = Endpoint("10.1.0.2", 5353)


def test_removed_endpoint_entries_are_deleted_per_service_ip_and_node_port() -> None:
    filters = stale_conntrack_filters(node(dns(EP1, EP2, node_port=30053)),
                                      node(dns(EP2, node_port=30053)))
    assert filters == sorted([
        ConntrackFilter(UDP, 4, "10.96.0.10", 53, "10.1.0.1"),
        ConntrackFilter(UDP, 4, "192.0.2.10", 53, "10.1.0.1"),
        ConntrackFilter(UDP, 4, "198.51.100.10", 53, "10.1.0.1"),
        ConntrackFilter(UDP, 4, "", 30053, "10.1.0.1"),
    ])


def test_endpoint_that_stops_serving_counts_as_removed() -> None:
    not_serving = Endpoint("10.1.0.1", 5353, ready=False, serving=False)
    filters = stale_conntrack_filters(node(dns(EP1, EP2)), node(dns(not_serving, EP2)))
    assert ConntrackFilter(UDP, 4, "10.96.0.10", 53, "10.1.0.1") in filters


def test_terminating_but_serving_endpoint_keeps_its_flows() -> None:
    terminating = Endpoint("10.1.0.1", 5353, ready=False, serving=True, terminating=True)
    assert stale_conntrack_filters(node(dns(EP1, EP2)), node(dns(terminating, EP2))) == []


def test_endpoint_whose_port_changed_is_stale() -> None:
    moved = Endpoint("10.1.0.1", 5454)
    filters = stale_conntrack_filters(node(dns(EP1, EP2)), node(dns(moved, EP2)))
    assert ConntrackFilter(UDP, 4, "10.96.0.10", 53, "10.1.0.1") in filters


def test_first_endpoint_clears_entries_to_every_frontend_and_node_port() -> None:
    filters = stale_conntrack_filters(node(dns(node_port=30053)), node(dns(EP1, node_port=30053)))
    assert filters == sorted([
        ConntrackFilter(UDP, 4, "10.96.0.10", 53),
        ConntrackFilter(UDP, 6, "fd00::10", 53),
        ConntrackFilter(UDP, 4, "192.0.2.10", 53),
        ConntrackFilter(UDP, 4, "198.51.100.10", 53),
        ConntrackFilter(UDP, 4, "", 30053),
        ConntrackFilter(UDP, 6, "", 30053),
    ])


def test_new_service_with_endpoints_and_deleted_service_are_cleaned() -> None:
    assert ConntrackFilter(UDP, 4, "10.96.0.10", 53) in stale_conntrack_filters(
        None, node(dns(EP1)))
    assert ConntrackFilter(UDP, 4, "10.96.0.10", 53) in stale_conntrack_filters(
        node(dns(EP1)), node())


def test_tcp_and_unchanged_services_need_nothing() -> None:
    tcp_before, tcp_after = dns(EP1, EP2, key=TCP_DNS), dns(EP2, key=TCP_DNS)
    assert stale_conntrack_filters(node(tcp_before), node(tcp_after)) == []
    assert stale_conntrack_filters(node(dns(EP1)), node(dns(EP1))) == []
    assert stale_conntrack_filters(node(dns()), node(dns())) == []


def test_sctp_is_cleaned_like_udp() -> None:
    key = ServicePortKey("ns", "s", "", Protocol.SCTP)
    filters = stale_conntrack_filters(node(dns(EP1, EP2, key=key)), node(dns(EP2, key=key)))
    assert ConntrackFilter(Protocol.SCTP, 4, "10.96.0.10", 53, "10.1.0.1") in filters


def test_ipv6_endpoint_only_matches_ipv6_service_ips() -> None:
    v6 = Endpoint("fd01::1", 5353)
    filters = stale_conntrack_filters(node(dns(v6, EP2)), node(dns(EP2)))
    assert filters == [ConntrackFilter(UDP, 6, "fd00::10", 53, "fd01::1")]


def test_conntrack_arguments() -> None:
    assert conntrack_args(ConntrackFilter(UDP, 4, "10.96.0.10", 53, "10.1.0.1")) == [
        "-D", "-f", "ipv4", "-p", "udp", "--orig-dst", "10.96.0.10", "--orig-port-dst", "53",
        "--reply-src", "10.1.0.1"]
    assert conntrack_args(ConntrackFilter(Protocol.SCTP, 6, orig_dport=30053)) == [
        "-D", "-f", "ipv6", "-p", "sctp", "--orig-port-dst", "30053"]


class FailingTool:
    def __init__(self) -> None:
        self.seen: list[ConntrackFilter] = []

    def delete(self, f: ConntrackFilter) -> int:
        self.seen.append(f)
        if len(self.seen) == 1:
            raise OSError("conntrack: netlink error")
        return 1


def test_one_failed_deletion_does_not_stop_the_others() -> None:
    tool = FailingTool()
    cleaner = ConntrackCleaner(tool)  # type: ignore[arg-type]
    deleted = cleaner.after_sync(node(dns(EP1, EP2)), node(dns(EP2)))
    assert len(tool.seen) == 3 and deleted == 2

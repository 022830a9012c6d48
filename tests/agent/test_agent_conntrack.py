"""Which stale UDP/SCTP conntrack entries are deleted (pure), and the conntrack(8) arguments."""

from __future__ import annotations

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
from svcproxy.sdk.conntrack import (
    ConntrackEntry,
    ConntrackFilter,
    matches,
    stale_conntrack_filters,
)
from svcproxy.sdk.conntrack_cli import ConntrackCleaner, conntrack_args, parse_entries

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


class FakeTool:
    """Holds a table; the first delete fails (or listing fails when ``list_fails``)."""

    def __init__(self, entries: list[ConntrackEntry], list_fails: bool = False) -> None:
        self.entries = entries
        self.list_fails = list_fails
        self.deleted: list[ConntrackFilter] = []
        self.calls = 0

    def list(self, family: int, protocol: Protocol) -> list[ConntrackEntry]:
        if self.list_fails:
            raise OSError("conntrack: netlink error")
        return [e for e in self.entries if (e.family, e.protocol) == (family, protocol)]

    def delete(self, f: ConntrackFilter) -> int:
        self.calls += 1
        if self.calls == 1:
            raise OSError("conntrack: netlink error")
        self.deleted.append(f)
        return 1


def entry(dst: str, port: int, reply: str) -> ConntrackEntry:
    return ConntrackEntry(UDP, 4, dst, port, reply)


def test_only_filters_matching_existing_entries_are_run() -> None:
    tool = FakeTool([entry("10.96.0.10", 53, "10.1.0.1"), entry("192.0.2.10", 53, "10.1.0.1"),
                     entry("10.96.0.10", 53, "10.1.0.2"), entry("10.96.0.99", 53, "10.1.0.1")])
    deleted = ConntrackCleaner(tool).after_sync(node(dns(EP1, EP2)), node(dns(EP2)))
    assert tool.calls == 2, "one delete per matching filter; the first one failed"
    assert deleted == 1 and len(tool.deleted) == 1


def test_when_listing_fails_every_filter_is_tried() -> None:
    tool = FakeTool([], list_fails=True)
    ConntrackCleaner(tool).after_sync(node(dns(EP1, EP2)), node(dns(EP2)))
    assert tool.calls == 3


def test_conntrack_listing_is_parsed_original_then_reply() -> None:
    text = (
        "udp      17 29 src=10.200.0.2 dst=10.96.0.10 sport=40053 dport=53 [UNREPLIED] "
        "src=10.96.0.10 dst=10.200.0.2 sport=53 dport=40053 mark=0 use=1\n"
        "udp      17 25 src=10.200.0.2 dst=10.96.0.10 sport=40054 dport=53 "
        "src=10.200.1.2 dst=10.200.0.2 sport=5353 dport=40054 [ASSURED] mark=0 use=1\n"
        "conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.\n"
    )
    assert parse_entries(text, 4, UDP) == [entry("10.96.0.10", 53, "10.96.0.10"),
                                          entry("10.96.0.10", 53, "10.200.1.2")]
    v6 = ("udp      17 29 src=fd00::2 dst=fd00:96::000a sport=1 dport=53 src=fd01::5 "
          "dst=fd00::2 sport=5353 dport=1 mark=0 use=1")
    assert parse_entries(v6, 6, UDP) == [ConntrackEntry(UDP, 6, "fd00:96::a", 53, "fd01::5")]


def test_filter_matching_treats_empty_fields_as_wildcards() -> None:
    e = entry("10.96.0.10", 30053, "10.1.0.1")
    assert matches(ConntrackFilter(UDP, 4, orig_dport=30053, reply_src="10.1.0.1"), e)
    assert matches(ConntrackFilter(UDP, 4, orig_dport=30053), e)
    assert not matches(ConntrackFilter(UDP, 4, orig_dport=30053, reply_src="10.1.0.2"), e)
    assert not matches(ConntrackFilter(UDP, 6, orig_dport=30053), e)
    assert not matches(ConntrackFilter(Protocol.SCTP, 4, orig_dport=30053), e)

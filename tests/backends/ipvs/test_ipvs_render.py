"""What one Kubernetes service port becomes in IPVS on this node (pure)."""

from __future__ import annotations

from dataclasses import replace

from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.desired import Desired, TouchedObjects
from svcproxy.backends.ipvs.genl import DestId, ServiceId, fwmark_service
from svcproxy.backends.ipvs.names import SCHEDULER_ANNOTATION, is_our_fwmark
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.backends.ipvs.render import RenderContext, render_port
from svcproxy.model import (
    LoadBalancerIngress,
    Protocol,
    ServicePortState,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
)
from svcproxy.sdk import NodeConfig, resolve_context
from tests.support.ipvs.states import endpoint, port_state

CTX = RenderContext("rr", node_port_ips=("192.168.0.10",), node_ips=("192.168.0.10",))


def _servers(plan) -> dict[ServiceId, frozenset[DestId]]:
    return {v.spec.id: v.dests for v in plan.servers}


def test_one_virtual_server_per_address_and_one_real_server_per_endpoint() -> None:
    state = port_state(
        "web", "10.96.0.10", [endpoint("10.244.1.2"), endpoint("10.244.2.2")],
        type=ServiceType.LOAD_BALANCER, node_port=30080, external_ips=("203.0.113.7",),
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.1"),
                               LoadBalancerIngress("198.51.100.2", "Proxy")))
    plan = render_port(state, CTX)
    both = frozenset({DestId("10.244.1.2", 8080), DestId("10.244.2.2", 8080)})
    assert _servers(plan) == {
        ServiceId("TCP", "10.96.0.10", 80): both,
        ServiceId("TCP", "203.0.113.7", 80): both,
        ServiceId("TCP", "198.51.100.1", 80): both,
        ServiceId("TCP", "192.168.0.10", 30080): both,
    }
    assert plan.addresses == {"10.96.0.10", "203.0.113.7"}, "LB ingress IPs are not bound"
    assert plan.local_routes == {"198.51.100.1"}, "ipMode Proxy is left to the LB"
    assert ("KUBE-NODE-PORT-TCP", "30080") in plan.entries
    assert ("KUBE-LOAD-BALANCER", "198.51.100.1,tcp:80") in plan.entries


def test_cluster_ip_uses_internal_endpoints_external_addresses_external_ones() -> None:
    state = port_state(
        "local", "10.96.0.11",
        [endpoint("10.244.1.2", external=False), endpoint("10.244.2.2", internal=False)],
        type=ServiceType.NODE_PORT, node_port=30081,
        external_traffic_policy=TrafficPolicy.LOCAL)
    servers = _servers(render_port(state, CTX))
    assert servers[ServiceId("TCP", "10.96.0.11", 80)] == {DestId("10.244.1.2", 8080)}
    assert servers[ServiceId("TCP", "192.168.0.10", 30081)] == {DestId("10.244.2.2", 8080)}
    entries = render_port(state, CTX).entries
    assert ("KUBE-NODE-PORT-LOCAL-TCP", "30081") in entries
    assert ("KUBE-NODE-PORT-TCP", "30081") not in entries


def test_scheduler_annotation_overrides_the_default_and_bad_values_warn() -> None:
    good = port_state("a", "10.96.0.12", annotations=[(SCHEDULER_ANNOTATION, "sh")])
    bad = port_state("b", "10.96.0.13", annotations=[(SCHEDULER_ANNOTATION, "fastest")])
    assert render_port(good, CTX).servers[0].spec.scheduler == "sh"
    plan = render_port(bad, CTX)
    assert plan.servers[0].spec.scheduler == "rr"
    assert "fastest" in plan.warnings[0] and "rr" in plan.warnings[0]


def test_client_ip_affinity_is_persistence_with_the_service_timeout() -> None:
    default = port_state("a", "10.96.0.14", session_affinity=SessionAffinity.CLIENT_IP)
    custom = port_state("b", "10.96.0.15", affinity_timeout=60)
    none = port_state("c", "10.96.0.16")
    assert render_port(default, CTX).servers[0].spec.persistence_timeout == 10800
    assert render_port(custom, CTX).servers[0].spec.persistence_timeout == 60
    assert render_port(none, CTX).servers[0].spec.persistence_timeout == 0


def test_real_servers_match_the_virtual_server_family() -> None:
    state = port_state("dual", "10.96.0.17", [endpoint("10.244.1.2"), endpoint("fd00::2")])
    state = ServicePortState(replace(state.service, cluster_ips=("10.96.0.17", "fd00:96::17")),
                             state.endpoints)
    servers = _servers(render_port(state, CTX))
    assert servers[ServiceId("TCP", "10.96.0.17", 80)] == {DestId("10.244.1.2", 8080)}
    assert servers[ServiceId("TCP", "fd00:96::17", 80)] == {DestId("fd00::2", 8080)}
    assert (N.set_name(N.CLUSTER_IP, 6), "fd00:96::17,tcp:80") in render_port(state, CTX).entries


def test_source_ranges_fill_the_firewall_sets_and_allow_the_node() -> None:
    state = port_state(
        "fw", "10.96.0.18", [endpoint("10.244.1.2")], type=ServiceType.LOAD_BALANCER,
        node_port=30082, load_balancer_ingress=(LoadBalancerIngress("198.51.100.3"),),
        load_balancer_source_ranges=("203.0.113.0/24",))
    entries = render_port(state, CTX).entries
    key = "198.51.100.3,tcp:80"
    assert ("KUBE-LOAD-BALANCER-FW", key) in entries
    assert ("KUBE-LOAD-BALANCER-SOURCE-CIDR", f"{key},203.0.113.0/24") in entries
    assert ("KUBE-LOAD-BALANCER-SOURCE-IP", f"{key},192.168.0.10") in entries


def test_hairpin_and_sctp_node_ports() -> None:
    state = port_state("sctp", "10.96.0.19", [endpoint("10.244.1.2")], protocol=Protocol.SCTP,
                       type=ServiceType.NODE_PORT, node_port=30083)
    entries = render_port(state, CTX).entries
    assert ("KUBE-LOOP-BACK", "10.244.1.2,sctp:8080,10.244.1.2") in entries
    assert ("KUBE-NODE-PORT-SCTP-HASH", "192.168.0.10,sctp:30083") in entries


def test_node_port_addresses_come_from_the_node_context() -> None:
    """CIDRs select from the node context (loopback never a virtual server); a family left
    open is every address on the node's interfaces but kube-ipvs0's."""
    backend = IpvsBackend(NodeConfig("n1", node_ips=("192.168.0.10", "fd00::10")),
                          IpvsOptions(), families=(4,))
    locals_ = ["192.168.0.10", "fd00::10", "10.0.0.5", "127.0.0.1", "fe80::1"]

    def ctx(**flags: object) -> RenderContext:
        config = replace(backend.config, **flags)  # type: ignore[arg-type]
        node = resolve_context(config, None, locals_)
        return backend._context(node)

    assert ctx().node_port_ips == ("192.168.0.10", "10.0.0.5", "fd00::10")
    assert ctx(node_port_addresses=("primary",)).node_port_ips == ("192.168.0.10", "fd00::10")
    cidrs = ctx(node_port_addresses=("10.0.0.0/8", "127.0.0.0/8", "fd00::/8"))
    assert cidrs.node_port_ips == ("10.0.0.5", "fd00::10")
    assert cidrs.node_ips == ("192.168.0.10", "fd00::10")


def test_external_policy_local_short_circuits_pods_to_every_endpoint() -> None:
    state = port_state(
        "etp", "10.96.0.20",
        [endpoint("10.244.1.2", external=False, is_local=False), endpoint("10.244.2.2")],
        type=ServiceType.LOAD_BALANCER, node_port=30084,
        external_traffic_policy=TrafficPolicy.LOCAL,
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.4"),))
    desired = Desired()
    desired.replace(state.key, None, render_port(state, CTX), TouchedObjects())
    mark = desired.marks.get(state.key, 4)
    assert is_our_fwmark(mark) and not mark & 0x4000
    everyone = {DestId("10.244.1.2", 8080), DestId("10.244.2.2", 8080)}
    assert desired.server(fwmark_service(4, mark)).dests == everyone
    assert desired.server(ServiceId("TCP", "198.51.100.4", 80)).dests == {
        DestId("10.244.2.2", 8080)}
    marked = {e for s, e in desired.entries if s == "KUBE-EXTERNAL-LOCAL-FWMARK"}
    assert marked == {f"198.51.100.4,tcp:80 skbmark {mark:#x}",
                      f"192.168.0.10,tcp:30084 skbmark {mark:#x}"}
    assert not {e for s, e in desired.entries if s == "KUBE-NO-LOCAL-ENDPOINTS"}


def test_external_policy_local_without_local_endpoints_is_dropped_and_mark_freed() -> None:
    state = port_state("etp", "10.96.0.21", [endpoint("10.244.1.2", external=False)],
                       external_ips=("203.0.113.9",),
                       external_traffic_policy=TrafficPolicy.LOCAL)
    plan = render_port(state, CTX)
    assert ("KUBE-NO-LOCAL-ENDPOINTS", "203.0.113.9,tcp:80") in plan.entries
    desired = Desired()
    desired.replace(state.key, None, plan, TouchedObjects())
    desired.replace(state.key, plan, None, TouchedObjects())
    assert desired.marks.marks == {} and not desired.claims


def test_short_circuit_uses_the_cluster_set_not_the_internal_one() -> None:
    """iTP and eTP Local: ClusterIP traffic uses the local set, but pods and the node
    reaching an external address are short-circuited to the cluster-wide set."""
    state = port_state(
        "etpitp", "10.96.0.22",
        [endpoint("10.244.1.2", is_local=False, internal=False, external=False),
         endpoint("10.244.2.2")],
        type=ServiceType.LOAD_BALANCER, node_port=30085,
        external_traffic_policy=TrafficPolicy.LOCAL, internal_traffic_policy=TrafficPolicy.LOCAL,
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.5"),))
    desired = Desired()
    desired.replace(state.key, None, render_port(state, CTX), TouchedObjects())
    assert desired.server(ServiceId("TCP", "10.96.0.22", 80)).dests == {
        DestId("10.244.2.2", 8080)}
    mark = desired.marks.get(state.key, 4)
    assert desired.server(fwmark_service(4, mark)).dests == {
        DestId("10.244.1.2", 8080), DestId("10.244.2.2", 8080)}


def test_external_policy_local_without_any_endpoint_is_not_dropped() -> None:
    """No endpoint anywhere: the virtual server without real servers refuses; nothing is
    put in the drop set (which would turn the refusal into a timeout)."""
    state = port_state("etpnone", "10.96.0.23", [], external_ips=("203.0.113.10",),
                       type=ServiceType.NODE_PORT, node_port=30086,
                       external_traffic_policy=TrafficPolicy.LOCAL)
    plan = render_port(state, CTX)
    assert not {e for s, e in plan.entries if s == "KUBE-NO-LOCAL-ENDPOINTS"}
    assert ServiceId("TCP", "203.0.113.10", 80) in {v.spec.id for v in plan.servers}


def test_no_virtual_server_on_loopback() -> None:
    ctx = RenderContext(node_port_ips=("127.0.0.1", "192.168.0.10", "::1"),
                        node_ips=("192.168.0.10",))
    state = port_state("np", "10.96.0.24", [endpoint("10.244.1.2")], protocol=Protocol.SCTP,
                       type=ServiceType.NODE_PORT, node_port=30087)
    plan = render_port(state, ctx)
    addresses = {v.spec.id.address for v in plan.servers}
    assert addresses == {"10.96.0.24", "192.168.0.10"}
    assert not any("127.0.0.1" in e for _, e in plan.entries)

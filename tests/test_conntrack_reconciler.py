"""The conntrack reconciler's decision (pure) and its run against a real conntrack table in a
namespace this test creates: a stale flow from before the backend started is deleted, valid
ones stay."""

from __future__ import annotations

from svcproxy.agent.conntrack_netlink import Ctnetlink, Flow
from svcproxy.agent.conntrack_reconciler import ConntrackReconciler, stale_flows
from svcproxy.agent.metrics import AgentMetrics
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState
from tests.test_agent_conntrack_netns import PODS, SERVICE_IP, Lab, dnat_to, lab, service

__all__ = ["lab"]  # the namespaces fixture

DNS = ServicePortKey("kube-system", "dns", "dns", Protocol.UDP)
SYSLOG = ServicePortKey("ops", "syslog", "syslog", Protocol.UDP)


def state(*ports: tuple[ServicePortKey, str, int, int, dict[str, bool]]) -> NodeState:
    services = {}
    for key, ip, port, node_port, eps in ports:
        endpoints = {a: Endpoint(a, 5353, ready=r, serving=r) for a, r in eps.items()}
        svc = ServicePort(key, cluster_ips=(ip,), port=port, node_port=node_port,
                          has_endpoints=any(eps.values()))
        services[key] = ServicePortState(svc, endpoints)
    return NodeState("node", 1, None, services)


def flow(dst: str, dport: int, reply: str, src: str = "10.0.0.1", proto: int = 17) -> Flow:
    return Flow(4, proto, src, dst, 40000, dport, reply)


def test_stale_flows_as_kube_proxy_decides() -> None:
    new = state((DNS, "10.96.0.10", 53, 30053, {"10.244.1.5": True, "10.244.1.6": False}),
                (SYSLOG, "10.96.0.20", 514, 0, {}))
    flows = {
        "to a serving endpoint": flow("10.96.0.10", 53, "10.244.1.5"),
        "to an endpoint not serving": flow("10.96.0.10", 53, "10.244.1.6"),
        "to an endpoint gone": flow("10.96.0.10", 53, "10.244.9.9"),
        "not DNATed, now has endpoints": flow("10.96.0.10", 53, "10.96.0.10"),
        "not DNATed, still none": flow("10.96.0.20", 514, "10.96.0.20"),
        "node port, endpoint gone": flow("192.168.1.10", 30053, "10.244.9.9"),
        "node port, serving": flow("192.168.1.10", 30053, "10.244.1.5"),
        "not a service": flow("10.50.0.1", 53, "10.244.9.9"),
        "another port of the IP": flow("10.96.0.10", 54, "10.244.9.9"),
        "TCP is not ours": flow("10.96.0.10", 53, "10.244.9.9", proto=6),
    }
    stale = set(stale_flows(flows.values(), new))
    assert {name for name, f in flows.items() if f in stale} == {
        "to an endpoint not serving", "to an endpoint gone", "not DNATed, now has endpoints",
        "node port, endpoint gone"}
    # A deleted service's flows are found through the change from the old state.
    old = state((DNS, "10.96.0.10", 53, 0, {"10.244.1.5": True}))
    gone = flow("10.96.0.10", 53, "10.244.1.5")
    assert stale_flows([gone], state(), old) == [gone]
    assert stale_flows([gone], state()) == []


def test_reconciler_deletes_a_stale_flow_from_before_it_started(lab: Lab) -> None:
    lab.nft(dnat_to("pod1", "pod2"))
    first = lab.ask()
    assert first in PODS, first
    remaining = "pod2" if first == "pod1" else "pod1"
    # While the backend was down, the endpoint went away and the rules were rewritten.
    lab.nft(dnat_to(remaining))
    assert lab.ask() == first, "the stale entry keeps the flow on the removed endpoint"
    table = Ctnetlink(lab.ns("node"))
    try:
        valid = Flow(4, 17, "10.200.0.9", SERVICE_IP, 41000, 53, PODS[remaining])
        other = Flow(4, 17, "10.200.0.9", "10.50.0.1", 41000, 53, "10.50.0.1")
        tcp = Flow(4, 6, "10.200.0.9", SERVICE_IP, 41000, 53, PODS[first])
        assert table.add([(valid, 5353), (other, 53), (tcp, 5353)]) == 3
        metrics = AgentMetrics(families=("IPv4",))
        reconciler = ConntrackReconciler(lambda: Ctnetlink(lab.ns("node")), families=(4,))
        reconciler.metrics = metrics
        assert reconciler.after_sync(None, service(remaining)) == 1  # a fresh start: no old
        left = table.dump(4, 17)
        assert not any(f.reply_src == PODS[first] for f in left)
        assert valid in left and other in left
        assert any(f.orig_dport == 53 for f in table.dump(4, 6)), "TCP is left alone"
        assert lab.ask() == remaining
        assert metrics.conntrack_deleted_total.labels(ip_family="IPv4")._value.get() == 1
        assert reconciler.after_sync(None, service(remaining)) == 0
    finally:
        table.close()


def test_entries_parse_back_in_both_families() -> None:
    from svcproxy.agent.conntrack_netlink import add_message, parse_flow

    for f in (flow("10.96.0.10", 53, "10.244.1.5"),
              Flow(6, 132, "fd00::1", "fd00:96::a", 40000, 5000, "fd00:244::5"),
              Flow(4, 17, "10.0.0.1", "10.96.0.10", 1, 65535, "10.96.0.10")):
        message = add_message(f, 5353, 30, 1)
        assert parse_flow(message, 16, len(message)) == f

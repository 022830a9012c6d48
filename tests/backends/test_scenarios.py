"""Real-traffic scenarios shared by every backend (nft, iptables, ebpf; ipvs in its guest).

One lab per backend: node1 (pods a, b and an in-cluster client) and node2
(pods c, d) joined by a LAN with two external clients; the real frontend
watches a manifest directory and the real backend runs on node1. Each test
writes its own Services (own ClusterIPs) and EndpointSlices, asserts what
real connections see, changes the manifests and asserts again, without
restarting anything. Pods answer with their name, the source address they
saw and the port they were reached on.

The ``-local`` cases (nft, iptables, ebpf) run the backend in local mode (kube-proxy's
flags, a kubeconfig, no frontend address) against the stand-in apiserver inside node1's
namespace holding the same objects; after each scenario the state it follows must equal
the frontend's for node1 in split mode.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.lab import manifests as m
from tests.support.lab.client import Summary, probe, summarize
from tests.support.lab.processes import LAN4, LAN6
from tests.support.netns import leftovers
from tests.support.netns.backends import BACKENDS, BackendCase
from tests.support.netns.harness import ScenarioLab, missing_requirements
from tests.support.world_fixture import running

pytestmark = pytest.mark.netns
COUNT = 40  # connections per spread check: P(missing one of 4 pods) < 1e-4
_why = missing_requirements()


@pytest.fixture(scope="module", params=BACKENDS, ids=str)
def lab(request: pytest.FixtureRequest) -> Iterator[ScenarioLab]:
    if _why:
        pytest.skip(_why)
    case: BackendCase = request.param
    yield from running(ScenarioLab(case))


@pytest.fixture(autouse=True)
def _scenario_applies(request: pytest.FixtureRequest, lab: ScenarioLab) -> None:
    reason = lab.backend.skip_reason(request.node.originalname)
    if reason:
        pytest.skip(f"not for {lab.backend.name}: {reason}")


@pytest.fixture(autouse=True)
def _local_state_equals_split_mode(lab: ScenarioLab) -> Iterator[None]:
    yield
    if lab.backend.local and lab.agent is not None:
        lab.assert_same_state()


def eps(lab: ScenarioLab, *pods: str, family: int = 4, **conditions: Any) -> list[m.Doc]:
    return [m.endpoint(lab.spec.pod(p), family, **conditions) for p in pods]


def web_service(lab: ScenarioLab, name: str, cips: tuple[str, ...], pods: tuple[str, ...],
                **spec: Any) -> list[m.Doc]:
    """A service with one TCP port 80 -> 8080 (named http) on ``pods`` in each family."""
    ports = spec.pop("ports", None) or [m.port("http", 80, 8080)]
    docs = [m.service(name, cips, ports, **spec)]
    for family in sorted({6 if ":" in c else 4 for c in cips}):
        docs.append(m.endpoint_slice(
            name, eps(lab, *pods, family=family), [m.slice_port("http", 8080)], family))
    return docs


def reach(lab: ScenarioLab, client: str, proto: str, host: str, port: int,
          expect: set[str], count: int = COUNT, *, sockets: bool = True) -> Summary:
    """Every attempt is answered and exactly the ``expect`` pods answer; with ``sockets``
    False the attempts are made by a process outside the socket programs' cgroup (on a
    socket-level backend, traffic its packet path takes; on any other, the same probe)."""
    first = _probe(lab, client, proto, host, port, 1, 0.5, sockets)
    assert not first.errors, f"{client} -> {host}:{port}/{proto}: {dict(first.errors)}"
    seen = _probe(lab, client, proto, host, port, count, 1.0, sockets)
    where = f"{client} -> {host}:{port}/{proto}: {dict(seen.names)}, in order {seen.sequence}"
    assert not seen.errors, f"{where}: {dict(seen.errors)}"
    assert seen.answered == expect, where
    return seen


def _probe(lab: ScenarioLab, client: str, proto: str, host: str, port: int, count: int,
           timeout: float, sockets: bool) -> Summary:
    if sockets:
        return lab.probe(client, proto, host, port, count, timeout)
    return summarize(probe(lab.lab.ns(client), proto, host, port, count, timeout))


def fails(lab: ScenarioLab, client: str, proto: str, host: str, port: int, error: str,
          timeout: float = 1.0) -> None:
    """One attempt fails with ``error`` ("refused" at once, or "timeout": dropped)."""
    seen = lab.probe(client, proto, host, port, 1, timeout)
    assert seen.errors == {error: 1}, (
        f"{client} -> {host}:{port}/{proto}: wanted {error}, got "
        f"{dict(seen.errors) or dict(seen.names)}")


def handles_outside(lab: ScenarioLab) -> bool:
    """Whether the case handles connections from outside node1 (the socket programs alone
    see only node1's own)."""
    return str(lab.backend) != "ebpf-only"


def node_addresses(lab: ScenarioLab, node: str = "node1") -> set[str]:
    spec = lab.spec.node(node)
    return {spec.ipv4, spec.ipv6, *spec.gateways}


def test_cluster_ip_protocols_ports_and_target_port_names(lab: ScenarioLab) -> None:
    cips = ("10.96.1.1", "fd00:96::1:1")
    ports = [
        m.port("http", 80, "web"),
        m.port("dns", 80, 8081, "UDP"),
        m.port("alt", 81, 8082),
        m.port("sctp", 80, 8080, "SCTP"),
    ]
    slice_ports = [m.slice_port("http", 8080), m.slice_port("dns", 8081, "UDP"),
                   m.slice_port("alt", 8082), m.slice_port("sctp", 8080, "SCTP")]
    pods = ("pod-a", "pod-b", "pod-c", "pod-d")
    docs = [m.service("multi", cips, ports)] + [
        m.endpoint_slice("multi", eps(lab, *pods, family=f), slice_ports, f) for f in (4, 6)]
    lab.apply("multi.yaml", docs)
    client = lab.spec.pod("client")
    tcp = lab.eventually(lambda: reach(lab, "client", "tcp", cips[0], 80, set(pods)))
    assert tcp.ports == {8080} and tcp.sources == {client.ipv4}
    udp = reach(lab, "client", "udp", cips[0], 80, set(pods))
    assert udp.ports == {8081} and udp.sources == {client.ipv4}
    assert reach(lab, "client", "tcp", cips[0], 81, set(pods)).ports == {8082}
    tcp6 = lab.eventually(  # the IPv6 rules are a transaction of their own
        lambda: reach(lab, "client", "tcp", cips[1], 80, set(pods)))
    assert tcp6.ports == {8080} and tcp6.sources == {client.ipv6}
    assert reach(lab, "client", "udp", cips[1], 80, set(pods)).ports == {8081}

    docs[1] = m.endpoint_slice("multi", eps(lab, "pod-b", "pod-d"), slice_ports, 4)
    lab.apply("multi.yaml", docs)
    lab.eventually(lambda: reach(lab, "client", "tcp", cips[0], 80, {"pod-b", "pod-d"}))
    reach(lab, "client", "udp", cips[0], 80, {"pod-b", "pod-d"})  # the same sync as TCP's
    reach(lab, "client", "tcp", cips[1], 80, set(pods))

    lab.delete("multi.yaml")
    lab.eventually(lambda: fails(lab, "client", "tcp", cips[0], 80, "timeout"))


def test_node_port_on_selected_addresses(lab: ScenarioLab) -> None:
    docs = web_service(lab, "np", ("10.96.2.1", "fd00:96::2:1"), ("pod-a", "pod-c"),
                       type="NodePort", ports=[m.port("http", 80, 8080, node_port=30080)])
    lab.apply("np.yaml", docs)
    node = lab.spec.node("node1")
    seen = lab.eventually(
        lambda: reach(lab, "ext-ok", "tcp", node.ipv4, 30080, {"pod-a", "pod-c"}))
    assert seen.sources <= node_addresses(lab), "external NodePort traffic is masqueraded"
    # Each family is its own transaction (iptables, then ip6tables): wait for both.
    seen6 = lab.eventually(
        lambda: reach(lab, "ext-ok", "tcp", node.ipv6, 30080, {"pod-a", "pod-c"}))
    assert seen6.sources <= node_addresses(lab)
    reach(lab, "node1", "tcp", node.ipv4, 30080, {"pod-a", "pod-c"})
    # The pod bridge address is not in --node-port-addresses: nothing listens there.
    fails(lab, "client", "tcp", node.gateways[0], 30080, "refused")


def test_load_balancer_source_ranges(lab: ScenarioLab) -> None:
    status = {"loadBalancer": {"ingress": [
        {"ip": "192.168.60.10"}, {"ip": "192.168.60.11", "ipMode": "Proxy"}]}}
    docs = web_service(lab, "lb", ("10.96.3.1",), ("pod-a", "pod-c"), type="LoadBalancer",
                       ports=[m.port("http", 80, 8080, node_port=30081)],
                       loadBalancerSourceRanges=["192.168.50.100/32"], status=status)
    lab.apply("lb.yaml", docs)
    lab.eventually(lambda: reach(lab, "ext-ok", "tcp", "192.168.60.10", 80, {"pod-a", "pod-c"}))
    fails(lab, "ext-no", "tcp", "192.168.60.10", 80, "timeout")
    proxied = lab.probe("ext-ok", "tcp", "192.168.60.11", 80, 1, timeout=0.5)
    assert not proxied.names, "ipMode Proxy addresses are left to the load balancer"

    docs[0]["spec"]["loadBalancerSourceRanges"] = ["192.168.50.200/32"]
    lab.apply("lb.yaml", docs)
    lab.eventually(lambda: reach(lab, "ext-no", "tcp", "192.168.60.10", 80, {"pod-a", "pod-c"}))
    fails(lab, "ext-ok", "tcp", "192.168.60.10", 80, "timeout")


def test_external_ips(lab: ScenarioLab) -> None:
    docs = web_service(lab, "extip", ("10.96.4.1", "fd00:96::4:1"), ("pod-a", "pod-c"),
                       externalIPs=["192.168.60.20", "fd00:60::20"])
    lab.apply("extip.yaml", docs)
    seen = lab.eventually(
        lambda: reach(lab, "ext-ok", "tcp", "192.168.60.20", 80, {"pod-a", "pod-c"}))
    assert seen.sources <= node_addresses(lab)
    seen6 = lab.eventually(  # the IPv6 rules are a transaction of their own
        lambda: reach(lab, "ext-ok", "tcp", "fd00:60::20", 80, {"pod-a", "pod-c"}))
    assert seen6.sources <= node_addresses(lab)


def test_session_affinity_client_ip_until_timeout(lab: ScenarioLab) -> None:
    pods = {"pod-a", "pod-b", "pod-c", "pod-d"}
    docs = web_service(lab, "sticky", ("10.96.5.1",), tuple(sorted(pods)),
                       sessionAffinity="ClientIP",
                       sessionAffinityConfig={"clientIP": {"timeoutSeconds": 2}})
    lab.apply("sticky.yaml", docs)

    def one_pod() -> str:
        seen = lab.probe("client", "tcp", "10.96.5.1", 80, 20)
        assert not seen.errors and len(seen.answered) == 1, dict(seen.names)
        return next(iter(seen.answered))

    chosen = {lab.eventually(one_pod)}
    deadline = time.monotonic() + 30
    while len(chosen) < 2 and time.monotonic() < deadline:
        time.sleep(2.5)
        chosen.add(one_pod())
    assert len(chosen) >= 2, "after the affinity timeout a new endpoint gets chosen"


def test_external_traffic_policy_local(lab: ScenarioLab) -> None:
    status = {"loadBalancer": {"ingress": [{"ip": "192.168.60.30"}]}}
    docs = web_service(lab, "etp", ("10.96.6.1",), ("pod-a", "pod-c"), type="LoadBalancer",
                       ports=[m.port("http", 80, 8080, node_port=30082)],
                       externalTrafficPolicy="Local", healthCheckNodePort=32082, status=status)
    lab.apply("etp.yaml", docs)
    outside = lab.spec.clients[0].ipv4
    seen = lab.eventually(lambda: reach(lab, "ext-ok", "tcp", "192.168.60.30", 80, {"pod-a"}))
    assert seen.sources == {outside}, "client source IP preserved"
    node = lab.spec.node("node1")
    assert reach(lab, "ext-ok", "tcp", node.ipv4, 30082, {"pod-a"}).sources == {outside}
    # Pods reaching the LB IP are short-circuited to every endpoint.
    inside = reach(lab, "client", "tcp", "192.168.60.30", 80, {"pod-a", "pod-c"})
    assert inside.sources == {lab.spec.pod("client").ipv4}
    reach(lab, "node1", "tcp", "192.168.60.30", 80, {"pod-a", "pod-c"})  # the node itself too

    docs[1] = m.endpoint_slice("etp", eps(lab, "pod-c"), [m.slice_port("http", 8080)], 4)
    lab.apply("etp.yaml", docs)
    lab.eventually(lambda: fails(lab, "ext-ok", "tcp", "192.168.60.30", 80, "timeout"))
    fails(lab, "ext-ok", "tcp", node.ipv4, 30082, "timeout")
    reach(lab, "client", "tcp", "192.168.60.30", 80, {"pod-c"})


def test_external_policy_local_short_circuit_uses_cluster_endpoints(lab: ScenarioLab) -> None:
    """eTP and iTP Local, endpoints only on node2: traffic from outside to node1's external
    addresses is dropped, but pods and node1 itself reaching the LB IP or the external IP are
    short-circuited to the cluster-wide endpoints (not the empty local set), as kube-proxy
    does in every mode. With a local endpoint, outside traffic uses it alone and the
    short-circuit still reaches every endpoint."""
    status = {"loadBalancer": {"ingress": [{"ip": "192.168.60.50"}]}}
    docs = web_service(lab, "etpsc", ("10.96.14.1",), ("pod-c", "pod-d"), type="LoadBalancer",
                       ports=[m.port("http", 80, 8080, node_port=30084)],
                       externalTrafficPolicy="Local", internalTrafficPolicy="Local",
                       healthCheckNodePort=32084, externalIPs=["192.168.60.51"],
                       status=status)
    lab.apply("etpsc.yaml", docs)
    remote = {"pod-c", "pod-d"}
    lab.eventually(lambda: reach(lab, "node1", "tcp", "192.168.60.50", 80, remote))
    reach(lab, "node1", "tcp", "192.168.60.51", 80, remote)
    reach(lab, "client", "tcp", "192.168.60.50", 80, remote)
    reach(lab, "client", "tcp", "192.168.60.51", 80, remote)
    if handles_outside(lab):
        fails(lab, "ext-ok", "tcp", "192.168.60.50", 80, "timeout")
        fails(lab, "ext-ok", "tcp", "192.168.60.51", 80, "timeout")

    docs[1] = m.endpoint_slice("etpsc", eps(lab, "pod-a", "pod-c", "pod-d"),
                               [m.slice_port("http", 8080)], 4)
    lab.apply("etpsc.yaml", docs)
    every = {"pod-a", "pod-c", "pod-d"}
    lab.eventually(lambda: reach(lab, "client", "tcp", "192.168.60.50", 80, every))
    reach(lab, "node1", "tcp", "192.168.60.51", 80, every)
    reach(lab, "client", "tcp", "10.96.14.1", 80, {"pod-a"})
    if handles_outside(lab):
        reach(lab, "ext-ok", "tcp", "192.168.60.50", 80, {"pod-a"})


def test_external_policy_local_without_endpoints_is_rejected(lab: ScenarioLab) -> None:
    """eTP Local and no endpoint anywhere: every address of the service refuses at once
    (no endpoints is a reject, not the drop of 'no local endpoint')."""
    status = {"loadBalancer": {"ingress": [{"ip": "192.168.60.52"}]}}
    svc = m.service("etpnone", ("10.96.15.1",), [m.port("http", 80, 8080, node_port=30085)],
                    type="LoadBalancer", externalTrafficPolicy="Local",
                    healthCheckNodePort=32085, externalIPs=["192.168.60.53"], status=status)
    lab.apply("etpnone.yaml", [svc])
    lab.eventually(lambda: fails(lab, "client", "tcp", "10.96.15.1", 80, "refused"))
    fails(lab, "client", "tcp", "192.168.60.52", 80, "refused")
    fails(lab, "client", "tcp", "192.168.60.53", 80, "refused")
    fails(lab, "node1", "tcp", "10.96.15.1", 80, "refused")
    if handles_outside(lab):
        node = lab.spec.node("node1")
        fails(lab, "ext-ok", "tcp", "192.168.60.52", 80, "refused")
        fails(lab, "ext-ok", "tcp", "192.168.60.53", 80, "refused")
        fails(lab, "ext-ok", "tcp", node.ipv4, 30085, "refused")


# kube-proxy's iptables mode serves NodePorts on 127.0.0.1 when --nodeport-addresses holds
# it (route_localnet); its nftables and IPVS modes never do (no virtual server there).
LOOPBACK_NODE_PORTS = {"iptables"}


def test_node_ports_on_loopback_only_where_kube_proxy_serves_them(lab: ScenarioLab) -> None:
    docs = web_service(lab, "nplo", ("10.96.16.1",), ("pod-c",), type="NodePort",
                       ports=[m.port("http", 80, 8080, node_port=30088)])
    lab.apply("nplo.yaml", docs)
    node = lab.spec.node("node1")
    lab.eventually(lambda: reach(lab, "node1", "tcp", node.ipv4, 30088, {"pod-c"}, 3))
    lab.start_backend("--node-port-addresses", f"127.0.0.0/8,{LAN4}.0/24,{LAN6}:/64")
    try:
        lab.eventually(lambda: reach(lab, "node1", "tcp", node.ipv4, 30088, {"pod-c"}, 3))
        if lab.backend.name in LOOPBACK_NODE_PORTS:
            lab.eventually(lambda: reach(lab, "node1", "tcp", "127.0.0.1", 30088, {"pod-c"}, 3))
        else:
            fails(lab, "node1", "tcp", "127.0.0.1", 30088, "refused")
    finally:
        lab.start_backend()


def test_internal_traffic_policy_local(lab: ScenarioLab) -> None:
    docs = web_service(lab, "itp", ("10.96.7.1",), ("pod-a", "pod-b", "pod-c", "pod-d"),
                       internalTrafficPolicy="Local")
    lab.apply("itp.yaml", docs)
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.7.1", 80, {"pod-a", "pod-b"}))
    docs[1] = m.endpoint_slice("itp", eps(lab, "pod-c", "pod-d"), [m.slice_port("http", 8080)])
    lab.apply("itp.yaml", docs)
    # No local endpoint: the node forwards nothing. The iptables and nftables modes drop,
    # as kube-proxy's do; in IPVS the virtual server without a real server answers ICMP
    # port unreachable, as in kube-proxy's IPVS mode.
    blocked = "refused" if lab.backend.name == "ipvs" else "timeout"
    lab.eventually(lambda: fails(lab, "client", "tcp", "10.96.7.1", 80, blocked))
    assert lab.probe("client", "tcp", "10.96.7.1", 80, 5).errors == {blocked: 5}


def test_terminating_endpoints_fallback(lab: ScenarioLab) -> None:
    ports = [m.slice_port("http", 8080)]
    terminating = eps(lab, "pod-a", "pod-c", ready=False, serving=True, terminating=True)
    docs = [m.service("term", ("10.96.8.1",), [m.port("http", 80, 8080)]),
            m.endpoint_slice("term", terminating, ports)]
    lab.apply("term.yaml", docs)
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.8.1", 80, {"pod-a", "pod-c"}))
    docs[1] = m.endpoint_slice("term", terminating + eps(lab, "pod-b"), ports)
    lab.apply("term.yaml", docs)
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.8.1", 80, {"pod-b"}))


def test_topology_hints(lab: ScenarioLab) -> None:
    spec = lab.spec
    endpoints = [
        m.endpoint(spec.pod("pod-a"), zone="zone-a", hint_zones=["zone-a"]),
        m.endpoint(spec.pod("pod-b"), zone="zone-a", hint_zones=["zone-a"]),
        m.endpoint(spec.pod("pod-c"), zone="zone-b", hint_zones=["zone-b"]),
        m.endpoint(spec.pod("pod-d"), zone="zone-b", hint_zones=["zone-b"]),
    ]
    docs = [m.service("topo", ("10.96.11.1",), [m.port("http", 80, 8080)],
                      trafficDistribution="PreferClose"),
            m.endpoint_slice("topo", endpoints, [m.slice_port("http", 8080)])]
    lab.apply("topo.yaml", docs)
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.11.1", 80, {"pod-a", "pod-b"}))


def test_no_endpoints_reject_and_unallocated_drop(lab: ScenarioLab) -> None:
    svc = m.service("empty", ("10.96.9.1",), [m.port("http", 80, 8080, node_port=30083)],
                    type="NodePort", externalIPs=["192.168.60.40"])
    lab.apply("empty.yaml", [svc])
    node = lab.spec.node("node1")
    lab.eventually(lambda: fails(lab, "client", "tcp", "10.96.9.1", 80, "refused"))
    retries = lab.probe("client", "tcp", "10.96.9.1", 80, 10)
    assert retries.errors == {"refused": 10}, f"every retry is refused: {retries.errors}"
    fails(lab, "node1", "tcp", "10.96.9.1", 80, "refused")
    fails(lab, "client", "udp", "10.96.9.1", 80, "refused")  # a port the service lacks
    fails(lab, "ext-ok", "tcp", node.ipv4, 30083, "refused")
    fails(lab, "ext-ok", "tcp", "192.168.60.40", 80, "refused")
    fails(lab, "client", "tcp", "10.96.200.200", 80, "timeout")

    lab.apply("empty.yaml", [svc, m.endpoint_slice("empty", eps(lab, "pod-d"),
                                                   [m.slice_port("http", 8080)])])
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.9.1", 80, {"pod-d"}))
    reach(lab, "ext-ok", "tcp", node.ipv4, 30083, {"pod-d"})
    fails(lab, "client", "tcp", "10.96.9.1", 81, "refused")


def test_masquerade_and_hairpin(lab: ScenarioLab) -> None:
    """kube-proxy masquerades a pod reaching itself through its service and an off-cluster
    source, not a pod of the cluster. A socket-level backend balances node1's and its pods'
    connections at connect() with no NAT (Cilium's socket LB): the hairpin reaches the pod
    from its own address; connections from outside are its packet path's, masqueraded."""
    lab.apply("hair.yaml", web_service(lab, "hair", ("10.96.10.1", "fd00:96::10:1"),
                                       ("pod-a",)))
    pod_a = lab.spec.pod("pod-a")
    seen = lab.eventually(lambda: reach(lab, "pod-a", "tcp", "10.96.10.1", 80, {"pod-a"}, 5))
    seen6 = lab.eventually(  # the IPv6 rules are a transaction of their own
        lambda: reach(lab, "pod-a", "tcp", "fd00:96::10:1", 80, {"pod-a"}, 5))
    if lab.backend.socket_level:
        assert seen.sources == {pod_a.ipv4}, "a hairpin balanced at connect() is not NATed"
        assert seen6.sources == {pod_a.ipv6}, "a hairpin balanced at connect() is not NATed"
    else:
        assert seen.sources and pod_a.ipv4 not in seen.sources, "hairpin traffic is masqueraded"
        assert pod_a.ipv6 not in seen6.sources
    client = lab.spec.pod("client")
    assert reach(lab, "client", "tcp", "10.96.10.1", 80, {"pod-a"}, 5).sources == {client.ipv4}
    if handles_outside(lab):
        outside = reach(lab, "ext-ok", "tcp", "10.96.10.1", 80, {"pod-a"}, 5)
        assert outside.sources <= node_addresses(lab), "off-cluster sources are masqueraded"
    reach(lab, "node1", "tcp", "10.96.10.1", 80, {"pod-a"}, 5)


def test_masquerade_all_flag(lab: ScenarioLab) -> None:
    """With --masquerade-all a pod's ClusterIP traffic is masqueraded too. On a socket-level
    backend that is the traffic its packet path takes (a process of the pod outside
    --ebpf-cgroup), shown to a local and a remote endpoint, which it DNATs only without
    the flag (kube-proxy does not masquerade local traffic); a
    connection balanced at connect() is never NATed, so the pod keeps its own address
    (Cilium's socket LB)."""
    lab.apply("masqall.yaml", web_service(lab, "masqall", ("10.96.12.1",), ("pod-c",)))
    client = lab.spec.pod("client")
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.12.1", 80, {"pod-c"}, 3))
    if lab.backend.socket_level:
        lab.apply("masqlocal.yaml", web_service(lab, "masqlocal", ("10.96.12.2",), ("pod-a",)))
        kept = lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.12.2", 80, {"pod-a"},
                                            3, sockets=False))
        assert kept.sources == {client.ipv4}, "a pod of the cluster is not masqueraded"
        remote = reach(lab, "client", "tcp", "10.96.12.1", 80, {"pod-c"}, 3, sockets=False)
        assert remote.sources == {client.ipv4}, "a pod of the cluster is not masqueraded"
    lab.start_backend("--masquerade-all")

    def masqueraded(cip: str, pod: str) -> None:
        seen = reach(lab, "client", "tcp", cip, 80, {pod}, 3, sockets=False)
        assert client.ipv4 not in seen.sources, dict(seen.names)

    lab.eventually(lambda: masqueraded("10.96.12.1", "pod-c"))
    if lab.backend.socket_level:
        lab.eventually(lambda: masqueraded("10.96.12.2", "pod-a"))
        for cip, pod in (("10.96.12.1", "pod-c"), ("10.96.12.2", "pod-a")):
            seen = reach(lab, "client", "tcp", cip, 80, {pod}, 3)
            assert seen.sources == {client.ipv4}, "a connection balanced at connect() is not NATed"


def test_local_mode_follows_the_apiserver_and_a_difference_is_caught(lab: ScenarioLab
                                                                    ) -> None:
    """Local mode programs what the apiserver holds (not the frontend's files), and the
    comparison every local scenario ends with fails when the states differ."""
    if lab.backend.local is False or lab.apiserver is None:
        pytest.skip("compares local mode with split mode")
    docs = web_service(lab, "onlylocal", ("10.96.17.1",), ("pod-b",))
    lab.apiserver.apply("onlylocal.yaml", docs)  # not in the frontend's manifests
    try:
        lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.17.1", 80, {"pod-b"}, 3))
        with pytest.raises(AssertionError, match="only in the second: lab/onlylocal:http"):
            lab.assert_same_state(timeout=2)
    finally:
        lab.apiserver.delete("onlylocal.yaml")
    lab.eventually(lambda: fails(lab, "client", "tcp", "10.96.17.1", 80, "timeout"))


def test_cleanup_removes_everything_the_backend_made_and_nothing_else(lab: ScenarioLab
                                                                     ) -> None:
    """After ``--cleanup`` node1's namespace holds what it held before the backend first
    started (tables, chains, rules, sets, nfacct objects, ipsets, links, virtual
    servers; see tests/support/netns/leftovers.py), plus a table someone else made meanwhile; a
    socket-level backend leaves no pin and no program on its cgroup."""
    lab.apply("gone.yaml", web_service(lab, "gone", ("10.96.13.1",), ("pod-c",)))
    lab.eventually(lambda: reach(lab, "client", "tcp", "10.96.13.1", 80, {"pod-c"}, 3))
    node_ns = lab.lab.ns("node1")
    has_nft = shutil.which("nft") is not None
    if has_nft:
        subprocess.run(["ip", "netns", "exec", node_ns, "nft", "add table inet keepme"],
                       check=True)
    done = lab.run_backend_cleanup()
    assert done.returncode == 0, done.stderr.decode()
    seen = lab.probe("client", "tcp", "10.96.13.1", 80, 1, timeout=0.5)
    assert not seen.names, "service rules are gone after --cleanup"
    after = leftovers.snapshot(node_ns)
    foreign = {("nft table", "inet", "keepme")} if has_nft else set()
    assert foreign <= after, "--cleanup left other tables alone"
    assert sorted(after - foreign - lab.before_backend) == [], "left by --cleanup"
    assert sorted(lab.before_backend - after) == [], "removed by --cleanup, not the backend's"
    if lab.sockets is not None:
        assert lab.sockets.leftovers() == []

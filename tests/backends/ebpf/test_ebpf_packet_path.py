"""``--ebpf-packet-path bpf`` with real packets: the tc programs on node1's eth0 in the
test lab (two nodes, pods on both, an external client on their LAN) serve NodePorts to
an endpoint on node1 (DNAT) and on node2 (DNAT + SNAT, redirected out), with no
nftables or iptables rule in the node's namespace.

The lab's namespaces, the bpffs mount, the pins and the tcx links (on node1's eth0, a
device of a namespace made here) are removed at the end, also when a test fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf import libbpf, maglev
from svcproxy.backends.ebpf.names import TC_MAP_CT
from svcproxy.backends.ebpf.packet_backend import PacketBackend
from svcproxy.backends.ebpf.packet_layout import endpoint_name, pack_endpoint
from svcproxy.backends.ebpf.packet_loader import PacketLayout
from svcproxy.model import (
    Protocol,
    ServicePortKey,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
)
from svcproxy.sdk import Changes, NodeConfig, NodeState, resolve_context
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, ns_exec
from tests.support.packet_path import CLIENT, NODE1, PODS, SPEC, World, node_port
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip", "nft")

NODE2 = SPEC.node("node2")
TABLE = 16381


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    # The LAN device and the pods' bridge (what pods on node1 reach the node by);
    # test_ebpf_packet_path_process leaves the default (the node IP's device) instead.
    yield from running(World("sptc-", maglev_size=TABLE))


def test_node_port_to_an_endpoint_on_this_node(world: World) -> None:
    world.set(node_port("local", 30080, ["pod-a"]))
    world.set(node_port("local-udp", 30080, ["pod-a"], proto="UDP"))
    for got in (world.tcp(30080), world.udp(30080)):
        assert got.names == Counter({"pod-a": 12}), got
        # Masqueraded as kube-proxy does with externalTrafficPolicy Cluster: to the
        # address of the pods' bridge, which carries the programs too; the reply reached
        # a socket connected to the NodePort, so it came back from the service address.
        assert got.sources == {NODE1.gateways[0]}


def test_node_port_to_an_endpoint_on_another_node(world: World) -> None:
    world.set(node_port("remote", 30081, ["pod-c"]))
    world.set(node_port("remote-udp", 30081, ["pod-c"], proto="UDP"))
    for got in (world.tcp(30081), world.udp(30081)):
        assert got.names == Counter({"pod-c": 12}), got
        # SNATed to node1's address on the device the route to node2 leaves by.
        assert got.sources == {NODE1.ipv4}


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_ipv6_node_port_to_endpoints_on_both_nodes(world: World, proto: str) -> None:
    world.set(node_port(f"v6-local-{proto}", 30090, ["pod-a"], proto=proto.upper(), family=6))
    world.set(node_port(f"v6-remote-{proto}", 30091, ["pod-c"], proto=proto.upper(),
                        family=6))
    client = world.lab.ns(CLIENT.name)
    local = summarize(probe(client, proto, NODE1.ipv6, 30090, 12))
    assert local.names == Counter({"pod-a": 12}), local
    assert local.sources == {NODE1.gateways[1]}, local
    remote = summarize(probe(client, proto, NODE1.ipv6, 30091, 12))
    assert remote.names == Counter({"pod-c": 12}) and remote.sources == {NODE1.ipv6}, remote


def test_pods_of_this_node_reach_node_ports_and_hairpin(world: World) -> None:
    """Pods outside --ebpf-cgroup reach a NodePort through the pods' bridge (br0): to a
    local endpoint, a remote one and themselves (hairpin), SNATed as kube-proxy
    masquerades NodePort traffic (to the address of the device toward the endpoint)."""
    world.set(node_port("pods-local", 30098, ["pod-b"]))
    world.set(node_port("pods-remote", 30099, ["pod-c"]))
    world.set(node_port("pods-self", 30100, ["pod-a"]))
    pod = world.lab.ns("client")
    local = summarize(probe(pod, "tcp", NODE1.ipv4, 30098, 5))
    assert local.names == Counter({"pod-b": 5}) and local.sources == {NODE1.gateways[0]}
    remote = summarize(probe(pod, "tcp", NODE1.ipv4, 30099, 5))
    assert remote.names == Counter({"pod-c": 5}) and remote.sources == {NODE1.ipv4}
    hairpin = summarize(probe(world.lab.ns("pod-a"), "tcp", NODE1.ipv4, 30100, 5))
    assert hairpin.names == Counter({"pod-a": 5}), hairpin
    assert hairpin.sources == {NODE1.gateways[0]}, hairpin


def test_a_pod_reaches_itself_through_its_load_balancer_vip(world: World) -> None:
    """Hairpin through a VIP (and an externalIP), as through a NodePort: pod-a, outside
    the cgroup, reaches the load-balancer address whose only endpoint it is, SNATed to
    the pods' bridge so that its answer comes back through the node."""
    from svcproxy.model import LoadBalancerIngress

    world.set(node_port("hairpin-lb", 30101, ["pod-a"], type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("192.168.60.21"),),
                        external_ips=("192.168.60.22",)))
    for vip in ("192.168.60.21", "192.168.60.22"):
        got = summarize(probe(world.lab.ns("pod-a"), "tcp", vip, 80, 5))
        assert got.names == Counter({"pod-a": 5}), (vip, got)
        assert got.sources == {NODE1.gateways[0]}, (vip, got)


def test_cluster_ip_routed_to_the_node_from_outside(world: World) -> None:
    """The LAN routes the service CIDR to node1: its ClusterIPs use the endpoints the
    frontend marked internal (here pod-c and pod-a, not pod-d), pods outside the cgroup
    too (through br0)."""
    world.set(node_port("cip", 0, ["pod-a", "pod-c", "pod-d"], internal=["pod-a", "pod-c"],
                        external=["pod-d"], cip="10.96.7.1", type=ServiceType.CLUSTER_IP))
    lan = summarize(probe(world.lab.ns(CLIENT.name), "tcp", "10.96.7.1", 80, 30))
    assert lan.answered == {"pod-a", "pod-c"} and not lan.errors, lan
    pod = summarize(probe(world.lab.ns("client"), "tcp", "10.96.7.1", 80, 20))
    assert pod.answered == {"pod-a", "pod-c"} and not pod.errors, pod
    # A port or protocol the ClusterIP's services lack is refused, as kube-proxy does.
    for proto, port in (("tcp", 81), ("udp", 80)):
        lacking = summarize(probe(world.lab.ns(CLIENT.name), proto, "10.96.7.1", port, 2))
        assert lacking.errors == Counter({"refused": 2}), (proto, port, lacking)


def test_masquerade_all_snats_cluster_ip_traffic_from_outside(world: World) -> None:
    """--masquerade-all, as the node context holds it: ClusterIP traffic routed to the
    node from the LAN reaches a local endpoint from the address of the device toward it
    (the pods' bridge), as kube-proxy masquerades it; without it the client's own."""
    world.set(node_port("masq-all", 0, ["pod-a"], cip="10.96.7.2", type=ServiceType.CLUSTER_IP))
    kept = summarize(probe(world.lab.ns(CLIENT.name), "tcp", "10.96.7.2", 80, 5))
    assert kept.names == Counter({"pod-a": 5}) and kept.sources == {CLIENT.ipv4}, kept
    _forget_flows(world)
    config = NodeConfig(node_name="node1", node_ips=(NODE1.ipv4, NODE1.ipv6),
                        masquerade_all=True)
    world.sync(Changes(frozenset(world.services), full=True),
               context=resolve_context(config, None))
    try:
        got = summarize(probe(world.lab.ns(CLIENT.name), "tcp", "10.96.7.2", 80, 5))
        assert got.names == Counter({"pod-a": 5}) and got.sources == {NODE1.gateways[0]}, got
    finally:
        _forget_flows(world)
        world.sync(Changes(frozenset(world.services), full=True))


def test_endpoints_on_both_nodes_and_a_change(world: World) -> None:
    world.set(node_port("both", 30082, ["pod-a", "pod-b", "pod-c", "pod-d"]))
    got = world.tcp(30082, count=60)
    assert got.answered == {"pod-a", "pod-b", "pod-c", "pod-d"}, got
    assert not got.errors
    world.set(node_port("both", 30082, ["pod-d"]))
    assert world.tcp(30082).names == Counter({"pod-d": 12})
    world.delete(ServicePortKey("default", "both", "p", Protocol.TCP))
    assert world.tcp(30082, count=2).errors == Counter({"refused": 2}), \
        "without the service, the node's own stack answers (no listener)"


def test_no_nftables_or_iptables_rule_in_the_node(world: World) -> None:
    world.set(node_port("rules", 30083, ["pod-a", "pod-c"]))
    node = world.lab.ns("node1")
    assert ns_exec(node, "nft", "list", "ruleset").strip() == ""
    if shutil.which("iptables-save"):
        rules = [line for line in ns_exec(node, "iptables-save").splitlines()
                 if line.startswith("-A")]
        assert rules == []


def test_external_traffic_policy_local(world: World) -> None:
    # The frontend marks only the local endpoints external: those serve, unSNATed.
    world.set(node_port("etp", 30086, ["pod-a", "pod-c"], external=["pod-a"],
                        external_traffic_policy=TrafficPolicy.LOCAL))
    got = world.tcp(30086, count=20)
    assert got.names == Counter({"pod-a": 20}) and got.sources == {CLIENT.ipv4}, got
    # Endpoints exist, none on this node: dropped (kube-proxy's rule), not refused.
    world.set(node_port("etp-none", 30087, ["pod-c"], external=[],
                        external_traffic_policy=TrafficPolicy.LOCAL))
    assert world.tcp(30087, count=2).errors == Counter({"timeout": 2})


def test_external_ips_and_load_balancer_vips(world: World) -> None:
    from svcproxy.model import LoadBalancerIngress

    world.set(node_port("ext", 0, ["pod-c"], type=ServiceType.CLUSTER_IP,
                        external_ips=("192.168.60.10",)))
    world.set(node_port("lb", 30088, ["pod-a"], type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("192.168.60.11"),)))
    client = world.lab.ns(CLIENT.name)
    remote = summarize(probe(client, "tcp", "192.168.60.10", 80, 10))
    assert remote.names == Counter({"pod-c": 10}) and remote.sources == {NODE1.ipv4}, remote
    local = summarize(probe(client, "udp", "192.168.60.11", 80, 10))
    assert local.names == Counter(), "a TCP service leaves UDP alone"
    local = summarize(probe(client, "tcp", "192.168.60.11", 80, 10))
    assert local.names == Counter({"pod-a": 10}) and local.sources == {NODE1.gateways[0]}, \
        local
    # loadBalancerSourceRanges: the allowed client gets through, another is dropped.
    other = SPEC.clients[1]
    for ranges in ((f"{CLIENT.ipv4}/32",), ("192.168.50.96/28", "10.0.0.0/8")):
        world.set(node_port("lb", 30088, ["pod-a"], type=ServiceType.LOAD_BALANCER,
                            load_balancer_ingress=(LoadBalancerIngress("192.168.60.11"),),
                            load_balancer_source_ranges=ranges))
        allowed = summarize(probe(client, "tcp", "192.168.60.11", 80, 5))
        assert allowed.names == Counter({"pod-a": 5}), (ranges, allowed)
        denied = summarize(probe(world.lab.ns(other.name), "tcp", "192.168.60.11", 80, 2))
        assert denied.errors == Counter({"timeout": 2}), (ranges, denied)
    world.set(node_port("lb", 30088, ["pod-a"], type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("192.168.60.11"),)))
    assert summarize(probe(world.lab.ns(other.name), "tcp", "192.168.60.11", 80, 2)).names \
        == Counter({"pod-a": 2}), "without ranges every client gets through"
    assert world.backend is not None and world.backend.programs is not None
    assert libbpf.list_keys(world.backend.programs.maps["spp_ranges"]) == [], \
        "the ranges are gone"
    # ipMode Proxy: the load balancer proxies, the node must not take the VIP.
    world.set(node_port("lb", 30088, ["pod-a"], type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("192.168.60.11",
                                                                   "Proxy"),)))
    assert not summarize(probe(client, "tcp", "192.168.60.11", 80, 2)).names


def test_ipv6_external_ips_vips_source_ranges_and_local_policy(world: World) -> None:
    """The external rows over IPv6: an externalIP to node2's pod (SNATed to node1), a
    load-balancer VIP to node1's pod (masqueraded to the pods' bridge), its
    loadBalancerSourceRanges letting one client through and dropping the other, and
    externalTrafficPolicy Local keeping the client's address."""
    from svcproxy.model import LoadBalancerIngress

    world.set(node_port("ext6", 0, ["pod-c"], family=6, cip="fd00:96::7:20",
                        type=ServiceType.CLUSTER_IP, external_ips=("fd00:60::10",)))
    client, other = world.lab.ns(CLIENT.name), world.lab.ns(SPEC.clients[1].name)
    remote = summarize(probe(client, "tcp", "fd00:60::10", 80, 5))
    assert remote.names == Counter({"pod-c": 5}) and remote.sources == {NODE1.ipv6}, remote
    world.set(node_port("lb6", 30089, ["pod-a"], family=6, type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("fd00:60::11"),),
                        load_balancer_source_ranges=(f"{CLIENT.ipv6}/128",)))
    allowed = summarize(probe(client, "tcp", "fd00:60::11", 80, 5))
    assert allowed.names == Counter({"pod-a": 5}), allowed
    assert allowed.sources == {NODE1.gateways[1]}, allowed
    denied = summarize(probe(other, "tcp", "fd00:60::11", 80, 2))
    assert denied.errors == Counter({"timeout": 2}), denied
    world.set(node_port("etp6", 30092, ["pod-a", "pod-c"], family=6, external=["pod-a"],
                        external_traffic_policy=TrafficPolicy.LOCAL))
    kept = summarize(probe(client, "tcp", NODE1.ipv6, 30092, 10))
    assert kept.names == Counter({"pod-a": 10}) and kept.sources == {CLIENT.ipv6}, kept


@pytest.mark.parametrize("family", [4, 6])
def test_no_endpoints_is_refused(world: World, family: int) -> None:
    """kube-proxy's REJECT: the program answers ICMP port unreachable itself (an
    externalIP: without it, the address is no local one and nothing would refuse)."""
    vip = "192.168.60.12" if family == 4 else "fd00:60::12"
    client = world.lab.ns(CLIENT.name)
    for proto in ("TCP", "UDP"):
        world.set(node_port(f"empty-{family}-{proto}", 0, [], proto=proto, family=family,
                            type=ServiceType.CLUSTER_IP, external_ips=(vip,)))
        got = summarize(probe(client, proto.lower(), vip, 80, 5))
        assert got.errors == Counter({"refused": 5}), (proto, got)
    world.set(node_port(f"empty-{family}-TCP", 0, ["pod-c"], family=family,
                        type=ServiceType.CLUSTER_IP, external_ips=(vip,)))
    assert summarize(probe(client, "tcp", vip, 80, 5)).names == Counter({"pod-c": 5})


def test_session_affinity_client_ip(world: World) -> None:
    pods = ["pod-a", "pod-b", "pod-c", "pod-d"]
    sticky = {"session_affinity": SessionAffinity.CLIENT_IP, "session_affinity_timeout": 1}
    world.set(node_port("sticky", 30093, pods, **sticky))
    first = world.tcp(30093, count=20)
    assert len(first.names) == 1 and not first.errors, f"one client, one endpoint: {first}"
    chosen = next(iter(first.names))
    # The chosen endpoint goes away: the client moves, and sticks again.
    world.set(node_port("sticky", 30093, [p for p in pods if p != chosen], **sticky))
    moved = world.tcp(30093, count=10)
    assert len(moved.names) == 1 and chosen not in moved.names, moved
    # After the timeout without new flows a new choice is made: over rounds it differs.
    picks = set(moved.names)
    deadline = time.monotonic() + 20
    while len(picks) < 2 and time.monotonic() < deadline:
        time.sleep(1.2)
        picks |= set(world.tcp(30093, count=1).names)
    assert len(picks) >= 2, "after the affinity timeout another endpoint gets chosen"


def test_session_affinity_client_ip_over_ipv6(world: World) -> None:
    """ClientIP affinity over IPv6: 20 connections, one endpoint; that endpoint removed,
    the client moves to one other and sticks."""
    pods = ["pod-a", "pod-b", "pod-c", "pod-d"]
    sticky = {"session_affinity": SessionAffinity.CLIENT_IP, "session_affinity_timeout": 600}
    world.set(node_port("sticky6", 30110, pods, family=6, **sticky))
    client = world.lab.ns(CLIENT.name)
    first = summarize(probe(client, "tcp", NODE1.ipv6, 30110, 20))
    assert len(first.names) == 1 and not first.errors, f"one client, one endpoint: {first}"
    chosen = next(iter(first.names))
    world.set(node_port("sticky6", 30110, [p for p in pods if p != chosen], family=6,
                        **sticky))
    moved = summarize(probe(client, "tcp", NODE1.ipv6, 30110, 10))
    assert len(moved.names) == 1 and chosen not in moved.names and not moved.errors, moved


def _connected_udp(ns: str, host: str, port: int, sport: int) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.bind((CLIENT.ipv4, sport))
        s.connect((host, port))
        return s

    return call_in(ns, make)


def _ask(sock: socket.socket) -> str:
    sock.send(b"ping\n")
    return sock.recv(256).decode().split()[0]


@pytest.mark.parametrize("pods", [["pod-a", "pod-b"], ["pod-c", "pod-d"]],
                         ids=["local", "remote"])
def test_udp_flow_of_a_removed_endpoint_moves_at_once(world: World, pods: list[str]) -> None:
    """kube-proxy's stale-UDP rule: the flow's next datagram goes to a remaining one."""
    port = 30094 if pods[0] == "pod-a" else 30095
    world.set(node_port(f"stale-{port}", port, pods, proto="UDP"))
    sock = _connected_udp(world.lab.ns(CLIENT.name), NODE1.ipv4, port, 46000)
    try:
        first = _ask(sock)
        assert [_ask(sock) for _ in range(5)] == [first] * 5, "a flow keeps its endpoint"
        world.set(node_port(f"stale-{port}", port, [p for p in pods if p != first],
                            proto="UDP"))
        other = next(p for p in pods if p != first)
        assert [_ask(sock) for _ in range(3)] == [other] * 3
    finally:
        sock.close()


def _tcp_from(ns: str, host: str, port: int, sport: int) -> str:
    def once() -> str:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.settimeout(3)
            s.bind((CLIENT.ipv4, sport))
            s.connect((host, port))
            return s.recv(256).decode().split()[0]

    return call_in(ns, once)


def test_new_tcp_connection_on_a_tracked_tuple_leaves_a_removed_endpoint(world: World) -> None:
    """The same client port again after its endpoint left: a SYN starts a new flow (the
    closed flow's entry still tracked: it lives 10 s after both FINs)."""
    pods = ["pod-a", "pod-c"]
    world.set(node_port("reuse", 30097, pods))
    ns = world.lab.ns(CLIENT.name)
    first = _tcp_from(ns, NODE1.ipv4, 30097, 47000)
    world.set(node_port("reuse", 30097, [p for p in pods if p != first]))
    assert _tcp_from(ns, NODE1.ipv4, 30097, 47000) != first


def _udp_flows(ns: str, host: str, port: int, sports: range) -> dict[int, str]:
    def run() -> dict[int, str]:
        seen = {}
        for sport in sports:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.settimeout(2)
                s.bind((CLIENT.ipv4, sport))
                s.connect((host, port))
                s.send(b"ping\n")
                try:
                    seen[sport] = s.recv(256).decode().split()[0]
                except OSError as err:
                    seen[sport] = f"error {err}"
        return seen

    return call_in(ns, run)


def _predicted(pods: list[str], sports: range, port: int) -> dict[int, str]:
    """What the program must pick per source port: the Maglev table of the endpoints
    (built here, in the test's process) at the flow's hash."""
    by_slot = sorted((pack_endpoint(PODS[p].ipv4, 8080, PODS[p].node.name == "node1"), p)
                     for p in pods)
    table = maglev.build([endpoint_name(s) for s, _ in by_slot], TABLE)
    client = socket.inet_aton(CLIENT.ipv4) + bytes(12)
    node = socket.inet_aton(NODE1.ipv4) + bytes(12)
    return {sp: by_slot[table[maglev.flow_hash(client, node, sp, port, 17) % TABLE]][1]
            for sp in sports}


def _forget_flows(world: World) -> None:
    """Empty the connection tracking map, as a node that never saw these flows."""
    assert world.backend is not None and world.backend.programs is not None
    ct = world.backend.programs.maps[TC_MAP_CT]
    ct.delete_many([k for k, _ in ct.items()])
    assert len(ct) == 0


def test_maglev_picks_the_tables_endpoint_and_a_removal_moves_only_its_flows(
        world: World) -> None:
    pods = ["pod-a", "pod-b", "pod-c", "pod-d"]
    sports = range(21000, 22000)
    world.set(node_port("mag", 30084, pods, proto="UDP",
                        options=(("svcproxy.io/lb-algorithm", "maglev"),)))
    before = _udp_flows(world.lab.ns(CLIENT.name), NODE1.ipv4, 30084, sports)
    # Every node builds this table and hashes the flow the same way: the endpoint the
    # program chose is the one computed here, for each of 1,000 flows.
    assert before == _predicted(pods, sports, 30084)
    world.set(node_port("mag", 30084, pods[:3], proto="UDP",
                        options=(("svcproxy.io/lb-algorithm", "maglev"),)))
    _forget_flows(world)
    after = _udp_flows(world.lab.ns(CLIENT.name), NODE1.ipv4, 30084, sports)
    assert after == _predicted(pods[:3], sports, 30084)
    kept = [sp for sp in sports if before[sp] != "pod-d"]
    moved = sum(after[sp] != before[sp] for sp in kept)
    assert len(kept) > 600 and moved <= len(kept) * 0.03, (moved, len(kept))


def test_metrics_of_the_tc_maps(world: World) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    world.set(node_port("metrics", 30096, ["pod-c"]))
    assert world.tcp(30096, count=3).names == Counter({"pod-c": 3})
    registry = CollectorRegistry()
    assert world.backend is not None
    world.backend.register_metrics(registry)
    text = generate_latest(registry).decode()
    for hook in ("ingress", "egress"):
        assert f'svcproxy_ebpf_tc_attached{{device="eth0",hook="{hook}",mode="tcx"}} 1.0' \
            in text, text
    assert 'svcproxy_ebpf_tc_map_max_entries{map="spp_ct"} 262144.0' in text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith("svcproxy_ebpf_tc_map_entries")}
    assert values['svcproxy_ebpf_tc_map_entries{map="spp_ct"}'] >= 6, values  # 3 flows x 2
    assert values['svcproxy_ebpf_tc_map_entries{map="spp_services"}'] >= 1, values


def test_devices_that_appear_later_are_attached(world: World) -> None:
    """--ebpf-devices names eth1 before it exists: attached at the sync after it appears,
    and again when it is made anew (its old links went with it)."""
    from svcproxy.backends.ebpf.packet_loader import _tcx_info
    from tests.support.lab.netns import ip
    from tests.support.lab.topology import Namespaces

    spaces = Namespaces()
    ns = spaces.add_ns("hot")
    backend = PacketBackend(NodeConfig(node_name="hot"),
                            PacketLayout(world.bpffs / "hot", ("eth0", "eth1")))

    def sync() -> None:
        call_in(ns, backend.sync, NodeState("hot", 1, None, {}), Changes(frozenset()))

    def link_ifindex(device: str) -> int:
        fd = libbpf.obj_get(str(backend.layout.link_pin(device, "ingress")))
        try:
            return int(_tcx_info(fd).ifindex)
        finally:
            os.close(fd)

    try:
        ip(ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        call_in(ns, backend.start)
        assert backend.programs is not None
        assert set(backend.programs.attached) == {"eth0"}
        ip(ns, "link", "add", "eth1", "type", "veth", "peer", "name", "peer1")
        sync()
        first = backend.programs.attached["eth1"]
        assert link_ifindex("eth1") == first
        ip(ns, "link", "del", "eth1")
        ip(ns, "link", "add", "eth1", "type", "veth", "peer", "name", "peer1")
        sync()
        again = backend.programs.attached["eth1"]
        assert again != first and link_ifindex("eth1") == again
    finally:
        call_in(ns, backend.cleanup)
        spaces.destroy()
    assert not (world.bpffs / "hot").exists()


def test_cleanup_removes_the_programs_and_pins(world: World) -> None:
    world.set(node_port("last", 30085, ["pod-a"]))
    assert world.tcp(30085, count=2).names == Counter({"pod-a": 2})
    backend = world.backend
    assert backend is not None
    pins = backend.layout.dir
    links = []
    for pin in pins.glob("link_*"):
        fd = libbpf.obj_get(str(pin))
        try:
            from svcproxy.backends.ebpf.packet_loader import _tcx_info

            links.append(_tcx_info(fd).id)
        finally:
            os.close(fd)
    assert len(links) == 4, "ingress and egress on eth0 and br0"
    world.in_node(backend.cleanup)
    assert not backend.layout.pin_dir.exists()
    for link in links:
        shown = subprocess.run(["bpftool", "link", "show", "id", str(link)],
                               capture_output=True, text=True)
        assert shown.returncode != 0, shown.stdout
    assert world.tcp(30085, count=2).errors == Counter({"refused": 2})

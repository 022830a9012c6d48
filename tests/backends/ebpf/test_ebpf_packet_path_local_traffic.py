"""ClusterIP traffic from outside the cluster masqueraded by the tc programs as kube-proxy's
local-traffic detector (``--detect-local-mode``) says, with real packets in the two-node
lab: node1's programs on ``eth0``, ``br0`` (the pods' bridge: a masqueraded flow is SNATed
to its address, the device toward the endpoint) and ``spln*`` (``--ebpf-pod-devices``:
routed clients the tests make, each in a namespace of its own behind a veth on node1, as
Calico's pods are); local traffic to an endpoint on node2 is DNATed only. The echo
servers in pod-a (node1) and pod-c (node2) answer with the source they saw.

The lab's namespaces, the bpffs mount, the pins and the links are removed at the end,
also when a test fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import pytest

from svcproxy.backends.ebpf import xdp
from svcproxy.backends.ebpf.names import TC_MAP_CT, TC_MAP_XDP_STATS
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from svcproxy.model import NodeInfo, ServiceType
from svcproxy.sdk import Changes, NodeConfig, NodeContext, resolve_context
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in
from tests.support.lab.plan import CLUSTER_CIDRS
from tests.support.packet_path import CLIENT, NODE1, PODS, World, node_port
from tests.support.waiting import wait_for
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")

CIP4, CIP6 = "10.96.9.2", "fd00:96::92"
GATEWAY = "169.254.1.2"  # node1's address on each routed client's veth
OUTSIDE = "172.30.0.10"  # a routed client's address outside every CIDR of the cluster
IN_NODE, IN_CLUSTER = "10.244.1.210", "10.244.2.210"  # node1's pod CIDR; node2's
BRIDGE4, BRIDGE6 = NODE1.gateways  # node1's addresses on br0, toward pod-a
REMOTE4, REMOTE6 = "10.96.9.3", "fd00:96::93"  # ClusterIPs of pod-c, on node2
POD = PODS["client"]  # a pod of node1 whose process is outside the socket programs' cgroup


class LocalWorld(World):
    """The lab with node1's programs, pod-a behind the ClusterIPs CIP4 and CIP6, pod-c
    (node2) behind REMOTE4 and REMOTE6."""

    def start(self) -> Self:
        super().start()
        self.set(node_port("local-cip", 0, ["pod-a"], cip=CIP4, type=ServiceType.CLUSTER_IP))
        self.set(node_port("local-cip6", 0, ["pod-a"], family=6, cip=CIP6,
                           type=ServiceType.CLUSTER_IP))
        for proto in ("TCP", "UDP"):
            self.set(node_port(f"remote-cip-{proto}", 0, ["pod-c"], proto, cip=REMOTE4,
                               type=ServiceType.CLUSTER_IP))
        self.set(node_port("remote-cip6", 0, ["pod-c"], family=6, cip=REMOTE6,
                           type=ServiceType.CLUSTER_IP))
        return self


@pytest.fixture(scope="module", params=["tc", "xdp"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """``xdp``: XDP in generic mode on eth0 and br0 too (the LAN client's and pod-a's
    veths write whole checksums, as XDP needs)."""
    options = {"xdp": "generic", "whole_checksums": (CLIENT.name, POD.name, "pod-a", "pod-c")} \
        if request.param == "xdp" else {}
    yield from running(LocalWorld("splocal-", devices=("eth0", "br0"), servers=("pod-a", "pod-c"),
                                  pod_devices=("spln*",), **options))


def _context(**detector: Any) -> NodeContext:
    """node1's context with the --detect-local-mode settings ``detector``."""
    config = NodeConfig(node_name="node1", node_ips=(NODE1.ipv4, NODE1.ipv6), **detector)
    return resolve_context(config, NodeInfo("node1", pod_cidrs=NODE1.pod_cidrs))


def _detect(world: World, context: NodeContext | None) -> None:
    """A full sync with ``context`` (None: the flags alone, no detector), every flow
    forgotten, as a node that never saw the earlier ones."""
    world.sync(Changes(frozenset(world.services), full=True), context=context)
    assert world.backend is not None and world.backend.programs is not None
    ct = world.backend.programs.maps[TC_MAP_CT]
    world.in_node(lambda: ct.delete_many([k for k, _ in ct.items()]))


def _xdp_stats(world: World) -> Counter[str]:
    """What the XDP program did so far (nothing without it)."""
    assert world.backend is not None and world.backend.programs is not None
    if not world.options.get("xdp"):
        return Counter()
    return Counter(xdp.read_stats(world.backend.programs.maps[TC_MAP_XDP_STATS].fd))


@contextmanager
def routed_client(world: World, device: str, address: str) -> Iterator[str]:
    """A namespace with ``address``, routed to node1 through its own veth ``device`` (the
    node end), made now and served once its tc links are pinned; removed after."""
    ns = world.add_routed(f"c-{device}", device, address, GATEWAY)
    try:
        links = {f"link_{device}_ingress", f"link_{device}_egress"}
        wait_for(lambda: links <= world.tc_links(), timeout=30)
        yield ns
    finally:
        world.remove_routed(ns, device)


def _sources(ns: str, host: str = CIP4, count: int = 4, pod: str = "pod-a",
             proto: str = "tcp") -> set[str]:
    """The sources ``pod`` saw for ``count`` connections (datagrams) from ``ns`` to
    ``host``:80, each answered by ``pod`` (from ``host``:80: the client's socket is
    connected to it and takes nothing from another address)."""
    got = summarize(probe(ns, proto, host, 80, count))
    assert got.names == Counter({pod: count}), got
    return got.sources


def _outside(world: World) -> str:
    return world.lab.ns(CLIENT.name)


def test_cluster_cidr_masquerades_sources_outside_it(world: World) -> None:
    """ClusterCIDR: the LAN client (outside the cluster CIDR) reaches the ClusterIP's
    local endpoint from br0's address, over IPv4 and IPv6; a routed client inside the
    cluster CIDR keeps its own. Without a detector (no cluster CIDR), neither is."""
    _detect(world, None)
    assert _sources(_outside(world)) == {CLIENT.ipv4}
    _detect(world, _context(cluster_cidrs=CLUSTER_CIDRS))
    try:
        before = _xdp_stats(world)
        assert _sources(_outside(world)) == {BRIDGE4}
        assert _sources(_outside(world), CIP6) == {BRIDGE6}
        if world.options.get("xdp"):
            # Each flow picked and masqueraded in XDP: sent to br0 from there, or (br0's
            # neighbour not known yet) carried on by tc from the entries XDP wrote.
            after = _xdp_stats(world)
            picked = after["new"] + after["picked"] - before["new"] - before["picked"]
            assert picked == 8 and after["new"] > before["new"], (before, after)
        with routed_client(world, "spln0", IN_CLUSTER) as inside:
            assert _sources(inside) == {IN_CLUSTER}
    finally:
        _detect(world, None)


def test_local_traffic_to_a_remote_endpoint_keeps_its_source(world: World) -> None:
    """ClusterCIDR: a pod's process outside the socket programs' cgroup (through br0)
    reaching a ClusterIP whose endpoint is on node2 is DNATed only, as kube-proxy leaves
    local traffic alone: pod-c sees the pod's address (TCP and UDP, IPv4 and IPv6) and
    the answers come back from the ClusterIP (node2 routes node1's pods through node1);
    the LAN client is still masqueraded (to node1's eth0 address), and with
    --masquerade-all the pod is too."""
    pod = world.lab.ns(POD.name)
    _detect(world, _context(cluster_cidrs=CLUSTER_CIDRS))
    try:
        for proto in ("tcp", "udp"):
            assert _sources(pod, REMOTE4, pod="pod-c", proto=proto) == {POD.ipv4}, proto
        assert _sources(pod, REMOTE6, pod="pod-c") == {POD.ipv6}
        assert _sources(_outside(world), REMOTE4, pod="pod-c") == {NODE1.ipv4}
        assert _sources(_outside(world), REMOTE6, pod="pod-c") == {NODE1.ipv6}
        _detect(world, _context(cluster_cidrs=CLUSTER_CIDRS, masquerade_all=True))
        assert _sources(pod, REMOTE4, pod="pod-c") == {NODE1.ipv4}
        assert _sources(pod, REMOTE6, pod="pod-c") == {NODE1.ipv6}
    finally:
        _detect(world, None)


def test_node_cidr_masquerades_sources_outside_the_nodes_pod_cidrs(world: World) -> None:
    """NodeCIDR: a source in node1's pod CIDR keeps its address; one in the cluster CIDR
    but another node's pod CIDR, and the LAN client, are masqueraded."""
    _detect(world, _context(detect_local_mode="NodeCIDR", cluster_cidrs=CLUSTER_CIDRS))
    try:
        assert _sources(_outside(world)) == {BRIDGE4}
        with routed_client(world, "spln0", IN_NODE) as mine:
            assert _sources(mine) == {IN_NODE}
        with routed_client(world, "spln1", IN_CLUSTER) as other:
            assert _sources(other) == {BRIDGE4}
    finally:
        _detect(world, None)


def _dump(world: World) -> list[str]:
    """--dump's lines, read in node1's namespace (device names are its)."""
    assert world.backend is not None
    pins = world.backend.layout.pin_dir
    return list(call_in(world.node, lambda: list(packet_dump_lines(pins))))


def test_interface_name_prefix_follows_devices_as_they_come(world: World) -> None:
    """InterfaceNamePrefix ``spln``: a client behind ``spln0`` (made after the sync, with
    an address outside every cluster CIDR) keeps its address; made again (a new
    ifindex, no sync) it still does; the LAN client (``eth0``) is masqueraded. With
    the prefix ``cali`` the same client is masqueraded, and --dump shows the devices."""
    _detect(world, _context(detect_local_mode="InterfaceNamePrefix",
                            pod_interface_name_prefix="spln", cluster_cidrs=CLUSTER_CIDRS))
    try:
        assert _sources(_outside(world)) == {BRIDGE4}
        with routed_client(world, "spln0", OUTSIDE) as client:
            assert _sources(client) == {OUTSIDE}
            assert any(line.startswith("local traffic devices: spln0 (") for line in _dump(world))
        wait_for(lambda: not any("devices" in line for line in _dump(world)), timeout=30)
        with routed_client(world, "spln0", OUTSIDE) as client:
            assert _sources(client) == {OUTSIDE}
            _detect(world, _context(detect_local_mode="InterfaceNamePrefix",
                                    pod_interface_name_prefix="cali"))
            assert _sources(client) == {BRIDGE4}
    finally:
        _detect(world, None)


def test_bridge_interface_is_the_device_of_that_name_alone(world: World) -> None:
    """BridgeInterface: what arrives by the device of that name keeps its address; a
    device whose name only starts with it does not count; the LAN client is
    masqueraded."""
    with routed_client(world, "spln0", OUTSIDE) as client:
        _detect(world, _context(detect_local_mode="BridgeInterface",
                                pod_bridge_interface="spln0"))
        try:
            assert _sources(_outside(world)) == {BRIDGE4}
            assert _sources(client) == {OUTSIDE}
            _detect(world, _context(detect_local_mode="BridgeInterface",
                                    pod_bridge_interface="spln"))
            assert _sources(client) == {BRIDGE4}
        finally:
            _detect(world, None)


def test_a_restart_adopts_the_detector_and_cleanup_removes_it(world: World) -> None:
    """A new backend on the same pins keeps the generation in use (nothing rewritten when
    nothing changed) and masquerades as before; --cleanup removes the maps' pins."""
    context = _context(cluster_cidrs=CLUSTER_CIDRS)
    _detect(world, context)
    before = [line for line in _dump(world) if line.startswith("local traffic")]
    assert before[1:] == ["local traffic prefixes: 10.244.0.0/16 fd00:244::/48"], before
    old = world.backend
    assert old is not None
    world.in_node(old.close)
    world.backends["node1"] = packet_path.PacketBackend(old.config, world.layout())
    _detect(world, context)
    assert [line for line in _dump(world) if line.startswith("local traffic")] == before
    assert _sources(_outside(world)) == {BRIDGE4}
    tc = old.layout.dir
    assert {p.name for p in tc.glob("spp_local*")} == {
        "spp_local", "spp_local_cidrs", "spp_local_devices"}
    world.in_node(world.backends["node1"].cleanup)
    assert not tc.exists()
    _detect(world, None)
    assert _sources(_outside(world)) == {CLIENT.ipv4}

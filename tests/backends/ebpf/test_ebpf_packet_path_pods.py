"""``--ebpf-pod-devices`` and SCTP on the packet path, with real packets in the two-node
lab: node1's tc programs on its ``eth0`` and on every device named ``sppv*`` (a pod's
host-side veth, Calico-style: the pod routed through it, no bridge).

SCTP: this machine's kernel has no SCTP sockets, so the SCTP packets are crafted here
(an INIT and an INIT ACK, CRC32c computed here) and sent and read with raw IP sockets in
the namespaces. What is proven: the program rewrites an SCTP packet's addresses and ports
(DNAT, SNAT with a NAT port, and the reverse of both on the reply) and writes the CRC32c
a receiving kernel checks (``sctp_rcv`` drops a packet whose CRC32c is wrong). What is
not: an SCTP association between real sockets (no SCTP stack here), multi-homing (an
endpoint's other addresses in its INIT chunk are not rewritten, as kube-proxy's NAT
leaves them too).

Everything made here (namespaces, veths, the bpffs mount, pins, links) is removed at
the end, also when a test fails.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf.packet_loader import PacketLayout
from svcproxy.model import ServicePortState, ServiceType
from svcproxy.sdk import Changes, NodeConfig
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, ip
from tests.support.packet_path import CLIENT, NODE1, PODS
from tests.support.packet_path_sctp import crc32c, exchange
from tests.support.waiting import wait_for
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")

POD_IP, POD_GATEWAY, POD_DEVICE = "10.244.1.200", "169.254.1.1", "sppv0"


class World(packet_path.World):
    """The lab, echo servers in pod-a (node1) and pod-c (node2), and the packet backend
    on node1 with ``eth0`` and the pattern ``sppv*``."""

    def __init__(self) -> None:
        super().__init__("sptcp-", devices=("eth0",), servers=("pod-a", "pod-c"),
                         pod_devices=("sppv*",))

    def resync(self) -> None:
        """A sync of every service (what finds the pod devices)."""
        self.sync(Changes(frozenset(self.services)))

    def add_pod(self, name: str = "podv") -> str:
        """A pod routed through its own veth ``sppv0`` (Calico-style: a /32, its gateway
        an address of the node's end), made now; returns its namespace."""
        return self.add_routed(name, POD_DEVICE, POD_IP, POD_GATEWAY)


def service(name: str, pods: list[str], proto: str = "TCP", node_port: int = 0,
            cip: str = "") -> ServicePortState:
    """A service ``cip``:80 (and ``node_port``) -> 8080 on ``pods``."""
    kind = ServiceType.NODE_PORT if node_port else ServiceType.CLUSTER_IP
    return packet_path.node_port(name, node_port, pods, proto, cip=cip, type=kind)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World())


def test_pod_devices_that_appear_later_are_attached_and_serve_the_pod(world: World) -> None:
    """A pod outside the cgroup, on a veth made after the start, reaches a ClusterIP
    (local endpoint: DNAT, its own address kept) and a NodePort (remote endpoint: SNATed
    to node1); its device's pins go with it."""
    world.set(service("pods-cip", ["pod-a"], cip="10.96.8.1"))
    world.set(service("pods-np", ["pod-c"], node_port=30180, cip="10.96.8.3"))
    assert not any(POD_DEVICE in p for p in world.tc_links())
    pod = world.add_pod()
    world.resync()  # the next sync attaches what matches the pattern
    assert {f"link_{POD_DEVICE}_ingress", f"link_{POD_DEVICE}_egress"} <= world.tc_links()
    cip = summarize(probe(pod, "tcp", "10.96.8.1", 80, 5))
    assert cip.names == Counter({"pod-a": 5}) and cip.sources == {POD_IP}, cip
    nodeport = summarize(probe(pod, "tcp", NODE1.ipv4, 30180, 5))
    assert nodeport.names == Counter({"pod-c": 5}) and nodeport.sources == {NODE1.ipv4}, \
        nodeport
    ip(world.node, "link", "del", POD_DEVICE)
    world.resync()
    assert not any(POD_DEVICE in p for p in world.tc_links()), world.tc_links()
    world.remove_routed(pod, POD_DEVICE)


def test_a_pod_device_is_attached_when_it_appears_not_at_the_next_sync(world: World) -> None:
    """No sync after the start: the backend's link monitor (rtnetlink notifications)
    attaches the programs to a matching veth as it appears, the pod is served through it,
    and the device's pins go when it goes."""
    world.set(service("pods-event", ["pod-a"], cip="10.96.8.5"))
    links = {f"link_{POD_DEVICE}_ingress", f"link_{POD_DEVICE}_egress"}
    assert not links & world.tc_links()
    pod = world.add_pod("podw")
    try:
        wait_for(lambda: links <= world.tc_links(), timeout=30)
        cip = summarize(probe(pod, "tcp", "10.96.8.5", 80, 5))
        assert cip.names == Counter({"pod-a": 5}) and cip.sources == {POD_IP}, cip
        ip(world.node, "link", "del", POD_DEVICE)
        wait_for(lambda: not links & world.tc_links(), timeout=30)
    finally:
        world.remove_routed(pod, POD_DEVICE)


# --- SCTP, crafted (tests.support.packet_path_sctp) ---------------------------------

def test_crc32c_is_the_standard_one() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def test_sctp_cluster_ip_from_a_pod_device(world: World) -> None:
    """SCTP from a pod outside the cgroup (the socket programs see no SCTP) to a ClusterIP:
    DNATed to the local endpoint, reversed on its way back, CRC32c right both ways."""
    pod = world.lab.ns("podv-sctp")
    if pod not in world.lab.created:
        ip(world.node, "link", "del", POD_DEVICE, check=False)
        pod = world.add_pod("podv-sctp")
    world.set(service("sctp-cip", ["pod-a"], proto="SCTP", cip="10.96.8.2"))
    arrived, back = exchange(pod, "10.96.8.2", 80, world.lab.ns("pod-a"), 40001)
    assert (arrived.source, arrived.destination) == (POD_IP, PODS["pod-a"].ipv4), arrived
    assert (arrived.sport, arrived.dport, arrived.chunk) == (40001, 8080, 1), arrived
    assert arrived.crc_ok, "the endpoint's kernel would drop it: CRC32c wrong after DNAT"
    assert (back.source, back.destination, back.sport, back.dport) == (
        "10.96.8.2", POD_IP, 80, 40001), back
    assert back.chunk == 2 and back.tag == 0x1234567 and back.crc_ok, back


def test_sctp_node_port_to_an_endpoint_on_another_node(world: World) -> None:
    """SCTP from the LAN to a NodePort whose endpoint is on node2: DNAT + SNAT to node1
    (a NAT port), the reply reversed to the client from the NodePort, CRC32c right."""
    world.set(service("sctp-np", ["pod-c"], proto="SCTP", node_port=30181, cip="10.96.8.4"))
    client = world.lab.ns(CLIENT.name)
    arrived, back = exchange(client, NODE1.ipv4, 30181, world.lab.ns("pod-c"), 40002)
    assert (arrived.source, arrived.destination) == (NODE1.ipv4, PODS["pod-c"].ipv4), arrived
    assert arrived.dport == 8080 and arrived.sport >= 32768 and arrived.crc_ok, arrived
    assert (back.source, back.destination, back.sport, back.dport) == (
        NODE1.ipv4, CLIENT.ipv4, 30181, 40002), back
    assert back.crc_ok, back


# --- observability -------------------------------------------------------------------

def _metric(world: World, name: str) -> float:
    assert world.backend is not None
    for family in call_in(world.node, lambda: list(world.backend.collect_metrics())):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no metric {name}")


def test_nat_port_exhaustion_is_counted_and_dump_shows_flows_per_service(world: World) -> None:
    """Every NAT port of (endpoint, node address) taken: a new flow to the remote
    endpoint is dropped and counted; --dump shows each service's flows and NAT entries."""
    from svcproxy.backends.ebpf.names import TC_MAP_CT
    from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
    from svcproxy.backends.ebpf.packet_layout import CT_KEY, CT_REPLY, CT_SNAT, CT_VAL

    world.set(service("nat", ["pod-c"], node_port=30182, cip="10.96.8.5"))
    ok = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30182, 3))
    assert ok.names == Counter({"pod-c": 3}), ok
    lines = list(packet_dump_lines(world.bpffs / "pins"))
    line = next(x for x in lines if x.startswith(f"tc {NODE1.ipv4}:30182/tcp"))
    assert line.endswith("flows 3 (3 SNATed, 3 NAT entries)"), line
    assert any(x.startswith("# ") and "NAT entries" in x for x in lines), lines
    assert any(x.startswith("# tc counters: 0 nat_port_exhausted") for x in lines), lines
    assert world.backend is not None and world.backend.programs is not None
    ct = world.backend.programs.maps[TC_MAP_CT]
    pod_c = socket.inet_aton(PODS["pod-c"].ipv4) + bytes(12)
    node = socket.inet_aton(NODE1.ipv4) + bytes(12)
    keys = [CT_KEY.pack(pod_c, node, (8080).to_bytes(2, "big"), port.to_bytes(2, "big"),
                        socket.IPPROTO_TCP, 4, CT_REPLY, 0) for port in range(32768, 65536)]
    held = {k for k, _ in ct.items()}
    taken = [k for k in keys if k not in held]
    ct.update_many(taken, [CT_VAL.pack(bytes(16), bytes(16), bytes(2), bytes(2), CT_SNAT, 0,
                                       0, 0)] * len(taken))
    try:
        before = _metric(world, "svcproxy_ebpf_tc_nat_port_exhausted_total")
        refused = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30182, 2))
        assert refused.errors == Counter({"timeout": 2}), refused
        # A SYN and its retransmissions, each a new flow that found no port.
        assert _metric(world, "svcproxy_ebpf_tc_nat_port_exhausted_total") >= before + 2
    finally:
        ct.delete_many(taken)
    again = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30182, 2))
    assert again.names == Counter({"pod-c": 2}), again


def test_the_pod_devices_flag_names_patterns() -> None:
    import argparse

    from svcproxy.backends.ebpf.cli import add_arguments
    from svcproxy.backends.ebpf.packet_cli import packet_backend

    def layout(*argv: str) -> PacketLayout:
        parser = argparse.ArgumentParser()
        add_arguments(parser)  # type: ignore[arg-type]
        parser.add_argument("--cleanup", action="store_true")
        args = parser.parse_args([*argv, "--cleanup"])
        return packet_backend(args, NodeConfig(node_name="n1")).layout

    assert layout().pod_devices == ()
    assert layout("--ebpf-pod-devices", "cali*, lxc*,").pod_devices == ("cali*", "lxc*")

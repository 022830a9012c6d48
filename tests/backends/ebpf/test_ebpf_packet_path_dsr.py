"""``--ebpf-dsr`` with real packets in the two-node lab: the packet backend runs on node1
and node2 (eth0 and the pods' bridge br0 each); a NodePort on node1 whose endpoint is
on node2 reaches the pod with the LAN client's own address (externalTrafficPolicy
Cluster), and the reply goes from node2 straight to the client with the service's
address and port as its source.

The lab's namespaces, the bpffs mount, the pins and the links (on devices of
namespaces made here) are removed at the end, also when a test fails.
"""

from __future__ import annotations

import errno
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from svcproxy.backends.ebpf.ct_gc import gc_pass
from svcproxy.backends.ebpf.names import TC_MAP_CT
from svcproxy.backends.ebpf.packet_backend import PacketBackend
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, ns_exec
from tests.support.packet_path import CLIENT, NODE1, PODS, SPEC, World, node_port
from tests.support.packet_path_sctp import exchange
from tests.support.waiting import wait_for
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")

NODES = ("node1", "node2")
# <linux/in.h>, <linux/in6.h> (Python's socket module lacks them).
IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_MTU = 10, 2, 14
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO, IPV6_MTU = 23, 2, 24


def dsr_world(**layout: Any) -> World:
    """The lab with a DSR packet backend on each node (eth0 and the pods' bridge br0)."""
    return World("spdsr-", nodes=NODES, servers=("pod-a", "pod-c", "pod-d"), dsr=True,
                 **layout)


def add(world: World, name: str, port: int, pods: list[str], proto: str = "TCP",
        family: int = 4) -> None:
    """The NodePort service on every node, as each node's backend gets it."""
    world.set(lambda node: node_port(name, port, pods, proto, family, node=node, subnet=9))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(dsr_world())


def _rx_packets(ns: str, device: str) -> int:
    return int(ns_exec(ns, "cat", f"/sys/class/net/{device}/statistics/rx_packets"))


def _exchange(host: str, port: int, count: int) -> list[str]:
    """``count`` datagrams over one connected UDP socket: who answered each."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect((host, port))
        answers = []
        for _ in range(count):
            s.send(b"ping\n")
            answers.append(s.recv(256).decode().split()[0])
        return answers


@pytest.mark.parametrize("proto,family", [("tcp", 4), ("udp", 4), ("tcp", 6), ("udp", 6)])
def test_the_pod_sees_the_client_and_replies_come_from_the_service(
        world: World, proto: str, family: int) -> None:
    port = 30200 + 10 * family + (proto == "udp")
    add(world, f"dsr-{proto}{family}", port, ["pod-c"], proto.upper(), family)
    host = NODE1.ipv4 if family == 4 else NODE1.ipv6
    got = summarize(probe(world.lab.ns(CLIENT.name), proto, host, port, 8))
    # Every answer reached a socket connected to node1's NodePort: its source was the
    # service's address and port; the pod saw the client itself (no SNAT, eTP Cluster).
    assert got.names == Counter({"pod-c": 8}), got
    assert got.sources == {CLIENT.ipv4 if family == 4 else CLIENT.ipv6}, got


def test_replies_skip_the_ingress_node(world: World) -> None:
    """50 datagrams and their answers: node1's eth0 receives the 50 requests (and a
    little ARP), not the 50 answers, which go from node2 to the client."""
    add(world, "dsr-direct", 30250, ["pod-d"], "UDP")
    client = world.lab.ns(CLIENT.name)
    assert call_in(client, _exchange, NODE1.ipv4, 30250, 1) == ["pod-d"]
    before = _rx_packets(world.lab.ns("node1"), "eth0")
    assert call_in(client, _exchange, NODE1.ipv4, 30250, 50) == ["pod-d"] * 50
    received = _rx_packets(world.lab.ns("node1"), "eth0") - before
    assert 50 <= received < 75, received
    flows = [line for line in packet_dump_lines(world.bpffs / "node1", samples=1000)
             if line.startswith("flow 17") and ":30250 " in line]
    assert flows and not any(" via " in line for line in flows), flows  # not SNATed


def _flow_entries(backend: PacketBackend, client_port: int) -> dict[bytes, bytes]:
    """The spp_ct entries of the flow from the client's ``client_port``."""
    assert backend.programs is not None
    port = client_port.to_bytes(2, "big")
    return {k: v for k, v in backend.programs.maps[TC_MAP_CT].read_all().items()
            if port in (k[32:34], k[34:36])}


def _age(backend: PacketBackend, entries: dict[bytes, bytes], seconds: int) -> None:
    """Make each entry look ``seconds`` older (its last packet's time moved back)."""
    assert backend.programs is not None
    for key, value in entries.items():
        last = int.from_bytes(value[48:56], "little") - seconds * 1_000_000_000
        backend.programs.maps[TC_MAP_CT].update(key, value[:48] + last.to_bytes(8, "little"))


def test_an_answered_flow_lives_as_one_on_both_nodes(world: World) -> None:
    """Neither node sees both directions of a DSR flow, yet it is an answered flow on
    each (UDP: 120 s, not 30): idle 60 s, a GC pass on both nodes keeps it, and its
    next datagram reaches the same pod."""
    add(world, "dsr-idle", 30290, ["pod-c", "pod-d"], "UDP")

    def talk() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        s.bind((CLIENT.ipv4, 47123))
        s.connect((NODE1.ipv4, 30290))
        return s

    sock = call_in(world.lab.ns(CLIENT.name), talk)
    try:
        answers = [_ask(sock) for _ in range(3)]
        assert len(set(answers)) == 1, answers
        for node, backend in world.backends.items():
            entries = _flow_entries(backend, 47123)
            assert entries, node
            _age(backend, entries, 60)
            assert backend.programs is not None
            gc_pass(backend.programs.maps[TC_MAP_CT], backend.layout.ct_timeouts)
            assert _flow_entries(backend, 47123).keys() == entries.keys(), node
        assert _ask(sock) == answers[0]
    finally:
        sock.close()


def _ask(sock: socket.socket) -> str:
    sock.send(b"ping\n")
    return sock.recv(256).decode().split()[0]


def test_a_client_behind_the_node_is_snated_as_without_dsr(world: World) -> None:
    """A pod of node1 (outside any socket program) reaching the NodePort through br0:
    its reply would come back over another path, so it is SNATed, as without DSR."""
    add(world, "dsr-pod", 30260, ["pod-c"])
    got = summarize(probe(world.lab.ns("client"), "tcp", NODE1.ipv4, 30260, 5))
    assert got.names == Counter({"pod-c": 5}) and got.sources == {NODE1.ipv4}, got


def _know_neighbour(ns: str, address: str) -> None:
    """Make ``ns`` resolve ``address``'s MAC (a datagram to it), and wait until it has:
    XDP sends only where the neighbour is known (else tc resolves it)."""
    def send() -> None:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET,
                           socket.SOCK_DGRAM) as s:
            s.sendto(b"", (address, 9))

    call_in(ns, send)
    wait_for(lambda: "lladdr" in ns_exec(ns, "ip", "neigh", "show", address), timeout=30)


def test_with_xdp_dsr_flows_are_sent_in_geneve_by_xdp() -> None:
    """--ebpf-xdp generic next to --ebpf-dsr: XDP picks the endpoint, wraps the packet in
    Geneve and sends it on, for new flows and tracked ones alike (counted by the
    program; none left to tc), TCP over IPv4 and UDP over IPv6; the pod still sees the
    client. A datagram too big for Geneve is left to tc, which answers with the MTU."""
    from svcproxy.backends.ebpf import xdp
    from svcproxy.backends.ebpf.names import TC_MAP_XDP_STATS

    # XDP updates checksums: the senders' must be whole.
    w = dsr_world(xdp="generic", whole_checksums=(CLIENT.name, "pod-c", "pod-d"))
    try:
        w.start()
        add(w, "dsr-xdp", 30280, ["pod-c", "pod-d"])
        add(w, "dsr-xdp6", 30281, ["pod-c"], "UDP", 6)
        _know_neighbour(w.lab.ns("node1"), SPEC.node("node2").ipv4)
        _know_neighbour(w.lab.ns("node1"), SPEC.node("node2").ipv6)
        client = w.lab.ns(CLIENT.name)
        got = summarize(probe(client, "tcp", NODE1.ipv4, 30280, 10))
        assert sum(got.names.values()) == 10 and got.sources == {CLIENT.ipv4}, got
        got6 = summarize(probe(client, "udp", NODE1.ipv6, 30281, 5))
        assert got6.names == Counter({"pod-c": 5}) and got6.sources == {CLIENT.ipv6}, got6
        programs = w.backends["node1"].programs
        assert programs is not None
        stats = xdp.read_stats(programs.maps[TC_MAP_XDP_STATS].fd)
        assert stats["new"] >= 15 and stats["forward"] >= 10 and stats["picked"] == 0, str(stats)
        add(w, "dsr-xdp-mtu", 30282, ["pod-c"], "UDP")
        first, error, mtu, fits = call_in(client, _path_mtu_learned, NODE1.ipv4, 30282)
        assert (first, error, mtu, fits) == ("pod-c", errno.EMSGSIZE, 1440, "pod-c")
    finally:
        w.stop()


def _path_mtu_learned(host: str, port: int, size: int = 1500) -> tuple[str, int, int, str]:
    """A connected UDP socket that forbids fragmentation: a small datagram, then one of
    ``size`` bytes of IP (as big as the client's link carries). Returns who answered the
    first, the error the big one got, the path MTU the socket learned, and who answered
    a datagram exactly that big."""
    v6 = ":" in host
    ip_header = 40 if v6 else 20
    level = socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP
    with socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(10)
        if v6:
            s.setsockopt(level, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        else:
            s.setsockopt(level, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        s.connect((host, port))
        s.send(b"ping\n")
        first = s.recv(256).decode().split()[0]
        s.send(bytes(size - ip_header - 8))
        try:
            s.recv(256)
            error = 0
        except OSError as err:
            error = err.errno or 0
        mtu = s.getsockopt(level, IPV6_MTU if v6 else IP_MTU)
        s.send(bytes(mtu - ip_header - 8))
        fits = s.recv(256).decode().split()[0]
        return first, error, mtu, fits


@pytest.mark.parametrize("family", [4, 6])
def test_a_packet_too_big_for_geneve_gets_the_path_mtu_back(world: World, family: int) -> None:
    """A full-sized datagram (1,500 bytes, the MTU of every link of the lab) would not
    fit the link to node2 in Geneve: node1 answers as Cilium's DSR does, with ICMP
    fragmentation needed / ICMPv6 packet too big announcing 1,500 minus the overhead
    (60 bytes, 80 for IPv6); the client's socket learns it, and a datagram of exactly
    that size reaches the pod."""
    port = 30270 + family
    add(world, f"dsr-mtu{family}", port, ["pod-c"], "UDP", family)
    host = NODE1.ipv4 if family == 4 else NODE1.ipv6
    first, error, mtu, fits = call_in(world.lab.ns(CLIENT.name), _path_mtu_learned, host, port)
    assert first == "pod-c"
    assert error == errno.EMSGSIZE, "the client was not told its datagram was too big"
    assert mtu == (1440 if family == 4 else 1420)
    assert fits == "pod-c"


@pytest.mark.parametrize("family", [4, 6])
def test_a_small_mtu_toward_the_endpoint_is_announced(world: World, family: int) -> None:
    """node1's eth0 (the veth toward node2) at MTU 1,400: a 1,400-byte datagram, which
    node1 receives, gets 1,340 (IPv6: 1,320) back, and one of that size reaches the pod."""
    port = 30274 + family
    add(world, f"dsr-small{family}", port, ["pod-c"], "UDP", family)
    host = NODE1.ipv4 if family == 4 else NODE1.ipv6
    node = world.lab.ns("node1")
    ns_exec(node, "ip", "link", "set", "eth0", "mtu", "1400")
    try:
        got = call_in(world.lab.ns(CLIENT.name), _path_mtu_learned, host, port, 1400)
    finally:
        ns_exec(node, "ip", "link", "set", "eth0", "mtu", "1500")
    assert got == ("pod-c", errno.EMSGSIZE, 1340 if family == 4 else 1320, "pod-c")


@pytest.mark.parametrize("family", [4, 6])
def test_sctp_goes_by_dsr_too(world: World, family: int) -> None:
    """SCTP (crafted packets, tests.support.packet_path_sctp): an INIT from the LAN to
    node1's NodePort reaches pod-c on node2 from the client's own address (in Geneve,
    not SNATed), and pod-c's INIT ACK reaches the client from the NodePort; CRC32c
    right both ways (computed again after each port rewrite)."""
    port = 30264 + family
    add(world, f"dsr-sctp{family}", port, ["pod-c"], "SCTP", family)
    host, client, pod = ((NODE1.ipv4, CLIENT.ipv4, PODS["pod-c"].ipv4) if family == 4 else
                         (NODE1.ipv6, CLIENT.ipv6, PODS["pod-c"].ipv6))
    arrived, back = exchange(world.lab.ns(CLIENT.name), host, port, world.lab.ns("pod-c"),
                             40010 + family)
    assert (arrived.source, arrived.destination) == (client, pod), arrived
    assert (arrived.sport, arrived.dport, arrived.crc_ok) == (40010 + family, 8080, True), \
        arrived
    assert (back.source, back.destination, back.sport, back.dport) == (
        host, client, port, 40010 + family), back
    assert back.chunk == 2 and back.tag == 0x1234567 and back.crc_ok, back

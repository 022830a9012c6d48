"""SCTP to externalIPs and load-balancer VIPs on the packet path, with crafted packets in
the two-node lab (this machine's kernel has no SCTP sockets: tests.support.packet_path_sctp
sends an INIT and an INIT ACK with raw IP sockets and checks their CRC32c). node1's tc
programs on ``eth0`` and its pods' bridge ``br0``; the client on the LAN.

What is proven, IPv4 and IPv6: an externalIP whose endpoint is on node2 (DNAT + SNAT to
node1 with a NAT port, both reversed), a VIP (ipMode VIP) whose endpoint is on node1
(DNAT, masqueraded to the bridge's address as kube-proxy does for external traffic,
reversed), each rewrite with a CRC32c a receiving kernel accepts; a VIP's
loadBalancerSourceRanges keep a client outside them away. What is not: an association
between real SCTP sockets, multi-homing (docs/ebpf-packet-path.md, SCTP).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf import nat_ports
from svcproxy.model import LoadBalancerIngress, ServiceType
from tests.support import packet_path
from tests.support.packet_path import CLIENT, NODE1, PODS, SPEC, World, node_port
from tests.support.packet_path_sctp import INIT, exchange, raw_socket, receive, sctp_packet
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")

EXTERNAL = {4: "192.168.60.30", 6: "fd00:60::30"}
VIP = {4: "192.168.60.31", 6: "fd00:60::31"}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World("spsctpa-", servers=()))


@pytest.mark.parametrize("family", [4, 6])
def test_sctp_to_an_external_ip_with_its_endpoint_on_another_node(world: World,
                                                                  family: int) -> None:
    """From the LAN to an externalIP whose endpoint is on node2: DNAT + SNAT to node1's
    address (a NAT port), the INIT ACK reversed to the client from the externalIP."""
    world.set(node_port(f"sctp-ext{family}", 0, ["pod-c"], "SCTP", family,
                        subnet=30 + family, type=ServiceType.CLUSTER_IP,
                        external_ips=(EXTERNAL[family],)))
    node = NODE1.ipv4 if family == 4 else NODE1.ipv6
    client = CLIENT.ipv4 if family == 4 else CLIENT.ipv6
    pod = PODS["pod-c"].ipv4 if family == 4 else PODS["pod-c"].ipv6
    arrived, back = exchange(world.lab.ns(CLIENT.name), EXTERNAL[family], 80,
                             world.lab.ns("pod-c"), 40100 + family)
    assert (arrived.source, arrived.destination, arrived.dport) == (node, pod, 8080), arrived
    first, count = world.in_node(nat_ports.for_this_node)
    assert first <= arrived.sport < first + count, ("not a NAT port", arrived)
    assert arrived.crc_ok, "the endpoint's kernel would drop it: CRC32c wrong after NAT"
    assert (back.source, back.destination, back.sport, back.dport) == (
        EXTERNAL[family], client, 80, 40100 + family), back
    assert back.chunk == 2 and back.tag == 0x1234567 and back.crc_ok, back


@pytest.mark.parametrize("family", [4, 6])
def test_sctp_to_a_load_balancer_vip_with_its_endpoint_on_this_node(world: World,
                                                                    family: int) -> None:
    """From the LAN to a VIP (ipMode VIP) whose endpoint is on node1: DNATed,
    masqueraded to the address of br0 (the device toward the pod carries the programs),
    the INIT ACK reversed to the client from the VIP."""
    world.set(node_port(f"sctp-lb{family}", 30200 + family, ["pod-a"], "SCTP", family,
                        subnet=40 + family, type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress(VIP[family]),)))
    client = CLIENT.ipv4 if family == 4 else CLIENT.ipv6
    pod = PODS["pod-a"].ipv4 if family == 4 else PODS["pod-a"].ipv6
    arrived, back = exchange(world.lab.ns(CLIENT.name), VIP[family], 80,
                             world.lab.ns("pod-a"), 40110 + family)
    assert (arrived.source, arrived.destination, arrived.dport) == (
        NODE1.gateways[0 if family == 4 else 1], pod, 8080), arrived
    assert arrived.crc_ok, "the endpoint's kernel would drop it: CRC32c wrong after NAT"
    assert (back.source, back.destination, back.sport, back.dport) == (
        VIP[family], client, 80, 40110 + family), back
    assert back.chunk == 2 and back.tag == 0x1234567 and back.crc_ok, back


def test_sctp_to_a_vip_keeps_sources_outside_its_ranges_away(world: World) -> None:
    """loadBalancerSourceRanges hold for SCTP too: the client inside them reaches the
    pod, the other LAN client's INIT is dropped (nothing reaches the pod)."""
    world.set(node_port("sctp-lbr", 30210, ["pod-a"], "SCTP", subnet=50,
                        type=ServiceType.LOAD_BALANCER,
                        load_balancer_ingress=(LoadBalancerIngress("192.168.60.32"),),
                        load_balancer_source_ranges=(f"{CLIENT.ipv4}/32",)))
    arrived, _ = exchange(world.lab.ns(CLIENT.name), "192.168.60.32", 80,
                          world.lab.ns("pod-a"), 40120)
    assert arrived.destination == PODS["pod-a"].ipv4 and arrived.crc_ok, arrived
    other = world.lab.ns(SPEC.clients[1].name)
    sender, endpoint = raw_socket(other), raw_socket(world.lab.ns("pod-a"))
    try:
        sender.sendto(sctp_packet(40121, 80, 0, INIT), ("192.168.60.32", 0))
        with pytest.raises(TimeoutError):
            receive(endpoint, 8080)
    finally:
        sender.close()
        endpoint.close()

"""SCTP over IPv6 on the packet path, with crafted packets in the two-node lab (this
machine's kernel has no SCTP sockets: tests.support.packet_path_sctp sends an INIT and
an INIT ACK with raw IPv6 sockets and checks their CRC32c). node1's tc programs on
``eth0`` and its pods' bridge ``br0``.

What is proven: DNAT, SNAT with a NAT port and the reverse of both for SCTP in IPv6,
each rewrite with a CRC32c a receiving kernel would accept. What is not: an
association between real SCTP sockets, multi-homing (see docs/ebpf-packet-path.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.model import ServiceType
from tests.support import packet_path
from tests.support.packet_path import CLIENT, NODE1, PODS, World, node_port
from tests.support.packet_path_sctp import exchange
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World("spsctp-", servers=()))


def test_sctp_ipv6_node_port_to_an_endpoint_on_another_node(world: World) -> None:
    """From the LAN to a NodePort whose endpoint is on node2: DNAT + SNAT to node1's
    IPv6 address (a NAT port), the INIT ACK reversed to the client from the NodePort."""
    world.set(node_port("sctp6-np", 30191, ["pod-c"], "SCTP", 6))
    arrived, back = exchange(world.lab.ns(CLIENT.name), NODE1.ipv6, 30191,
                             world.lab.ns("pod-c"), 40061)
    assert (arrived.source, arrived.destination) == (NODE1.ipv6, PODS["pod-c"].ipv6), arrived
    assert arrived.dport == 8080 and arrived.sport >= 32768 and arrived.crc_ok, arrived
    assert (back.source, back.destination, back.sport, back.dport) == (
        NODE1.ipv6, CLIENT.ipv6, 30191, 40061), back
    assert back.chunk == 2 and back.tag == 0x1234567 and back.crc_ok, back


def test_sctp_ipv6_cluster_ip_from_a_pod_outside_the_cgroup(world: World) -> None:
    """From a pod of node1 (the socket programs see no SCTP) through br0 to a ClusterIP
    whose endpoint is on node1: DNATed, the pod's own address kept, reversed on the
    way back (tc egress)."""
    world.set(node_port("sctp6-cip", 0, ["pod-a"], "SCTP", 6, cip="fd00:96::7:10",
                        type=ServiceType.CLUSTER_IP))
    pod = PODS["client"]
    arrived, back = exchange(world.lab.ns("client"), "fd00:96::7:10", 80,
                             world.lab.ns("pod-a"), 40062)
    assert (arrived.source, arrived.destination) == (pod.ipv6, PODS["pod-a"].ipv6), arrived
    assert (arrived.sport, arrived.dport, arrived.crc_ok) == (40062, 8080, True), arrived
    assert (back.source, back.destination, back.sport, back.dport) == (
        "fd00:96::7:10", pod.ipv6, 80, 40062), back
    assert back.chunk == 2 and back.crc_ok, back

"""The packet path's NAT ports never collide with the node's own connections (issue 31).

A flow from outside to an endpoint on another node is SNATed to node1's address; its
reply entry (endpoint, node address, endpoint port, NAT port) catches every packet of
that tuple. When the NAT port was one the node's kernel also gives its own connections
(the client's port was kept when >= 32768, inside ``ip_local_port_range``), a
connection of the node to the same endpoint from that port lost its replies to the
external client and timed out: the intermittent timeouts of the scenario rows where the
node itself reaches a VIP or NodePort. Here the collision is forced: the node connects
from the very port the client used.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from svcproxy.backends.ebpf import nat_ports
from tests.support import packet_path
from tests.support.lab.netns import call_in
from tests.support.packet_path import CLIENT, NODE1, PODS, World, node_port
from tests.support.world_fixture import running

PORT = 45123  # inside the default ip_local_port_range (32768-60999)
REPLY_BOUND = 10.0  # generous: a reply either comes or was stolen


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World("spnat-", devices=("eth0",), servers=("pod-c",)))


def _name_from(ns: str, source: str, host: str, port: int, sport: int) -> str:
    """Who answers a TCP connection from (source, sport) to (host, port)."""
    def once() -> str:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.settimeout(REPLY_BOUND)
            s.bind((source, sport))
            s.connect((host, port))
            return s.recv(256).decode().split()[0]

    return call_in(ns, once)


@pytest.mark.netns
@pytest.mark.skipif(bool(packet_path.missing("ip", "nft")),
                    reason=packet_path.missing("ip", "nft") or "ok")
def test_node_connection_from_a_port_a_snated_client_used_gets_its_replies(
        world: World) -> None:
    world.set(node_port("nat-collide", 30120, ["pod-c"]))
    client = world.lab.ns(CLIENT.name)
    assert _name_from(client, CLIENT.ipv4, NODE1.ipv4, 30120, PORT) == "pod-c"
    # node1 itself, straight to the endpoint, from the port the client's flow came from.
    node = world.lab.ns("node1")
    pod = PODS["pod-c"].ipv4
    assert _name_from(node, NODE1.ipv4, pod, 8080, PORT) == "pod-c"
    # And the client again, its flow still tracked: both keep working.
    assert _name_from(client, CLIENT.ipv4, NODE1.ipv4, 30120, PORT + 2) == "pod-c"


@pytest.mark.parametrize(("local", "ports"), [
    ((32768, 60999), (61000, 4536)),  # the kernel's default: 61000-65535
    ((1024, 60000), (60001, 5535)),
    ((40000, 65535), (1024, 38976)),  # nothing above: below it, from 1024
    ((1024, 65000), nat_ports.DEFAULT),  # too few either side: 32768-65535, with a warning
    (None, nat_ports.DEFAULT),
])
def test_nat_ports_lie_outside_the_nodes_ephemeral_ports(
        local: tuple[int, int] | None, ports: tuple[int, int]) -> None:
    assert nat_ports.nat_ports(local) == ports
    if ports != nat_ports.DEFAULT:
        first, count = ports
        assert local and not (first <= local[1] and local[0] <= first + count - 1)


def test_the_range_is_read_from_the_sysctl(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    sysctl = tmp_path / "ip_local_port_range"
    sysctl.write_text("32768\t60999\n")
    assert nat_ports.for_this_node(sysctl) == (61000, 4536)
    assert not caplog.records
    sysctl.write_text("1024\t65535\n")
    assert nat_ports.for_this_node(sysctl) == nat_ports.DEFAULT
    assert "ip_local_port_range" in caplog.text

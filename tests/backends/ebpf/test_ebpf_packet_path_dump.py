"""``--dump`` of the packet path shows the NAT ports: the range the loaded program takes
them from (``nat_ports.py``: above the node's ``net.ipv4.ip_local_port_range``) and,
per endpoint and node address, how many are in use and free. Real flows in the two-node
lab from the LAN to a NodePort whose endpoint is on node2 (SNATed to node1), node1's
programs on ``eth0`` and ``br0``; everything made here is removed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from svcproxy.backends.ebpf import nat_usage
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from tests.support import packet_path
from tests.support.lab.netns import ns_exec
from tests.support.packet_path import NODE1, PODS, World, node_port
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")


@pytest.fixture
def world() -> Iterator[World]:
    yield from running(World("spdump-", servers=("pod-c",)))


def ports(world: World, low: int, high: int) -> None:
    ns_exec(world.lab.ns("node1"), "sysctl", "-q", "-w",
            f"net.ipv4.ip_local_port_range={low} {high}")


def dump(world: World) -> list[str]:
    return list(world.in_node(lambda: list(packet_dump_lines(world.layout().pin_dir))))


def test_dump_shows_the_nat_port_range_and_the_ports_in_use(world: World) -> None:
    """The node's ephemeral ports 20000-49999: the NAT ports are 50000-65535; 3 TCP and
    2 UDP flows to pod-c hold 3 and 2 of them; the node's range changed afterwards, the
    dump still names the loaded program's range and what a restart would take."""
    ports(world, 20000, 49999)
    world.set(node_port("dump-tcp", 30321, ["pod-c"]))
    world.set(node_port("dump-udp", 30322, ["pod-c"], "UDP", subnet=2))
    assert world.tcp(30321, count=3).answered == {"pod-c"}
    assert world.udp(30322, count=2).answered == {"pod-c"}
    pod = PODS["pod-c"].ipv4
    lines = dump(world)
    assert ("# NAT ports 50000-65535 (15536 per endpoint and node address; "
            "net.ipv4.ip_local_port_range 20000 49999): 5 in use by 2 endpoints") in lines, lines
    assert f"nat {pod}:8080/tcp from {NODE1.ipv4}: 3 in use, 15533 free" in lines, lines
    assert f"nat {pod}:8080/udp from {NODE1.ipv4}: 2 in use, 15534 free" in lines, lines
    ports(world, 32768, 60999)
    lines = dump(world)
    assert ("# NAT ports 50000-65535 (15536 per endpoint and node address; "
            "net.ipv4.ip_local_port_range 32768 60999, which now gives 61000-65535: a "
            "restart takes those): 5 in use by 2 endpoints") in lines, lines


def test_dump_says_when_the_range_cannot_be_read(world: World, tmp_path: Path) -> None:
    """The constants pinned but no object to read their layout from: one line saying so,
    not a failed --dump."""
    world.set(node_port("dump-noobj", 30323, ["pod-c"]))
    lines = world.in_node(lambda: list(nat_usage.dump_lines(
        world.layout().dir, tmp_path / "missing.bpf.o", [])))
    assert len(lines) == 1 and lines[0].startswith(
        "# NAT ports: the loaded program's range cannot be read"), lines

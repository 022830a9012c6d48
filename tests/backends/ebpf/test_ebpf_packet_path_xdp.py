"""``--ebpf-xdp generic`` with real packets in the two-node lab: the XDP program on
node1's eth0 and br0 (veths and a bridge: generic mode) forwards NodePort flows from the
LAN to endpoints on node2 (DNAT + SNAT) and their replies, its counters say so; local
endpoints are served as by tc, each flow picked once; a device where XDP cannot attach
is logged once and served by tc; a restart adopts the links; cleanup removes them and
their pins.

The senders' veths write whole checksums (tests.support.lab.checksums), so a packet
XDP rewrote with a wrong checksum is dropped by its receiver. Everything made (the
lab's namespaces, the bpffs mount, pins, links on the lab's devices) is removed at the
end, also when a test fails.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from svcproxy.backends.ebpf import libbpf, xdp
from svcproxy.backends.ebpf.packet_backend import PacketBackend
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from svcproxy.backends.ebpf.packet_loader import PacketLayout
from svcproxy.model import (
    ServicePortState,
    TrafficPolicy,
)
from svcproxy.sdk import Changes, NodeConfig, NodeState
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, ip, ns_exec
from tests.support.lab.topology import Namespaces
from tests.support.packet_path import CLIENT, NODE1
from tests.support.packet_path_xdp import XdpWorld, assert_forwarded_in_xdp
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip", "bpftool")

SENDERS = (CLIENT.name, "client", "pod-a", "pod-c", "pod-d")


def node_port(name: str, port: int, pods: list[str], proto: str = "TCP",
              family: int = 4, **extra: Any) -> ServicePortState:
    """A NodePort service ``port`` -> 8080 on ``pods``, as node1's backend gets it."""
    return packet_path.node_port(name, port, pods, proto, family, subnet=8, **extra)


class World(XdpWorld):
    """The lab (whole checksums from its senders), echo servers, a bpffs, and the packet
    backend on node1 with XDP in generic mode."""

    def __init__(self) -> None:
        super().__init__("spxdp-", servers=("pod-a", "pod-c", "pod-d"), xdp="generic",
                         whole_checksums=SENDERS)

    def xdp_links(self) -> dict[str, int]:
        """Pinned XDP link name -> link id."""
        found = {}
        for path in sorted((self.bpffs / "pins" / "tc").glob("link_*_xdp_*")):
            fd = libbpf.obj_get(str(path))
            try:
                found[path.name] = int(xdp._info(fd).id)
            finally:
                os.close(fd)
        return found


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World())


@pytest.mark.parametrize("proto,family", [("tcp", 4), ("udp", 4), ("tcp", 6), ("udp", 6)])
def test_node_port_to_another_node_is_forwarded_in_xdp(
        world: World, proto: str, family: int) -> None:
    port = 30300 + 10 * family + (proto == "udp")
    assert_forwarded_in_xdp(world, f"xdp-{proto}{family}", port, proto, family, subnet=8)


def test_a_local_endpoint_masqueraded_is_sent_by_xdp_to_the_pods_bridge(world: World) -> None:
    """externalTrafficPolicy Cluster: SNATed to br0's address (as tc does, br0 carrying
    the programs) and redirected to br0 by XDP."""
    world.set(node_port("xdp-local", 30330, ["pod-a"]))
    client = world.lab.ns(CLIENT.name)
    assert summarize(probe(client, "tcp", NODE1.ipv4, 30330, 1)).answered
    before = world.stats()
    got = summarize(probe(client, "tcp", NODE1.ipv4, 30330, 5))
    after = world.stats()
    assert got.names == Counter({"pod-a": 5}) and got.sources == {NODE1.gateways[0]}, got
    assert after["new"] - before["new"] == 5, (before, after)


def test_external_traffic_policy_local_is_picked_in_xdp_and_delivered_by_tc(
        world: World) -> None:
    """DNAT only (the client's address kept): XDP picks and tracks the flow, the stack
    delivers it after tc's rewrite."""
    world.set(node_port("xdp-etp", 30331, ["pod-a"],
                        external_traffic_policy=TrafficPolicy.LOCAL))
    before = world.stats()
    got = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30331, 5))
    after = world.stats()
    assert got.names == Counter({"pod-a": 5}) and got.sources == {CLIENT.ipv4}, got
    assert after["picked"] - before["picked"] == 5 and after["new"] == before["new"]


def test_each_flow_is_picked_once(world: World) -> None:
    """A local and a remote endpoint share 400 new flows evenly: a flow XDP picked is not
    picked again by tc (which would give the remote one about 3 in 4)."""
    world.set(node_port("xdp-share", 30332, ["pod-a", "pod-c"]))
    got = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30332, 400))
    assert sum(got.names.values()) == 400, got
    assert 130 <= got.names["pod-c"] <= 270, got.names


def test_metrics_dump_and_the_device_say_generic(world: World) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    assert world.backend is not None
    world.backend.register_metrics(registry)
    text = generate_latest(registry).decode()
    for device in ("eth0", "br0"):
        assert f'svcproxy_ebpf_xdp_attached{{device="{device}",mode="generic"}} 1.0' in text
    assert 'svcproxy_ebpf_xdp_packets_total{action="new"}' in text, text
    lines = list(packet_dump_lines(world.bpffs / "pins"))
    assert "xdp eth0: generic mode" in lines and "xdp br0: generic mode" in lines, lines
    assert any(line.startswith("# xdp packets: ") for line in lines), lines
    assert "xdpgeneric" in ip(world.lab.ns("node1"), "-d", "link", "show", "eth0")


def test_a_device_without_native_xdp_is_logged_once_and_served_by_tc(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """--ebpf-xdp native: a bridge has no native XDP: one warning, its tc links attached,
    the veth beside it runs XDP natively."""
    spaces = Namespaces()
    ns = spaces.add_ns("nat")
    backend = PacketBackend(NodeConfig(node_name="nat"),
                            PacketLayout(world.bpffs / "nat", ("eth0", "brx"), xdp="native"))
    try:
        ip(ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        ip(ns, "link", "add", "brx", "type", "bridge")
        for device in ("eth0", "peer0", "brx"):
            ip(ns, "link", "set", device, "up")
        with caplog.at_level(logging.WARNING, logger="svcproxy.backends.ebpf.xdp"):
            for revision in (1, 2):
                call_in(ns, backend.sync, NodeState("nat", revision, None, {}),
                        Changes(frozenset(), full=True))
        warnings = [r.getMessage() for r in caplog.records if "brx" in r.getMessage()]
        assert len(warnings) == 1 and "tc programs serve it alone" in warnings[0], warnings
        assert backend.programs is not None
        assert backend.programs.xdp_modes == {"eth0": "native", "brx": ""}
        assert set(backend.programs.attached) == {"eth0", "brx"}
        pins = world.bpffs / "nat" / "tc"
        assert (pins / "link_brx_ingress").exists() and (pins / "link_eth0_xdp_native").exists()
        ip(ns, "link", "del", "brx")
        call_in(ns, backend.sync, NodeState("nat", 3, None, {}), Changes(frozenset()))
        assert backend.programs.xdp_modes == {"eth0": "native"}, "a device gone is no row"
    finally:
        call_in(ns, backend.cleanup)
        spaces.destroy()


def test_a_restart_adopts_the_xdp_links(world: World) -> None:
    links = world.xdp_links()
    assert set(links) == {"link_eth0_xdp_generic", "link_br0_xdp_generic"}, links
    assert world.backend is not None
    again = PacketBackend(world.backend.config, world.layout())
    call_in(world.lab.ns("node1"), again.start)
    try:
        assert world.xdp_links() == links, "the same links, the program switched in place"
    finally:
        again.close()
    world.set(node_port("xdp-after", 30350, ["pod-c"], "UDP"))
    got = summarize(probe(world.lab.ns(CLIENT.name), "udp", NODE1.ipv4, 30350, 3))
    assert got.names == Counter({"pod-c": 3}), got


def test_cleanup_removes_the_xdp_programs_and_pins(world: World) -> None:
    links = world.xdp_links()
    assert world.backend is not None
    call_in(world.lab.ns("node1"), world.backend.cleanup)
    assert not (world.bpffs / "pins").exists()
    for link in links.values():
        shown = subprocess.run(["bpftool", "link", "show", "id", str(link)],
                               capture_output=True, text=True)
        assert shown.returncode != 0, shown.stdout
    for device in ("eth0", "br0"):
        assert "xdp" not in ns_exec(world.lab.ns("node1"), "ip", "-d", "link", "show", device)

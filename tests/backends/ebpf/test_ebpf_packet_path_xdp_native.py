"""``--ebpf-xdp native`` and ``auto`` with real packets in the two-node lab: node1's eth0
is a veth, whose driver runs XDP natively; br0, a bridge, has no native XDP (``native``:
logged and served by tc alone; ``auto``: generic there).

A frame a native XDP program sends out of a veth (``XDP_TX``, a redirect) is received
only when the veth's peer can take XDP frames: the peer has an XDP program of its own or
GRO on (NAPI mode; measured on Linux 6.18: GRO toggled on at the peer, eth0's xdp_tx
counter rises and the peer receives none, so the test uses a program). That is the lab's
wiring, not the node's: the test attaches an XDP_PASS program to the peer of node1's eth0
(``n1`` in the lan namespace, a device the lab made). Everything made is removed at the end,
also when a test fails.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf import libbpf
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from svcproxy.model import TrafficPolicy
from svcproxy.sdk import Changes
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, ip
from tests.support.packet_path import CLIENT, NODE1
from tests.support.packet_path_xdp import XdpWorld, assert_forwarded_in_xdp
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip", "bpftool")

SENDERS = (CLIENT.name, "client", "pod-a", "pod-c", "pod-d")
PEER = f"n{NODE1.index}"  # node1's eth0's peer, on the lan's bridge
XDP_PASS_INSNS = bytes([0xB7, 0, 0, 0, 2, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])  # r0 = 2; exit
PROG_TYPE_XDP, XDP_FLAGS_DRV_MODE = 6, 1 << 2


def _xdp_pass(device: str) -> None:
    """A native XDP program returning XDP_PASS on ``device`` (it goes with the device)."""
    lib = libbpf.lib()
    insns = ctypes.create_string_buffer(XDP_PASS_INSNS, len(XDP_PASS_INSNS))
    fd = libbpf.check(lib.bpf_prog_load(PROG_TYPE_XDP, b"spp_peer_pass", b"GPL", insns,
                                        len(XDP_PASS_INSNS) // 8, None), "load XDP_PASS")
    try:
        libbpf.check(lib.bpf_xdp_attach(socket.if_nametoindex(device), fd, XDP_FLAGS_DRV_MODE,
                                        None), f"XDP_PASS on {device}")
    finally:
        os.close(fd)


PEERS = {"xdp-pass": _xdp_pass}


class World(XdpWorld):
    """The lab (whole checksums from its senders), echo servers, a bpffs, the packet
    backend on node1 with XDP in ``mode``, the peer of node1's eth0 made able to take
    XDP frames by ``peer``."""

    def __init__(self, mode: str, peer: str) -> None:
        super().__init__("spxdpn-", servers=("pod-a", "pod-c", "pod-d"), xdp=mode,
                         whole_checksums=SENDERS)
        self.mode, self.peer = mode, peer

    def start(self) -> World:
        super().start()
        call_in(self.lab.ns("lan"), PEERS[self.peer], PEER)
        self.sync(Changes(frozenset(), full=True))
        return self


@pytest.fixture(scope="module", params=[("native", "xdp-pass"), ("auto", "xdp-pass")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from running(World(*request.param))


@pytest.mark.parametrize("proto,family", [("tcp", 4), ("udp", 4), ("tcp", 6), ("udp", 6)])
def test_node_port_to_another_node_is_forwarded_in_native_xdp(
        world: World, proto: str, family: int) -> None:
    port = 30400 + 10 * family + (proto == "udp")
    assert_forwarded_in_xdp(world, f"xdpn-{proto}{family}", port, proto, family, subnet=9)


def test_a_local_endpoint_is_served_as_with_tc(world: World) -> None:
    world.set(packet_path.node_port("xdpn-local", 30430, ["pod-a"], subnet=9))
    got = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30430, 5))
    assert got.names == Counter({"pod-a": 5}) and got.sources == {NODE1.gateways[0]}, got


def test_external_traffic_policy_local_is_served_as_with_tc(world: World) -> None:
    world.set(packet_path.node_port("xdpn-etp", 30431, ["pod-a"], subnet=9,
                                    external_traffic_policy=TrafficPolicy.LOCAL))
    got = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30431, 5))
    assert got.names == Counter({"pod-a": 5}) and got.sources == {CLIENT.ipv4}, got


def test_the_log_metrics_dump_and_the_device_say_native(world: World) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    br0 = "generic" if world.mode == "auto" else ""
    assert world.backend is not None and world.backend.programs is not None
    assert world.backend.programs.xdp_modes == {"eth0": "native", "br0": br0}
    registry = CollectorRegistry()
    world.backend.register_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'svcproxy_ebpf_xdp_attached{device="eth0",mode="native"} 1.0' in text, text
    lines = list(packet_dump_lines(world.bpffs / "pins"))
    assert "xdp eth0: native mode" in lines, lines
    shown = ip(world.node, "-d", "link", "show", "eth0")
    assert " xdp " in shown.splitlines()[0] and "prog/xdp" in shown, shown  # drv: "xdp"

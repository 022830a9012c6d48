"""A device named in ``--ebpf-devices`` that is not there at start is attached when the
kernel announces it (the backend's link monitor, as for ``--ebpf-pod-devices``), not at
the next sync, and forgotten when it goes: real packets in the two-node lab, node1's tc
programs on ``eth0`` and on ``sppn0``, a veth the test makes after the start with a
client routed through it. Everything made here is removed at the end, also on failure."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.model import ServiceType
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import ip
from tests.support.lab.topology import addresses, veth
from tests.support.waiting import wait_for

pytestmark = packet_path.marks("ip")

CLIENT_IP, GATEWAY, DEVICE = "10.244.1.210", "169.254.1.2", "sppn0"
LINKS = {f"link_{DEVICE}_ingress", f"link_{DEVICE}_egress"}


class World(packet_path.World):
    """The lab, an echo server in pod-a (node1), node1's packet backend on ``eth0`` and
    ``sppn0`` (absent at start)."""

    def __init__(self) -> None:
        super().__init__("spnamed-", devices=("eth0", DEVICE), servers=("pod-a",))

    @property
    def node(self) -> str:
        return self.lab.ns("node1")

    def add_client(self) -> str:
        """A namespace routed through its own veth ``sppn0`` on node1, made now."""
        ns = self.lab.add_ns("named")
        veth(ns, "eth0", self.node, DEVICE)
        addresses(ns, "eth0", f"{CLIENT_IP}/32")
        ip(ns, "route", "add", GATEWAY, "dev", "eth0")
        ip(ns, "route", "add", "default", "via", GATEWAY, "dev", "eth0", "onlink")
        addresses(self.node, DEVICE, f"{GATEWAY}/32")
        ip(self.node, "route", "add", f"{CLIENT_IP}/32", "dev", DEVICE)
        return ns

    def pins(self) -> set[str]:
        return {p.name for p in (self.bpffs / "pins" / "tc").glob("link_*")}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World()
    try:
        w.start()
        yield w
    finally:
        w.stop()


def test_a_named_device_is_attached_when_it_appears_not_at_the_next_sync(
        world: World) -> None:
    """No sync after the start: the device's links appear with it, a client behind it
    reaches a ClusterIP (DNAT at sppn0's ingress, its own address kept); the device
    deleted and made again is served again, still without a sync. With named devices
    left out of the link monitor's concern (only pod patterns), the links never appear."""
    world.set(packet_path.node_port("named-cip", 0, ["pod-a"], "TCP", cip="10.96.8.7",
                                    type=ServiceType.CLUSTER_IP))
    assert "link_eth0_ingress" in world.pins() and not LINKS & world.pins()
    client = world.add_client()
    try:
        wait_for(lambda: LINKS <= world.pins(), timeout=30)
        got = summarize(probe(client, "tcp", "10.96.8.7", 80, 5))
        assert got.names == Counter({"pod-a": 5}) and got.sources == {CLIENT_IP}, got
        ip(world.node, "link", "del", DEVICE)
        world.lab.created.remove(client)
        subprocess.run(["ip", "netns", "del", client], check=True)
        client = world.add_client()  # the same name again: a new device, a new index
        wait_for(lambda: _served(client), timeout=30)
    finally:
        ip(world.node, "link", "del", DEVICE, check=False)
        world.lab.created.remove(client)
        subprocess.run(["ip", "netns", "del", client], check=True)


def _served(client: str) -> bool:
    got = summarize(probe(client, "tcp", "10.96.8.7", 80, 1, timeout=0.5))
    return got.names == Counter({"pod-a": 1})

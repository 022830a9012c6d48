"""A device named in ``--ebpf-devices`` that is not there at start is attached when the
kernel announces it (the backend's link monitor, as for ``--ebpf-pod-devices``), not at
the next sync, and forgotten when it goes: real packets in the two-node lab, node1's tc
programs on ``eth0`` and on ``sppn0``, a veth the test makes after the start with a
client routed through it. Everything made here is removed at the end, also on failure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.model import ServiceType
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import ip
from tests.support.waiting import wait_for
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip")

CLIENT_IP, GATEWAY, DEVICE = "10.244.1.210", "169.254.1.2", "sppn0"
LINKS = {f"link_{DEVICE}_ingress", f"link_{DEVICE}_egress"}


class World(packet_path.World):
    """The lab, an echo server in pod-a (node1), node1's packet backend on ``eth0`` and
    ``sppn0`` (absent at start)."""

    def __init__(self) -> None:
        super().__init__("spnamed-", devices=("eth0", DEVICE), servers=("pod-a",))

    def add_client(self) -> str:
        """A namespace routed through its own veth ``sppn0`` on node1, made now."""
        return self.add_routed("named", DEVICE, CLIENT_IP, GATEWAY)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    yield from running(World())


def test_a_named_device_is_attached_when_it_appears_not_at_the_next_sync(
        world: World) -> None:
    """No sync after the start: the device's links appear with it, a client behind it
    reaches a ClusterIP (DNAT at sppn0's ingress, its own address kept); the device
    deleted and made again is served again, still without a sync. With named devices
    left out of the link monitor's concern (only pod patterns), the links never appear."""
    world.set(packet_path.node_port("named-cip", 0, ["pod-a"], "TCP", cip="10.96.8.7",
                                    type=ServiceType.CLUSTER_IP))
    assert "link_eth0_ingress" in world.tc_links() and not LINKS & world.tc_links()
    client = world.add_client()
    try:
        wait_for(lambda: LINKS <= world.tc_links(), timeout=30)
        got = summarize(probe(client, "tcp", "10.96.8.7", 80, 5))
        assert got.names == Counter({"pod-a": 5}) and got.sources == {CLIENT_IP}, got
        ip(world.node, "link", "del", DEVICE)
        world.remove_routed(client, DEVICE)
        client = world.add_client()  # the same name again: a new device, a new index
        wait_for(lambda: _served(client), timeout=30)
    finally:
        world.remove_routed(client, DEVICE)


def _served(client: str) -> bool:
    got = summarize(probe(client, "tcp", "10.96.8.7", 80, 1, timeout=0.5))
    return got.names == Counter({"pod-a": 1})

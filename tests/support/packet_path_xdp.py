"""What the XDP packet-path tests share: a world whose XDP counters can be read, and
the check that a NodePort flow to another node is forwarded in XDP (whatever its mode)."""

from __future__ import annotations

from collections import Counter

from svcproxy.backends.ebpf import xdp
from svcproxy.backends.ebpf.names import TC_MAP_XDP_STATS
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.packet_path import CLIENT, NODE1


class XdpWorld(packet_path.World):
    """A packet-path world whose backend runs XDP: ``stats`` reads its counters."""

    def stats(self) -> Counter[str]:
        assert self.backend is not None and self.backend.programs is not None
        return Counter(xdp.read_stats(self.backend.programs.maps[TC_MAP_XDP_STATS].fd))


def assert_forwarded_in_xdp(world: XdpWorld, name: str, port: int, proto: str, family: int,
                            subnet: int) -> None:
    """A NodePort ``port`` on pod-c and pod-d (node2): 10 new flows from the client are
    answered, SNATed to node1's address, each one new in XDP and each answer seen there."""
    world.set(packet_path.node_port(name, port, ["pod-c", "pod-d"], proto.upper(), family,
                                    subnet=subnet))
    host = NODE1.ipv4 if family == 4 else NODE1.ipv6
    client = world.lab.ns(CLIENT.name)
    # The first flow teaches node1 its neighbours (tc resolves them); then XDP has all.
    assert summarize(probe(client, proto, host, port, 1)).answered
    before = world.stats()
    got = summarize(probe(client, proto, host, port, 10))
    after = world.stats()
    assert sum(got.names.values()) == 10 and got.answered <= {"pod-c", "pod-d"}, got
    assert got.sources == {host}, "SNATed to node1's address, as with tc"
    assert after["new"] - before["new"] == 10, (before, after)  # every new flow in XDP
    assert after["reply"] - before["reply"] >= 10, (before, after)  # and every answer

"""What a balanced socket keeps of its endpoint, with real sockets: a client process in
the test's cgroup and network namespace holds a connected UDP socket and a TCP
connection to services; when their endpoint leaves the service, the UDP socket is
destroyed (its next call fails; Cilium's terminatePodConnections) and the TCP
connection is left alone. And ClientIP affinity holds across a service's addresses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf.names import MAP_AFFINITY
from svcproxy.model import SessionAffinity
from tests.support import ebpf_sockets
from tests.support.ebpf_sockets import DESTROYED, EPS4, EPS6, NODE_IP, Holder, SocketWorld, service
from tests.support.world_fixture import running

pytestmark = ebpf_sockets.marks()


@pytest.fixture(scope="module")
def world() -> Iterator[SocketWorld]:
    yield from running(SocketWorld())


@pytest.mark.parametrize("family", [4, 6])
def test_udp_socket_of_a_removed_endpoint_is_destroyed_tcp_is_left(world: SocketWorld,
                                                                   family: int) -> None:
    pair = EPS4[:2] if family == 4 else EPS6[:2]
    dns, web = ("10.96.5.1", "10.96.5.2") if family == 4 else ("fd00:96::5:1", "fd00:96::5:2")
    world.set(service(f"dns{family}", (dns,), pair, proto="UDP"))
    world.set(service(f"web{family}", (web,), pair))
    destroyed = world.backend.sockets_destroyed if world.backend else 0
    holder = Holder(world)
    try:
        udp = holder.call(op="open", id="u", proto="udp", host=dns)["name"]
        tcp = holder.call(op="open", id="t", proto="tcp", host=web)["name"]
        assert holder.call(op="ask", id="u") == {"name": udp}, "a connected socket's endpoint"
        world.set(service(f"dns{family}", (dns,), [e for e in pair if e != udp], proto="UDP"))
        world.set(service(f"web{family}", (web,), [e for e in pair if e != tcp]))
        # The removed endpoint still answers: without the destroy the socket would
        # keep talking to it. Destroyed (and so disconnected), its next send fails.
        got = holder.call(op="ask", id="u")
        assert got.get("errno") in DESTROYED, f"the UDP socket of the removed endpoint: {got}"
        again = holder.call(op="open", id="u2", proto="udp", host=dns)
        assert again == {"name": next(e for e in pair if e != udp)}, again
        # TCP keeps its connection to the removed endpoint (its own timeouts decide).
        assert holder.call(op="ask", id="t") == {"name": tcp}
        assert world.backend is not None and world.backend.sockets_destroyed == destroyed + 1
    finally:
        holder.stop()


def test_affinity_holds_across_the_services_addresses(world: SocketWorld) -> None:
    """A pod that reached endpoint A through the ClusterIP is sent to A through the
    NodePort and the externalIP of the same service, as kube-proxy keeps affinity."""
    world.set(service("sticky", ("10.96.5.3",), EPS4, node_port=30200,
                      external_ips=("192.168.77.20",),
                      session_affinity=SessionAffinity.CLIENT_IP,
                      session_affinity_timeout=10800))
    assert world.backend is not None and world.backend.programs is not None and world.client
    affinity = world.backend.programs.maps[MAP_AFFINITY]
    for _round in range(3):
        affinity.delete_many([k for k, _ in affinity.items()])
        first = world.client.names("tcp", "10.96.5.3", count=1)
        assert len(first) == 1 and set(first) <= set(EPS4), first
        chosen = next(iter(first))
        for host, port in ((NODE_IP, 30200), ("192.168.77.20", 80), ("10.96.5.3", 80)):
            got = world.client.names("tcp", host, port, count=3)
            assert got == Counter({chosen: 3}), (host, port, chosen, got)

"""The ebpf backend with real sockets: a client process in a cgroup the test made,
inside a network namespace the test made, connects to service addresses and the
cgroup programs send it to endpoints (echo servers on the namespace's loopback): the
world of ``tests.support.ebpf_sockets``.

Everything made here (namespace, cgroup, bpffs mount, pins, links, processes) is
removed at the end, also when a test fails.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.model import Protocol, ServicePortKey
from svcproxy.sdk import Changes, NodeState
from tests.support import ebpf_sockets
from tests.support.ebpf_sockets import CONFIG, EPS4, EPS6, NODE_IP, Client, SocketWorld, service
from tests.support.world_fixture import running

pytestmark = ebpf_sockets.marks()


@pytest.fixture(scope="module")
def world() -> Iterator[SocketWorld]:
    yield from running(SocketWorld())


@pytest.fixture
def client(world: SocketWorld) -> Client:
    assert world.client is not None
    return world.client


def test_tcp_cluster_ip_reaches_the_chosen_endpoints(world: SocketWorld, client: Client) -> None:
    world.set(service("web", ("10.96.0.1",), EPS4[:3]))
    seen = client.names("tcp", "10.96.0.1", count=40)
    assert set(seen) == set(EPS4[:3]), seen
    first = client.connect("tcp", "10.96.0.1")[0]
    assert first["peer"] == "10.96.0.1", "getpeername() shows the service address"


@pytest.mark.parametrize("cip,eps", [("10.96.0.2", EPS4), ("fd00:96::2", EPS6)], ids=["v4", "v6"])
def test_udp_connected_and_unconnected_both_families(world: SocketWorld, client: Client, cip: str,
                                                     eps: list[str]) -> None:
    world.set(service(f"dns{len(cip)}", (cip,), eps[1:], proto="UDP"))
    connected = client.connect("udp", cip, count=40)
    assert {r.get("name") for r in connected} == set(eps[1:]), connected
    assert {r["peer"] for r in connected} == {cip}
    unconnected = client.call(op="sendto", host=cip, port=80, count=40)
    assert {r.get("name") for r in unconnected} == set(eps[1:]), unconnected
    # Replies seem to come from the service (recvmsg's reverse translation).
    assert {tuple(r["from"]) for r in unconnected} == {(cip, 80)}
    tcp = client.names("tcp", cip)
    assert set(tcp) == {"unreachable"}, "a UDP service leaves TCP to the same port alone"


def test_tcp_ipv6_cluster_ip(world: SocketWorld, client: Client) -> None:
    world.set(service("web6", ("fd00:96::1",), EPS6[:2]))
    assert set(client.names("tcp", "fd00:96::1", count=30)) == set(EPS6[:2])
    assert client.connect("tcp", "fd00:96::1")[0]["peer"] == "fd00:96::1"


def test_internal_flag_decides_and_no_endpoints_refuse(world: SocketWorld, client: Client) -> None:
    # Only the endpoints the frontend marked internal serve ClusterIP traffic.
    world.set(service("itp", ("10.96.0.3",), EPS4, internal=EPS4[2:]))
    assert set(client.names("tcp", "10.96.0.3", count=30)) == set(EPS4[2:])
    # Endpoints exist but none for this traffic (internalTrafficPolicy Local with no local
    # endpoint): the socket is left alone for the packet path (nothing routes it here).
    world.set(service("itp", ("10.96.0.3",), EPS4, internal=[]))
    assert set(client.names("tcp", "10.96.0.3", count=3)) == {"unreachable"}
    # No usable endpoint anywhere: connect() is refused at once, TCP and UDP.
    world.set(service("empty", ("10.96.0.4", "fd00:96::4"), []))
    world.set(service("empty-udp", ("10.96.0.4", "fd00:96::4"), [], proto="UDP"))
    for host in ("10.96.0.4", "fd00:96::4"):
        assert client.names("tcp", host, count=5) == Counter({"refused": 5})
        assert client.names("udp", host, count=2) == Counter({"refused": 2})
        sent = client.call(op="sendto", host=host, port=80, count=2)
        assert [r.get("error") for r in sent] == ["refused", "refused"]
    world.set(service("empty", ("10.96.0.4", "fd00:96::4"), [EPS4[0], EPS6[0]]))
    assert set(client.names("tcp", "10.96.0.4", count=5)) == {EPS4[0]}
    assert set(client.names("tcp", "fd00:96::4", count=5)) == {EPS6[0]}
    world.delete(ServicePortKey("default", "empty", "http", Protocol.TCP))
    assert set(client.names("tcp", "10.96.0.4", count=2)) == {"unreachable"}


def test_node_port_external_ip_and_load_balancer_from_this_node(world: SocketWorld,
                                                                client: Client) -> None:
    world.set(service("np", ("10.96.0.5",), EPS4, internal=EPS4[:2], external=EPS4[2:],
                      node_port=30080, external_ips=("192.168.60.20",)))
    assert set(client.names("tcp", NODE_IP, 30080, count=30)) == set(EPS4[2:])
    assert set(client.names("tcp", "192.168.60.20", count=30)) == set(EPS4[2:])
    assert set(client.names("tcp", "10.96.0.5", count=30)) == set(EPS4[:2])


def test_session_affinity_client_ip(world: SocketWorld, client: Client) -> None:
    from svcproxy.model import SessionAffinity

    sticky = service("sticky", ("10.96.0.6",), EPS4, session_affinity=SessionAffinity.CLIENT_IP,
                     session_affinity_timeout=1)
    world.set(sticky)
    first = client.names("tcp", "10.96.0.6", count=20)
    assert len(first) == 1, f"one client, one endpoint: {first}"
    chosen = next(iter(first))
    # Another endpoint set that still holds the chosen one keeps the client there.
    others = [e for e in EPS4 if e != chosen]
    world.set(replace(sticky, endpoints={ip: e for ip, e in sticky.endpoints.items()
                                         if ip != others[0]}))
    assert set(client.names("tcp", "10.96.0.6", count=10)) == {chosen}
    # The chosen endpoint goes away: the client moves, and sticks again.
    world.set(replace(sticky, endpoints={ip: e for ip, e in sticky.endpoints.items()
                                         if ip != chosen}))
    moved = client.names("tcp", "10.96.0.6", count=10)
    assert len(moved) == 1 and chosen not in moved, moved
    # After the timeout without traffic a new choice is made: over a few rounds it differs.
    picks = set(moved)
    deadline = time.monotonic() + 20
    while len(picks) < 2 and time.monotonic() < deadline:
        time.sleep(1.2)
        picks |= set(client.names("tcp", "10.96.0.6", count=1))
    assert len(picks) >= 2, "after the affinity timeout another endpoint gets chosen"


def test_change_while_connections_are_open(world: SocketWorld, client: Client) -> None:
    world.set(service("live", ("10.96.0.7",), EPS4[:1]))
    assert client.call(op="hold", id="a", host="10.96.0.7", port=80)["name"] == EPS4[0]
    world.set(service("live", ("10.96.0.7",), EPS4[1:2]))
    assert set(client.names("tcp", "10.96.0.7", count=10)) == {EPS4[1]}, "new ones: new set"
    assert client.call(op="ping", id="a")["name"] == EPS4[0], "the open one is untouched"


def _hammer(client: Client, host: str, count: int, out: list[Any]) -> None:
    out.extend(client.connect("tcp", host, count=count))


def test_no_lookup_sees_a_half_updated_service(world: SocketWorld, client: Client) -> None:
    """Connections made while the endpoint set flips back and forth, and while full syncs
    (also by a fresh backend that adopts the maps) run, all reach a current endpoint."""
    a, b = service("flip", ("10.96.0.8",), EPS4[:2]), service("flip", ("10.96.0.8",), EPS4[2:])
    world.set(a)
    results: list[Any] = []
    worker = threading.Thread(target=_hammer, args=(client, "10.96.0.8", 400, results))
    worker.start()
    flips = 0
    while worker.is_alive():
        world.set(b if flips % 2 == 0 else a)
        world.full_sync()
        flips += 1
    worker.join()
    assert flips > 5
    names = Counter(r.get("name") or r["error"] for r in results)
    assert set(names) <= set(EPS4), names
    # A fresh backend (a restart) adopts the maps: its full sync rewrites nothing.
    fresh = EbpfBackend(CONFIG, world.layout).start()
    try:
        fresh.sync(NodeState("node1", 1, None, dict(world.services)),
                   Changes(frozenset(world.services), full=True, reason="initial"))
        assert fresh.last is not None and fresh.last.writes.services_written == 0
        assert fresh.last.writes.slots_written == 0
    finally:
        fresh.close()


def test_a_full_map_fails_the_sync_is_counted_and_heals(world: SocketWorld, client: Client) -> None:
    from prometheus_client import CollectorRegistry

    small = EbpfBackend(CONFIG, replace(world.layout, pin_dir=world.bpffs / "small",
                                        max_services=2)).start()
    registry = CollectorRegistry()
    small.register_metrics(registry)
    records = [service(f"s{i}", (f"10.96.9.{i}",), EPS4[i:i + 1]) for i in range(3)]
    try:
        state = NodeState("node1", 1, None, {r.key: r for r in records})
        with pytest.raises(OSError):
            small.sync(state, Changes(frozenset(state.services), full=True))
        failures = registry.get_sample_value("svcproxy_ebpf_map_update_failures_total",
                                             {"map": "sp_services"})
        assert failures == 1
        fewer = NodeState("node1", 2, None, {r.key: r for r in records[:2]})
        small.sync(fewer, Changes(frozenset(fewer.services), full=True, reason="retry"))
        assert registry.get_sample_value("svcproxy_ebpf_map_entries",
                                         {"map": "sp_services"}) == 2
        assert registry.get_sample_value("svcproxy_ebpf_map_max_entries",
                                         {"map": "sp_services"}) == 2
        assert set(client.names("tcp", "10.96.9.1", count=5)) == {EPS4[1]}
    finally:
        small.cleanup()
    assert not (world.bpffs / "small").exists()


def test_dual_stack_sockets_reach_ipv4_services_through_mapped_addresses(
        world: SocketWorld, client: Client) -> None:
    world.set(service("mapped", ("10.96.0.9",), EPS4[:2]))
    world.set(service("mapped-udp", ("10.96.0.9",), EPS4[2:], proto="UDP"))
    tcp = client.connect("tcp", "::ffff:10.96.0.9", count=20)
    assert {r.get("name") for r in tcp} == set(EPS4[:2]), tcp
    assert {r["peer"] for r in tcp} == {"::ffff:10.96.0.9"}
    udp = client.call(op="sendto", host="::ffff:10.96.0.9", port=80, count=20)
    assert {r.get("name") for r in udp} == set(EPS4[2:]), udp
    assert {tuple(r["from"]) for r in udp} == {("::ffff:10.96.0.9", 80)}

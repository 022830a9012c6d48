"""Drift in the ebpf maps is repaired within one --sync-period: a service entry deleted,
an endpoint slot altered and a foreign entry added behind the backend's back (through
the pinned maps, as bpftool would) are found by the next periodic resync, which
writes only what differs; real connections through the cgroup programs fail before
and succeed after.

The backend runs under the node agent's sync runner (a 1 s period); the test waits for
the periodic sync that started after the tampering, never for a fixed time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest

from svcproxy.backends.ebpf import libbpf
from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.backends.ebpf.layout import ServiceAddress, ServiceValue, ep_key, pack_target
from svcproxy.backends.ebpf.loader import SIZES
from svcproxy.backends.ebpf.names import MAP_ENDPOINTS, MAP_SERVICES
from svcproxy.model import ServicePortState
from svcproxy.sdk import Backend, Changes, NodeState
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.support import ebpf_sockets
from tests.support.ebpf_sockets import EPS4, SocketWorld, service
from tests.support.world_fixture import running

pytestmark = ebpf_sockets.marks()


class Gated(Backend):
    """The ebpf backend as the runner sees it; a periodic sync waits while ``gate`` is
    clear and is counted once it has run."""

    name = "ebpf"

    def __init__(self, inner: EbpfBackend) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.cond = threading.Condition()
        self.started = self.finished = 0

    def sync(self, state: NodeState, changes: Changes) -> None:
        if changes.reason == "periodic":
            self.gate.wait()
            with self.cond:
                self.started += 1
        try:
            self.inner.sync(state, changes)
        finally:
            if changes.reason == "periodic":
                with self.cond:
                    self.finished += 1
                    self.cond.notify_all()

    def hold(self) -> int:
        """Stop periodic syncs from starting; the number that started so far."""
        self.gate.clear()
        with self.cond:
            return self.started

    def next_resync(self, started: int, timeout: float = 30.0) -> None:
        """Let periodic syncs run again and wait until one that started after ``hold``
        has finished."""
        self.gate.set()
        with self.cond:
            assert self.cond.wait_for(lambda: self.finished > started, timeout), (
                "no periodic resync ran")


@pytest.fixture
def world() -> Iterator[SocketWorld]:
    yield from running(SocketWorld())


@pytest.fixture
def periodic(world: SocketWorld) -> Iterator[Callable[..., Gated]]:
    """``periodic(*records)``: the world's backend under the node agent's sync runner
    (a 1 s period) with ``records`` as the node's state, returned once its first
    periodic resync has run; the runner is stopped after the test."""
    runs: list[tuple[SyncRunner, threading.Thread]] = []

    def start(*records: ServicePortState) -> Gated:
        assert world.backend is not None
        source = FakeSource()
        source.push(NodeState("node1", 1, None, {r.key: r for r in records}))
        gated = Gated(world.backend)
        runner = SyncRunner(source, gated, health=ProxyHealth(timeout=60), sync_period=1.0,
                            min_sync_period=0.0, poll=0.05)
        thread = threading.Thread(target=runner.run, daemon=True)
        runs.append((runner, thread))
        thread.start()
        gated.next_resync(gated.hold())
        return gated

    yield start
    for runner, thread in runs:
        runner.stop()
        thread.join(10)


@pytest.fixture
def pinned(world: SocketWorld) -> Iterator[Callable[[str], libbpf.Map]]:
    """``pinned(name)``: a handle of our own on a pinned map (someone else's tool),
    closed after the test."""
    opened: list[libbpf.Map] = []

    def open_map(name: str) -> libbpf.Map:
        key, value = SIZES[name]
        opened.append(libbpf.Map(name, libbpf.obj_get(str(world.layout.map_pin(name))),
                                 key, value))
        return opened[-1]

    yield open_map
    for handle in opened:
        os.close(handle.fd)


def test_map_entries_changed_behind_the_backend_are_repaired_within_one_period(
        world: SocketWorld, periodic: Callable[..., Gated],
        pinned: Callable[[str], libbpf.Map]) -> None:
    client, backend = world.client, world.backend
    assert client is not None and backend is not None
    gated = periodic(service("drift-a", ("10.96.5.1",), EPS4[:2]),
                     service("drift-b", ("10.96.5.2",), EPS4[2:]))
    services, endpoints = pinned(MAP_SERVICES), pinned(MAP_ENDPOINTS)
    assert set(client.names("tcp", "10.96.5.1", count=20)) == set(EPS4[:2])
    assert backend.last is not None and backend.last.writes.services_written == 0
    assert not backend.last_drift, "a resync with nothing changed finds no drift"

    started = gated.hold()
    key_a, key_b = (ServiceAddress(ip, 80, "TCP").pack() for ip in ("10.96.5.1", "10.96.5.2"))
    value_a = services.lookup(key_a)
    assert value_a is not None
    assert services.delete(key_a)
    value_b = services.lookup(key_b)
    assert value_b is not None
    set_b = ServiceValue.unpack(value_b).set_id
    endpoints.update(ep_key(set_b, 0), pack_target(EPS4[2], 9))  # nobody listens on 9
    services.update(ServiceAddress("10.96.5.3", 80, "TCP").pack(), value_a)
    assert set(client.names("tcp", "10.96.5.1", count=5)) == {"unreachable"}
    assert "refused" in client.names("tcp", "10.96.5.2", count=20)
    assert set(client.names("tcp", "10.96.5.3", count=5)) <= set(EPS4[:2])

    gated.next_resync(started)
    assert set(client.names("tcp", "10.96.5.1", count=20)) == set(EPS4[:2])
    assert set(client.names("tcp", "10.96.5.2", count=20)) == set(EPS4[2:])
    assert set(client.names("tcp", "10.96.5.3", count=5)) == {"unreachable"}
    assert backend.drift_repairs == 1
    assert backend.last is not None and backend.last.writes.services_written == 2, (
        "only the two altered services are written again")


def test_a_lost_entry_alone_is_written_again_from_what_was_applied(
        world: SocketWorld, periodic: Callable[..., Gated],
        pinned: Callable[[str], libbpf.Map]) -> None:
    """Nothing foreign, one service entry deleted: the resync repairs that service port
    alone (the SDK's ``Delta.repair``), not a rebuild."""
    client, backend = world.client, world.backend
    assert client is not None and backend is not None
    gated = periodic(service("lost-a", ("10.96.6.1",), EPS4[:2]),
                     service("lost-b", ("10.96.6.2",), EPS4[2:]))
    services = pinned(MAP_SERVICES)
    started = gated.hold()
    assert services.delete(ServiceAddress("10.96.6.1", 80, "TCP").pack())
    assert set(client.names("tcp", "10.96.6.1", count=5)) == {"unreachable"}
    gated.next_resync(started)
    assert set(client.names("tcp", "10.96.6.1", count=20)) == set(EPS4[:2])
    assert backend.last is not None and backend.last.writes.services_written == 1
    assert backend.last_drift and len(backend.last_drift.services) == 1

"""The ebpf backend with real sockets: a client process in a cgroup the test made,
inside a network namespace the test made, connects to service addresses and the
cgroup programs send it to endpoints (echo servers on the namespace's loopback).

Everything made here (namespace, cgroup, bpffs mount, pins, links, processes) is
removed at the end, also when a test fails.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.backends.ebpf.loader import OBJECT, Layout
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Changes, NodeConfig, NodeState
from tests.support.lab.netns import enter
from tests.support.lab.topology import Namespaces, addresses

CGROUP2 = Path("/sys/fs/cgroup/unified")
EPS4 = [f"10.244.0.{i}" for i in range(1, 5)]
EPS6 = [f"fd00:244::{i}" for i in range(1, 5)]
NODE_IP = "192.168.77.10"
PORT = 8080


def _why_not() -> str:
    if os.geteuid() != 0:
        return "needs root"
    if not (CGROUP2 / "cgroup.procs").exists():
        return f"needs cgroup v2 at {CGROUP2}"
    if shutil.which("ip") is None:
        return "needs iproute2"
    if not OBJECT.exists():
        return f"{OBJECT} not built (python -m svcproxy.backends.ebpf.build)"
    return ""


pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]

# The client: a separate process (so it can live in the test cgroup) that takes one
# JSON command per line and answers one JSON line.
CLIENT = r'''
import json, socket, sys
held = {}
def fam(h): return socket.AF_INET6 if ":" in h else socket.AF_INET
def err(e):
    return {"error": {111: "refused", 101: "unreachable", 113: "unreachable"}.get(
        e.errno, "timeout" if isinstance(e, TimeoutError) else str(e))}
def once(c):
    kind = socket.SOCK_STREAM if c["proto"] == "tcp" else socket.SOCK_DGRAM
    with socket.socket(fam(c["host"]), kind) as s:
        s.settimeout(c.get("timeout", 2.0))
        try:
            s.connect((c["host"], c["port"]))
            if kind == socket.SOCK_DGRAM:
                s.send(b"hello\n")
            data = s.recv(2048).decode().split()
            return {"name": data[0], "seen": data[1], "peer": s.getpeername()[0]}
        except OSError as e:
            return err(e)
def sendto(c):
    with socket.socket(fam(c["host"]), socket.SOCK_DGRAM) as s:
        s.settimeout(c.get("timeout", 2.0))
        try:
            s.sendto(b"hello\n", (c["host"], c["port"]))
            data, src = s.recvfrom(2048)
            return {"name": data.decode().split()[0], "from": [src[0], src[1]]}
        except OSError as e:
            return err(e)
def hold(c):
    s = socket.socket(fam(c["host"]), socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect((c["host"], c["port"]))
    held[c["id"]] = s
    return {"name": s.recv(2048).decode().split()[0]}
def ping(c):
    s = held[c["id"]]
    try:
        s.sendall(b"ping\n")
        data = s.recv(2048).decode().split()
        return {"name": data[0] if data else "", "error": "" if data else "closed"}
    except OSError as e:
        return err(e)
for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    if op == "ready":
        out = {"ok": True}
    elif op == "connect":
        out = [once(c) for _ in range(c.get("count", 1))]
    elif op == "sendto":
        out = [sendto(c) for _ in range(c.get("count", 1))]
    elif op == "hold":
        out = hold(c)
    else:
        out = ping(c)
    print(json.dumps(out), flush=True)
'''


class Echo:
    """Servers on every endpoint address: a TCP greeting ``<addr> <peer>``, then echoes
    each line prefixed with ``<addr>``; UDP answers ``<addr> <peer>``."""

    def __init__(self, ns: str, addresses: list[str]) -> None:
        self.ns, self.addresses = ns, addresses
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> Echo:
        self._thread.start()
        assert self._ready.wait(5), "echo servers did not start"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _serve(self) -> None:
        enter(self.ns)
        sel = selectors.DefaultSelector()
        for addr in self.addresses:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(fam, kind)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((addr, PORT))
                if kind == socket.SOCK_STREAM:
                    s.listen(128)
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, ("listen", addr))
        self._ready.set()
        while not self._stop.is_set():
            for key, _ in sel.select(0.1):
                role, addr = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    if role == "listen" and sock.type == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        conn.sendall(f"{addr} {peer[0]}\n".encode())
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ, ("conn", addr))
                    elif role == "listen":
                        _, peer = sock.recvfrom(2048)
                        sock.sendto(f"{addr} {peer[0]}\n".encode(), peer)
                    else:
                        data = sock.recv(2048)
                        if not data:
                            sel.unregister(sock)
                            sock.close()
                        else:
                            sock.sendall(f"{addr} ".encode() + data)
                except OSError:
                    pass
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()


class Client:
    """The client process, moved into ``cgroup`` before it makes any socket."""

    def __init__(self, ns: str, cgroup: Path) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-u", "-c", CLIENT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        (cgroup / "cgroup.procs").write_text(f"{self.proc.pid}\n")
        assert self.call(op="ready") == {"ok": True}

    def call(self, **command: Any) -> Any:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "client process died"
        return json.loads(line)

    def connect(self, proto: str, host: str, port: int = 80, count: int = 1) -> list[dict]:
        return self.call(op="connect", proto=proto, host=host, port=port, count=count)

    def names(self, proto: str, host: str, port: int = 80, count: int = 20) -> Counter[str]:
        return Counter(r.get("name") or r["error"] for r in self.connect(proto, host, port,
                                                                          count))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


CONFIG = NodeConfig(node_name="node1", node_ips=(NODE_IP,))


class World:
    """A namespace, a cgroup, a bpffs mount, echo servers, a client and the backend."""

    def __init__(self, in_process: bool = True) -> None:
        self.in_process = in_process
        self.namespaces = Namespaces()
        self.ns = self.namespaces.ns("ebpf")
        self.cgroup = CGROUP2 / f"svcproxy-test-{self.namespaces.tag}"
        self.bpffs = Path(tempfile.mkdtemp(prefix="spebpf-"))
        self.layout = Layout(pin_dir=self.bpffs / "pins", cgroup=self.cgroup)
        self.echo: Echo | None = None
        self.client: Client | None = None
        self.backend: EbpfBackend | None = None
        self.revision = 0
        self.services: dict[ServicePortKey, ServicePortState] = {}

    def start(self) -> World:
        self.namespaces.add_ns("ebpf")
        addresses(self.ns, "lo", *(f"{addr}/32" for addr in EPS4),
                  *(f"{addr}/128" for addr in EPS6), f"{NODE_IP}/32")
        self.cgroup.mkdir()
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.bpffs)], check=True)
        self.echo = Echo(self.ns, EPS4 + EPS6).start()
        self.client = Client(self.ns, self.cgroup)
        if self.in_process:
            self.backend = EbpfBackend(CONFIG, self.layout).start()
        return self

    def stop(self) -> None:
        for step in (self._stop_backend, self._stop_client, self._stop_echo):
            try:
                step()
            except Exception:  # noqa: BLE001 - keep removing the rest
                pass
        subprocess.run(["umount", str(self.bpffs)], capture_output=True)
        shutil.rmtree(self.bpffs, ignore_errors=True)
        if self.cgroup.exists():
            self.cgroup.rmdir()
        self.namespaces.destroy()

    def _stop_backend(self) -> None:
        if self.backend is not None:
            self.backend.cleanup()
        elif self.layout.pin_dir.exists():
            EbpfBackend(CONFIG, self.layout).cleanup()

    def _stop_client(self) -> None:
        if self.client is not None:
            self.client.stop()

    def _stop_echo(self) -> None:
        if self.echo is not None:
            self.echo.stop()

    def set(self, record: ServicePortState) -> None:
        """Set one service port and sync only it, as a change from the frontend."""
        self.services[record.key] = record
        self._sync(Changes(frozenset({record.key})))

    def delete(self, key: ServicePortKey) -> None:
        self.services.pop(key, None)
        self._sync(Changes(frozenset({key})))

    def full_sync(self) -> None:
        self._sync(Changes(frozenset(self.services), full=True, reason="periodic"))

    def _sync(self, changes: Changes) -> None:
        self.revision += 1
        assert self.backend is not None
        self.backend.sync(NodeState("node1", self.revision, None, dict(self.services)),
                          changes)


def service(name: str, cips: tuple[str, ...], eps: list[str], proto: str = "TCP",
            internal: list[str] | None = None, external: list[str] | None = None,
            **extra: Any) -> ServicePortState:
    """A service port 80 -> 8080 on ``eps``; ``internal``/``external`` narrow the frontend's
    flags (default: every endpoint carries both)."""
    key = ServicePortKey("default", name, "http", Protocol(proto))
    extra.setdefault("has_endpoints", bool(eps))
    svc = ServicePort(key, cluster_ips=cips, port=80, **extra)
    inside = set(eps if internal is None else internal)
    outside = set(eps if external is None else external)
    return ServicePortState(svc, {ip: Endpoint(ip, PORT, internal=ip in inside,
                                               external=ip in outside) for ip in eps})


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World()
    try:
        w.start()
        yield w
    finally:
        w.stop()


@pytest.fixture
def client(world: World) -> Client:
    assert world.client is not None
    return world.client


def test_tcp_cluster_ip_reaches_the_chosen_endpoints(world: World, client: Client) -> None:
    world.set(service("web", ("10.96.0.1",), EPS4[:3]))
    seen = client.names("tcp", "10.96.0.1", count=40)
    assert set(seen) == set(EPS4[:3]), seen
    first = client.connect("tcp", "10.96.0.1")[0]
    assert first["peer"] == "10.96.0.1", "getpeername() shows the service address"


@pytest.mark.parametrize("cip,eps", [("10.96.0.2", EPS4), ("fd00:96::2", EPS6)], ids=["v4", "v6"])
def test_udp_connected_and_unconnected_both_families(world: World, client: Client, cip: str,
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


def test_tcp_ipv6_cluster_ip(world: World, client: Client) -> None:
    world.set(service("web6", ("fd00:96::1",), EPS6[:2]))
    assert set(client.names("tcp", "fd00:96::1", count=30)) == set(EPS6[:2])
    assert client.connect("tcp", "fd00:96::1")[0]["peer"] == "fd00:96::1"


def test_internal_flag_decides_and_no_endpoints_refuse(world: World, client: Client) -> None:
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


def test_node_port_external_ip_and_load_balancer_from_this_node(world: World,
                                                                client: Client) -> None:
    world.set(service("np", ("10.96.0.5",), EPS4, internal=EPS4[:2], external=EPS4[2:],
                      node_port=30080, external_ips=("192.168.60.20",)))
    assert set(client.names("tcp", NODE_IP, 30080, count=30)) == set(EPS4[2:])
    assert set(client.names("tcp", "192.168.60.20", count=30)) == set(EPS4[2:])
    assert set(client.names("tcp", "10.96.0.5", count=30)) == set(EPS4[:2])


def test_session_affinity_client_ip(world: World, client: Client) -> None:
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


def test_change_while_connections_are_open(world: World, client: Client) -> None:
    world.set(service("live", ("10.96.0.7",), EPS4[:1]))
    assert client.call(op="hold", id="a", host="10.96.0.7", port=80)["name"] == EPS4[0]
    world.set(service("live", ("10.96.0.7",), EPS4[1:2]))
    assert set(client.names("tcp", "10.96.0.7", count=10)) == {EPS4[1]}, "new ones: new set"
    assert client.call(op="ping", id="a")["name"] == EPS4[0], "the open one is untouched"


def _hammer(client: Client, host: str, count: int, out: list[Any]) -> None:
    out.extend(client.connect("tcp", host, count=count))


def test_no_lookup_sees_a_half_updated_service(world: World, client: Client) -> None:
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


def test_a_full_map_fails_the_sync_is_counted_and_heals(world: World, client: Client) -> None:
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
        world: World, client: Client) -> None:
    world.set(service("mapped", ("10.96.0.9",), EPS4[:2]))
    world.set(service("mapped-udp", ("10.96.0.9",), EPS4[2:], proto="UDP"))
    tcp = client.connect("tcp", "::ffff:10.96.0.9", count=20)
    assert {r.get("name") for r in tcp} == set(EPS4[:2]), tcp
    assert {r["peer"] for r in tcp} == {"::ffff:10.96.0.9"}
    udp = client.call(op="sendto", host="::ffff:10.96.0.9", port=80, count=20)
    assert {r.get("name") for r in udp} == set(EPS4[2:]), udp
    assert {tuple(r["from"]) for r in udp} == {("::ffff:10.96.0.9", 80)}

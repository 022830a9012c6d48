"""Connection tracking of the tc packet path with real packets in the two-node lab:
flows idle past their state's lifetime are new flows (and the GC pass removes them),
the GC keeps every live flow among 100,000, an open TCP connection keeps its endpoint,
and ClientIP affinity holds across a service's addresses.

Ages are made by writing a flow's last-seen time back in the map (as time passing
would), never by waiting (but for the clock to have run as long as the age since boot,
on a machine booted minutes ago: tests/support/boot_clock.py): every assertion follows
packets or map contents.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf.ct_gc import (
    CTS_FIN_FWD,
    CTS_FIN_REV,
    CTS_REPLIED,
    CtTimeouts,
    gc_pass,
)
from svcproxy.backends.ebpf.libbpf import Map
from svcproxy.backends.ebpf.names import TC_MAP_AFFINITY, TC_MAP_CT
from svcproxy.backends.ebpf.packet_layout import CT_FORWARD, CT_KEY, CT_REPLY, CT_SNAT, CT_VAL
from svcproxy.model import (
    ServicePortState,
    SessionAffinity,
)
from tests.support import packet_path
from tests.support.boot_clock import NS, clock_past, stamp_aged
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import call_in, enter
from tests.support.packet_path import CLIENT, NODE1, World, node_port

pytestmark = packet_path.marks("ip", "nft")

TIMEOUTS = CtTimeouts()  # what the World's backend runs with
LONG_PORT = 9090


def _v4(ip: str) -> bytes:
    return socket.inet_aton(ip) + bytes(12)


class LineEcho:
    """A TCP server in a pod that keeps each connection and answers every line with
    ``<pod> <line>``; closes its side when the client closes."""

    def __init__(self, ns: str, name: str) -> None:
        self.ns, self.name = ns, name
        self.ready = threading.Event()
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> LineEcho:
        self.thread.start()
        assert self.ready.wait(5)
        return self

    def _serve(self) -> None:
        enter(self.ns)
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("0.0.0.0", LONG_PORT))
            listener.listen(16)
            listener.settimeout(0.2)
            self.ready.set()
            while not self.stop_flag.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(120)
            try:
                for line in conn.makefile("rb"):
                    conn.sendall(f"{self.name} ".encode() + line)
            except OSError:
                pass

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(5)


def long_service(name: str, port: int, pods: list[str]) -> ServicePortState:
    """A NodePort ``port`` -> LineEcho's port on ``pods``."""
    return node_port(name, port, pods, subnet=2, target=LONG_PORT)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World("spct-")
    servers: list[LineEcho] = []
    try:
        w.start()
        for pod in ("pod-a", "pod-c"):
            servers.append(LineEcho(w.lab.ns(pod), pod).start())
        yield w
    finally:
        for server in servers:
            server.stop()
        w.stop()


def _ct(world: World) -> Map:
    assert world.backend is not None and world.backend.programs is not None
    return world.backend.programs.maps[TC_MAP_CT]


def _forward_key(sport: int, port: int, proto: int) -> bytes:
    return CT_KEY.pack(_v4(CLIENT.ipv4), _v4(NODE1.ipv4), sport.to_bytes(2, "big"),
                       port.to_bytes(2, "big"), proto, 4, CT_FORWARD, 0)


def _reply_key(key: bytes, value: bytes) -> bytes:
    *_, proto, family, _d, _p = CT_KEY.unpack(key)
    saddr, daddr, sport, dport, *_ = CT_VAL.unpack(value)
    return CT_KEY.pack(daddr, saddr, dport, sport, proto, family, CT_REPLY, 0)


def _rewrite(ct: Map, key: bytes, *, age_s: float = 0.0, endpoint: str = "") -> None:
    """Set a flow's last-seen time ``age_s`` in the past (and its endpoint)."""
    value = ct.lookup(key)
    assert value is not None, "the flow is tracked"
    saddr, daddr, sport, dport, flags, state, set_id, _last = CT_VAL.unpack(value)
    if endpoint:
        daddr = _v4(endpoint)
    ct.update(key, CT_VAL.pack(saddr, daddr, sport, dport, flags, state, set_id,
                               stamp_aged(age_s)))


def _state(ct: Map, key: bytes) -> int:
    value = ct.lookup(key)
    assert value is not None
    return CT_VAL.unpack(value)[5]


# How long the GC test waits for one reply: generous, as it asserts that no flow is lost,
# not how fast a loaded machine answers.
REPLY_BOUND = 30.0


def _udp(ns: str, sport: int, port: int) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.settimeout(1)
        s.bind((CLIENT.ipv4, sport))
        s.connect((NODE1.ipv4, port))
        return s

    return call_in(ns, make)


def _ask(sock: socket.socket) -> str:
    sock.send(b"ping\n")
    try:
        return sock.recv(256).decode().split()[0]
    except TimeoutError:
        return "timeout"


def test_an_idle_udp_flow_is_a_new_flow_and_the_gc_removes_it(world: World) -> None:
    world.set(node_port("idle", 30121, ["pod-a", "pod-c"], proto="UDP"))
    ct = _ct(world)
    key = _forward_key(46100, 30121, socket.IPPROTO_UDP)
    with _udp(world.lab.ns(CLIENT.name), 46100, 30121) as sock:
        first = _ask(sock)
        assert first in ("pod-a", "pod-c")
        assert _state(ct, key) & CTS_REPLIED, "the endpoint's answer was seen"
        # While the flow lives, its entry decides: pointed at an address nobody has,
        # the flow's next datagram goes nowhere.
        _rewrite(ct, key, endpoint="10.244.99.99")
        assert _ask(sock) == "timeout", "a live flow keeps its (here: broken) endpoint"
        # Idle past the answered-UDP lifetime (120 s): the next datagram is a new flow.
        _rewrite(ct, key, age_s=TIMEOUTS.udp_stream + 1, endpoint="10.244.99.99")
        assert _ask(sock) in ("pod-a", "pod-c"), "an expired flow gets a fresh choice"
        # And the GC pass removes an expired flow, both its entries.
        value = ct.lookup(key)
        assert value is not None
        reply = _reply_key(key, value)
        _rewrite(ct, key, age_s=TIMEOUTS.udp_stream + 1)
        result = gc_pass(ct, TIMEOUTS)
        assert ct.lookup(key) is None and ct.lookup(reply) is None, result
        assert result.expired >= 2
        assert _ask(sock) in ("pod-a", "pod-c"), "after the GC: a new flow, answered"


def test_an_open_tcp_connection_keeps_its_endpoint(world: World) -> None:
    """Past the SYN lifetime, through GC passes and service changes, and even when its
    endpoint leaves the service (kube-proxy leaves open TCP to its timeouts); closed by
    both sides, its entry is the 10 s close state's and the GC removes it."""
    pods = ["pod-a", "pod-c"]
    world.set(long_service("long", 30120, pods))
    ct = _ct(world)
    client = world.lab.ns(CLIENT.name)

    def connect() -> socket.socket:
        s = socket.socket()
        s.settimeout(3)
        s.bind((CLIENT.ipv4, 47100))
        s.connect((NODE1.ipv4, 30120))
        return s

    sock = call_in(client, connect)
    lines = sock.makefile("rb")
    key = _forward_key(47100, 30120, socket.IPPROTO_TCP)

    def ask(n: int) -> str:
        sock.sendall(f"{n}\n".encode())
        name, seq = lines.readline().decode().split()
        assert seq == str(n)
        return name

    try:
        first = ask(1)
        assert _state(ct, key) & CTS_REPLIED, "established: the endpoint answered"
        _rewrite(ct, key, age_s=TIMEOUTS.udp_stream + 1)  # past SYN's (and UDP's), not established
        gc_pass(ct, TIMEOUTS)
        assert ct.lookup(key) is not None, "an established flow outlives the SYN lifetime"
        assert ask(2) == first
        world.set(long_service("long", 30120, [*pods, "pod-b"]))
        assert ask(3) == first, "a change that keeps its endpoint"
        world.set(long_service("long", 30120, [p for p in pods if p != first]))
        assert ask(4) == first, "its endpoint left the service: the open connection stays"
        gc_pass(ct, TIMEOUTS)
        assert ask(5) == first
    finally:
        lines.close()
        sock.close()
    # Both FINs pass through the program (the server closes when the client does).
    deadline = time.monotonic() + 10
    both = CTS_FIN_FWD | CTS_FIN_REV
    while _state(ct, key) & both != both and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(ct, key) & both == both, "the close is tracked"
    _rewrite(ct, key, age_s=TIMEOUTS.tcp_fin + 1)
    gc_pass(ct, TIMEOUTS)
    assert ct.lookup(key) is None, "a closed connection's flow goes after 10 s idle"


def _line(ns: str, source: tuple[str, int], host: str, port: int) -> str:
    """One connection from ``source`` in ``ns``: the pod that answers a line (or how it
    failed), closed by both sides."""
    def talk() -> str:
        with socket.socket() as s:
            s.settimeout(REPLY_BOUND)
            s.bind(source)
            try:
                s.connect((host, port))
                s.sendall(b"1\n")
                return s.makefile("rb").readline().decode().split()[0]
            except OSError as err:
                return type(err).__name__

    return call_in(ns, talk)


def test_a_closed_flows_entry_leaves_another_connection_on_its_tuple_alone(
        world: World) -> None:
    """A connection that does not come through the service (the node's own, or one
    balanced at connect()) made on the tuple a closed, still-tracked flow used gets its
    replies unchanged: the closed flow's entry no longer reverses them (it did, sending the
    endpoint's SYN-ACK back to that flow's client: the connection never opened)."""
    world.set(long_service("reused", 30126, ["pod-a"]))
    ct = _ct(world)
    key = _forward_key(47200, 30126, socket.IPPROTO_TCP)
    assert _line(world.lab.ns(CLIENT.name), (CLIENT.ipv4, 47200), NODE1.ipv4, 30126) == "pod-a"
    both = CTS_FIN_FWD | CTS_FIN_REV
    deadline = time.monotonic() + 10
    while _state(ct, key) & both != both and time.monotonic() < deadline:
        time.sleep(0.05)
    value = ct.lookup(key)
    assert value is not None
    snat, endpoint, nat_port, port, flags, state, *_ = CT_VAL.unpack(value)
    assert flags & CT_SNAT and state & both == both, "a NodePort flow, SNATed and closed"
    source = (socket.inet_ntoa(snat[:4]), int.from_bytes(nat_port, "big"))
    node = world.lab.ns(NODE1.name)
    assert _line(node, source, socket.inet_ntoa(endpoint[:4]),
                 int.from_bytes(port, "big")) == "pod-a", \
        "the node's own connection from the flow's NAT address and port opens"
    assert ct.lookup(key) is not None, "the closed flow's entry is left to the GC"
    _rewrite(ct, key, age_s=TIMEOUTS.tcp_fin + 1)
    gc_pass(ct, TIMEOUTS)
    assert ct.lookup(key) is None, "and the GC removes it"


# The pass over the synthetic flows runs with the lifetimes scaled down (established
# 24 h and close-wait 1 h would need a machine up for a day): the ages fit in a machine's
# first five minutes, and each kind's age still lies between two lifetimes, so a kind
# judged by any other state's lifetime is kept or removed wrongly.
GC_TIMEOUTS = CtTimeouts(tcp_syn=60, tcp_established=400, tcp_close_wait=200, tcp_fin=10,
                         udp=30, udp_stream=120)
# (proto, state, idle seconds, alive) of the synthetic flows, in turn.
KINDS = (
    (socket.IPPROTO_TCP, CTS_REPLIED, 300, True),  # established, 400 s
    (socket.IPPROTO_TCP, 0, 90, False),  # SYN only, 60 s
    (socket.IPPROTO_UDP, CTS_REPLIED, 90, True),  # answered UDP, 120 s
    (socket.IPPROTO_UDP, 0, 40, False),  # unanswered UDP, 30 s
    (socket.IPPROTO_TCP, CTS_REPLIED | CTS_FIN_FWD | CTS_FIN_REV, 20, False),  # closed, 10 s
    (socket.IPPROTO_TCP, CTS_REPLIED | CTS_FIN_FWD, 150, True),  # close-wait, 200 s
)
SVC = _v4("192.168.99.1")
SNAT = _v4("192.168.99.2")


def _synthetic(count: int, now: int) -> tuple[dict[bytes, bytes], set[bytes]]:
    """``count`` flows as forward + reply entries, and the keys that must stay."""
    entries: dict[bytes, bytes] = {}
    alive: set[bytes] = set()
    pack_key, pack_val = CT_KEY.pack, CT_VAL.pack
    for i in range(count):
        proto, state, idle, live = KINDS[i % len(KINDS)]
        client = bytes((10, 200 + (i >> 16), (i >> 8) & 255, i & 255)) + bytes(12)
        endpoint = bytes((10, 240 + (i >> 16), (i >> 8) & 255, i & 255)) + bytes(12)
        cport, nport = (40000).to_bytes(2, "big"), (32768 + i % 32768).to_bytes(2, "big")
        sport, eport = (80).to_bytes(2, "big"), (8080).to_bytes(2, "big")
        last = now - idle * NS
        fwd = pack_key(client, SVC, cport, sport, proto, 4, CT_FORWARD, 0)
        rep = pack_key(endpoint, SNAT, eport, nport, proto, 4, CT_REPLY, 0)
        entries[fwd] = pack_val(SNAT, endpoint, nport, eport, CT_SNAT, state, 1, last)
        entries[rep] = pack_val(SVC, client, sport, cport, CT_SNAT, 0, 0, last)
        if live:
            alive.update((fwd, rep))
    return entries, alive


def test_gc_under_100000_flows_keeps_every_live_flow(world: World) -> None:
    world.set(long_service("gc-long", 30123, ["pod-c"]))
    world.set(node_port("gc-udp", 30124, ["pod-a", "pod-c"], proto="UDP"))
    ct = _ct(world)
    client = world.lab.ns(CLIENT.name)

    def connect() -> socket.socket:
        s = socket.socket()
        s.settimeout(REPLY_BOUND)
        s.connect((NODE1.ipv4, 30123))
        return s

    tcp = call_in(client, connect)
    lines = tcp.makefile("rb")
    udp = _udp(client, 46200, 30124)
    udp.settimeout(REPLY_BOUND)  # a lost flow's reply never comes; a slow one still counts
    keys: list[bytes] = []
    try:
        tcp.sendall(b"0\n")
        assert lines.readline().split()[0] == b"pod-c"
        udp_first = _ask(udp)
        began = time.monotonic()
        entries, alive = _synthetic(100_000, clock_past(max(k[2] for k in KINDS)))
        keys = list(entries)
        ct.update_many(keys, [entries[k] for k in keys])
        held = ct.read_all()
        print(f"filled {len(keys)} entries in {time.monotonic() - began:.2f} s")
        assert all(held.get(k) == v for k, v in entries.items()), "all 100,000 flows held"
        stop = threading.Event()
        answers: Counter[str] = Counter()

        def traffic() -> None:  # real flows keep passing while the GC runs
            n = 1
            while not stop.is_set():
                try:
                    tcp.sendall(f"{n}\n".encode())
                    answers[(lines.readline().split() or [b"closed"])[0].decode()] += 1
                except OSError as err:
                    answers[f"tcp {err}"] += 1
                answers[_ask(udp)] += 1
                n += 1

        runner = threading.Thread(target=traffic)
        runner.start()
        try:
            result = gc_pass(ct, GC_TIMEOUTS)
        finally:
            stop.set()
            runner.join(2 * REPLY_BOUND)
        assert not runner.is_alive(), "the traffic thread ended"
        after = ct.read_all()
        lost = [k for k in alive if after.get(k) != entries[k]]
        assert not lost, f"{len(lost)} live entries lost or changed"
        gone = [k for k in entries if k not in alive and k in after]
        assert not gone, f"{len(gone)} expired entries left"
        assert result.expired == len(entries) - len(alive)
        assert result.flows >= len(alive) // 2 + 2
        assert set(answers) == {"pod-c", udp_first}, answers
        print(f"GC pass over {len(held)} entries: {result.expired} removed, "
              f"{result.flows} flows kept, {result.seconds:.2f} s")
    finally:
        lines.close()
        tcp.close()
        udp.close()
        ct.delete_many(keys)


def test_affinity_holds_across_the_services_addresses(world: World) -> None:
    """A client that reached endpoint A through the ClusterIP lands on A through the
    NodePort and the externalIP of the same service (kube-proxy's per-service affinity)."""
    pods = ["pod-a", "pod-b", "pod-c", "pod-d"]
    world.set(node_port("aff", 30122, pods, cip="10.96.7.50", external_ips=("192.168.60.20",),
                        session_affinity=SessionAffinity.CLIENT_IP,
                        session_affinity_timeout=10800))
    assert world.backend is not None and world.backend.programs is not None
    affinity = world.backend.programs.maps[TC_MAP_AFFINITY]
    client = world.lab.ns(CLIENT.name)
    for _round in range(3):
        affinity.delete_many([k for k, _ in affinity.items()])
        first = summarize(probe(client, "tcp", "10.96.7.50", 80, 1)).names
        assert len(first) == 1, first
        chosen = next(iter(first))
        for host, port in ((NODE1.ipv4, 30122), ("192.168.60.20", 80), ("10.96.7.50", 80)):
            got = summarize(probe(client, "tcp", host, port, 3))
            assert got.names == Counter({chosen: 3}), (host, port, chosen, got)


def test_gc_metrics(world: World) -> None:
    """The backend's GC (what its thread runs) counts passes, removed entries and flows."""
    from prometheus_client import CollectorRegistry, generate_latest

    world.set(node_port("gc-metrics", 30125, ["pod-c"], proto="UDP"))
    ct = _ct(world)
    with _udp(world.lab.ns(CLIENT.name), 46300, 30125) as sock:
        assert _ask(sock) == "pod-c"
    _rewrite(ct, _forward_key(46300, 30125, socket.IPPROTO_UDP), age_s=TIMEOUTS.udp_stream + 1)
    assert world.backend is not None and world.backend.ct_gc is not None
    world.backend.ct_gc.run_once()
    registry = CollectorRegistry()
    world.backend.register_metrics(registry)
    values = {line.split()[0]: float(line.split()[1])
              for line in generate_latest(registry).decode().splitlines()
              if line.startswith("svcproxy_ebpf_tc_ct_")}
    assert values["svcproxy_ebpf_tc_ct_gc_runs_total"] >= 1, values
    assert values["svcproxy_ebpf_tc_ct_gc_expired_entries_total"] >= 2, values
    assert values["svcproxy_ebpf_tc_ct_flows"] == world.backend.ct_gc.last.flows, values

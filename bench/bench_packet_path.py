"""NodePort forwarding through the two-node lab: ``--ebpf-packet-path bpf`` (tc), the same
with ``--ebpf-xdp generic`` in front, and nft, side by side.

Run as root. Builds the test lab (tests/support/lab/topology.py: a LAN client, node1, node2 with
pods), loads ``--services`` filler services (a ClusterIP, an externalIP and one endpoint
each) plus the NodePort measured, whose one endpoint (pod-c) is on node2: every
connection is DNATed and SNATed on node1 and its replies reversed. For each size, each
dataplane is loaded in node1 in turn and the client opens ``--connects`` new TCP
connections (connect, read the greeting, close) per round; printed per dataplane: new
connections per second and the connect() latency (SYN to SYN/ACK through node1: the
first packet's path) p50/p99, then ``--datagrams`` UDP requests and answers on one
tracked flow (packets of an established flow), as the median over rounds. The Python
client and echo server set the floor, so the figures compare dataplanes, not absolute
speeds. The client's and pod-c's veths send whole checksums for every dataplane (XDP
needs them: tests/support/lab/checksums.py).

Usage: .venv/bin/python bench/bench_packet_path.py [--sizes 100,10000] [--connects 500]
       [--datagrams 2000] [--rounds 4] [--dataplanes tc,xdp,nft]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svcproxy.backends.ebpf.packet_backend import PacketBackend  # noqa: E402
from svcproxy.backends.ebpf.packet_loader import OBJECT, PacketLayout  # noqa: E402
from svcproxy.backends.nft.apply import NftRunner  # noqa: E402
from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.model import (  # noqa: E402
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk import Backend, Changes, NodeConfig, NodeState  # noqa: E402
from tests.support.lab.checksums import tx_checksums_off  # noqa: E402
from tests.support.lab.echo import EchoServer  # noqa: E402
from tests.support.lab.netns import call_in  # noqa: E402
from tests.support.lab.plan import standard_spec  # noqa: E402
from tests.support.lab.topology import Lab  # noqa: E402

SPEC = standard_spec()
NODE1, CLIENT, POD = SPEC.node("node1"), SPEC.clients[0], SPEC.pod("pod-c")
NODE_PORT = 30080


def services(count: int) -> dict[ServicePortKey, ServicePortState]:
    """``count`` fillers and the measured NodePort (TCP and UDP), all to pod-c (on node2)."""
    out = {}
    ep = {POD.ipv4: Endpoint(POD.ipv4, 8080, node_name="node2", internal=True,
                             external=True, cluster=True)}
    for i in range(count):
        key = ServicePortKey("bench", f"s{i}", "p", Protocol.TCP)
        out[key] = ServicePortState(ServicePort(
            key, cluster_ips=(f"10.96.{i >> 8 & 255}.{i & 255}",), port=80,
            external_ips=(f"172.{16 + (i >> 16)}.{i >> 8 & 255}.{i & 255}",),
            has_endpoints=True), ep)
    for proto in (Protocol.TCP, Protocol.UDP):
        key = ServicePortKey("bench", "np", "p", proto)
        out[key] = ServicePortState(ServicePort(key, type=ServiceType.NODE_PORT,
                                                cluster_ips=("10.97.0.1",), port=80,
                                                node_port=NODE_PORT, has_endpoints=True), ep)
    return out


def connect_loop(count: int) -> tuple[float, list[float]]:
    """(elapsed seconds, connect() latencies in microseconds) of ``count`` connections."""
    latencies = []
    start = time.perf_counter()
    for _ in range(count):
        with socket.socket() as s:
            s.settimeout(5)
            t0 = time.perf_counter()
            s.connect((NODE1.ipv4, NODE_PORT))
            latencies.append((time.perf_counter() - t0) * 1e6)
            while s.recv(256):
                pass
    return time.perf_counter() - start, latencies


def datagram_loop(count: int) -> float:
    """Seconds for ``count`` UDP requests and answers on one connected socket."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.connect((NODE1.ipv4, NODE_PORT))
        s.send(b"ping\n")
        s.recv(256)
        start = time.perf_counter()
        for _ in range(count):
            s.send(b"ping\n")
            s.recv(256)
        return time.perf_counter() - start


def measure(lab: Lab, connects: int, datagrams: int) -> tuple[float, float, float, float]:
    """(connections per second, connect() p50, p99 in microseconds, UDP round trips per
    second) of one round."""
    call_in(lab.ns(CLIENT.name), connect_loop, 20)  # warm: neighbours, caches
    elapsed, lat = call_in(lab.ns(CLIENT.name), connect_loop, connects)
    lat.sort()
    udp = datagrams / call_in(lab.ns(CLIENT.name), datagram_loop, datagrams)
    return connects / elapsed, lat[len(lat) // 2], lat[int(len(lat) * 0.99)], udp


def make(name: str, config: NodeConfig, fs: Path, lab: Lab, obj: Path) -> Backend:
    if name in ("tc", "xdp"):
        return PacketBackend(config, PacketLayout(fs / "pins", ("eth0",), object_path=obj,
                                                  xdp="generic" if name == "xdp" else "off"))
    return NftBackend(config, NftRunner(("ip", "netns", "exec", lab.ns("node1"))),
                      families=(4,))


def run(lab: Lab, backend: Backend, state: NodeState) -> None:
    call_in(lab.ns("node1"), backend.sync, state, Changes(frozenset(state.services),
                                                          full=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--connects", type=int, default=500)
    parser.add_argument("--datagrams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dataplanes", default="tc,xdp,nft")
    parser.add_argument("--object", type=Path, default=OBJECT,
                        help="the tc/XDP object to load (default: the built one)")
    args = parser.parse_args()
    names = args.dataplanes.split(",")
    lab = Lab(spec=SPEC)
    fs = Path(tempfile.mkdtemp(prefix="spbench-tc-"))
    server = None
    mounted = False
    config = NodeConfig(node_name="node1", node_ips=(NODE1.ipv4,))
    try:
        lab.build()
        for ns in (CLIENT.name, "pod-c"):
            tx_checksums_off(lab.ns(ns))
        server = EchoServer(lab.ns("pod-c"), "pod-c", (8080,)).start()
        subprocess.run(["mount", "-t", "bpf", "bpf", str(fs)], check=True)
        mounted = True
        print(f"{'services':>9} {'dataplane':>10} {'conn/s':>8} {'connect p50 us':>15} "
              f"{'p99 us':>8} {'udp rtt/s':>10} {'load s':>7}")
        for size in (int(s) for s in args.sizes.split(",")):
            state = NodeState("node1", 1, None, services(size))
            results: dict[str, list[tuple[float, ...]]] = {name: [] for name in names}
            for round_ in range(args.rounds):
                # Rotate which goes first, so load drift hits all alike.
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    backend = make(name, config, fs, lab, args.object)
                    t0 = time.perf_counter()
                    run(lab, backend, state)
                    loaded = time.perf_counter() - t0
                    try:
                        results[name].append((*measure(lab, args.connects, args.datagrams),
                                              loaded))
                    finally:
                        call_in(lab.ns("node1"), backend.cleanup)
            for name, rows in results.items():
                rate, p50, p99, udp, loaded = (statistics.median(col)
                                               for col in zip(*rows, strict=True))
                print(f"{size:>9} {name:>10} {rate:>8.0f} {p50:>15.0f} {p99:>8.0f} "
                      f"{udp:>10.0f} {loaded:>7.1f}", flush=True)
    finally:
        if server is not None:
            server.stop()
        if mounted:
            subprocess.run(["umount", str(fs)], capture_output=True)
        shutil.rmtree(fs, ignore_errors=True)
        lab.destroy()


if __name__ == "__main__":
    main()

"""Kernel memory of the packet path's maps (``--ebpf-packet-path bpf``) at ``--services``
NodePort services x ``--endpoints`` endpoints and ``--flows`` tracked flows.

Run as root. Makes a network namespace with a veth holding the node IP, mounts
a bpffs in a temporary directory, loads and attaches the tc programs there, syncs the
services (each a ClusterIP and a NodePort: two service entries, two endpoint sets), then
writes ``--flows`` flows to endpoints on another node into the connection tracking map as
the program writes them (a forward and a reply entry each). Each map's memory is what
the kernel accounts for it (``memlock`` in /proc/self/fdinfo, the map's own estimate of
its usage since Linux 6.4). Then ``--changes`` single changes (one service's endpoint
replaced: a new set, the switch, the old set deleted), each a sync of its own, timed
(wall clock, p50 and p99). Everything is removed at the end.

Usage: sudo .venv/bin/python bench/bench_packet_maps_memory.py [--services 10000]
       [--endpoints 10] [--flows 100000] [--changes 200] [--maglev]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svcproxy.backends.ebpf.names import TC_MAP_CT, TC_MAPS  # noqa: E402
from svcproxy.backends.ebpf.packet_backend import PacketBackend  # noqa: E402
from svcproxy.backends.ebpf.packet_layout import CT_FORWARD, CT_KEY, CT_REPLY, CT_SNAT, CT_VAL  # noqa: E402
from svcproxy.backends.ebpf.packet_loader import PacketLayout  # noqa: E402
from svcproxy.model import (  # noqa: E402
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk import Changes, NodeConfig, NodeState  # noqa: E402
from tests.support.lab.netns import call_in  # noqa: E402

NODE_IP = "10.0.0.1"


def services(count: int, endpoints: int, maglev: bool) -> dict[ServicePortKey, ServicePortState]:
    out = {}
    for i in range(count):
        key = ServicePortKey("bench", f"s{i}", "p", Protocol.TCP)
        eps = {}
        for e in range(endpoints):
            ip = f"10.{64 + (i >> 12)}.{i >> 4 & 255}.{(i & 15) * 16 + e}"
            eps[ip] = Endpoint(ip, 8080, node_name="node2", internal=True, external=True,
                               cluster=True)
        options = (("svcproxy.io/lb-algorithm", "maglev"),) if maglev else ()
        out[key] = ServicePortState(ServicePort(
            key, type=ServiceType.NODE_PORT, cluster_ips=(f"10.96.{i >> 8 & 255}.{i & 255}",),
            port=80, node_port=30000 + i % 2768 if i < 2768 else 0, has_endpoints=True,
            options=options), eps)
    return out


def flows(count: int) -> tuple[list[bytes], list[bytes]]:
    """``count`` SNATed flows (client -> NodePort, endpoint -> node), both entries each."""
    keys, values = [], []
    node = socket.inet_aton(NODE_IP) + bytes(12)
    for i in range(count):
        client = bytes([192, 168, i >> 8 & 255, i & 255]) + bytes(12)
        ep = bytes([10, 64, i >> 8 & 255, i & 255]) + bytes(12)
        sport, nport = (1024 + i % 60000).to_bytes(2, "big"), (32768 + i % 32768).to_bytes(2, "big")
        vip_port, ep_port = (30000).to_bytes(2, "big"), (8080).to_bytes(2, "big")
        keys.append(CT_KEY.pack(client, node, sport, vip_port, 6, 4, CT_FORWARD, 0))
        values.append(CT_VAL.pack(node, ep, nport, ep_port, CT_SNAT, 1, 1, 1))
        keys.append(CT_KEY.pack(ep, node, ep_port, nport, 6, 4, CT_REPLY, 0))
        values.append(CT_VAL.pack(node, client, vip_port, sport, CT_SNAT, 0, 0, 1))
    return keys, values


def one_change(backend: PacketBackend, state: NodeState, i: int) -> float:
    """Replace the first endpoint of service ``i`` with a new address; seconds the sync
    took."""
    services = dict(state.services)
    key = sorted(services)[i * 7919 % len(services)]
    record = services[key]
    first = sorted(record.endpoints)[0]
    ip = f"10.200.{i >> 8 & 255}.{i & 255}"
    eps = {k: v for k, v in record.endpoints.items() if k != first}
    eps[ip] = Endpoint(ip, 8080, node_name="node2", internal=True, external=True,
                       cluster=True)
    services[key] = ServicePortState(record.service, eps)
    changed = NodeState("node1", state.revision + 1 + i, None, services)
    start = time.perf_counter()
    backend.sync(changed, Changes(frozenset({key})))
    return time.perf_counter() - start


def memlock(fd: int) -> int:
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("memlock:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--flows", type=int, default=100000)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--maglev", action="store_true")
    args = parser.parse_args()
    ns = f"spmem{os.getpid()}"
    bpffs = Path(tempfile.mkdtemp(prefix="spmem-"))
    subprocess.run(["ip", "netns", "add", ns], check=True)
    mounted = False
    backend = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "node0", "type", "veth", "peer", "name",
                        "peer0"], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", f"{NODE_IP}/24", "dev", "node0"],
                       check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "node0", "up"], check=True)
        subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
        mounted = True
        config = NodeConfig(node_name="node1", node_ips=(NODE_IP,))
        backend = PacketBackend(config, PacketLayout(bpffs / "pins", ("node0",)))
        state = NodeState("node1", 1, None, services(args.services, args.endpoints,
                                                     args.maglev))
        start = time.process_time()
        call_in(ns, backend.sync, state, Changes(frozenset(state.services), full=True))
        loaded = time.process_time() - start
        assert backend.programs is not None
        keys, values = flows(args.flows)
        backend.programs.maps[TC_MAP_CT].update_many(keys, values)
        total = 0
        print(f"{args.services} services x {args.endpoints} endpoints"
              f"{' (maglev)' if args.maglev else ''}, {args.flows} flows "
              f"({len(keys)} CT entries); sync {loaded:.1f} s CPU")
        for name in TC_MAPS:
            used = memlock(backend.programs.maps[name].fd)
            total += used
            print(f"  {name:16} {used / 2**20:9.1f} MiB")
        print(f"  {'total':16} {total / 2**20:9.1f} MiB")
        took = [call_in(ns, one_change, backend, state, i) for i in range(args.changes)]
        if took:
            took.sort()
            print(f"{len(took)} changes (one endpoint replaced each): p50 "
                  f"{took[len(took) // 2] * 1e3:.2f} ms, p99 "
                  f"{took[min(len(took) - 1, len(took) * 99 // 100)] * 1e3:.2f} ms")
    finally:
        if backend is not None:
            call_in(ns, backend.cleanup)
        if mounted:
            subprocess.run(["umount", str(bpffs)], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        bpffs.rmdir()


if __name__ == "__main__":
    main()

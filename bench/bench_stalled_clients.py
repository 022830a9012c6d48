"""Stalled clients: many Watch streams that never read, and unary calls meanwhile.

    .venv/bin/python bench/bench_stalled_clients.py [--services 2000] [--endpoints 10]
        [--nodes 100] [--streams 1000] [--connections 1000] [--unary 300] [--compare]

The frontend (engine + grpc.aio server, as in production) runs in this process with a
synthetic cluster. A client process opens ``--streams`` Watch streams spread over the
nodes and ``--connections`` TCP connections, with small receive windows (no bandwidth
probing, 64 KiB) so that gRPC flow control stops each stream as early as it can, and
never reads. Another process calls GetNodeState ``--unary`` times (one call every 20 ms,
random nodes, gRPC's default limits) before and while the streams stall. Prints:

- the frontend's RSS idle (cluster loaded, every node's view made, no client) and its peak
  while the streams stall (VmHWM, reset before they open), and the ratio (goal <= 2x);
- GetNodeState latency p50 / p99 idle and while the streams stall (goal p99 < 100 ms).

With ``--compare`` the same is then run with the previous behaviour (every stream's
whole snapshot encoded up front in 1 MiB messages), side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.snapshots import Snapshots
from svcproxy.frontend.publication.wire import MESSAGE_BYTES, chunk_events
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.frontend.serving.server import NodeStateServicer, start_server
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).parent))
from bench_frontend import make_cluster, pct  # noqa: E402

SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]


def _status(pid: int, field: str) -> float:
    """A /proc/PID/status field in MB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _reset_peak() -> None:
    """Start VmHWM over from the current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def stall_process(target: str, nodes: list[str], connections: int, conn: Any) -> None:
    """Open a stream per entry of ``nodes`` over ``connections`` connections; read
    nothing after the first message's headers; close them when told."""
    async def main() -> None:
        channels = [grpc.aio.insecure_channel(target, options=SMALL_WINDOW + [
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(connections)]
        calls = []
        for i, node in enumerate(nodes):
            stub = pb_grpc.NodeStateServiceStub(channels[i % connections])
            calls.append(stub.Watch(pb.WatchRequest(node_name=node)))
        await asyncio.gather(*(c.initial_metadata() for c in calls))
        conn.send("open")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        for c in calls:
            c.cancel()
        for ch in channels:
            await ch.close()
        conn.send("closed")

    asyncio.run(main())


def unary_process(target: str, nodes: list[str], calls: int, conn: Any) -> None:
    """Time ``calls`` GetNodeState calls (one every 20 ms) each time it is asked."""
    api = pb_grpc.NodeStateServiceStub(grpc.insecure_channel(target))
    api.GetNodeState(pb.GetNodeStateRequest(node_name=nodes[0]))
    while conn.recv() == "go":
        took = []
        for _ in range(calls):
            start = time.perf_counter()
            api.GetNodeState(pb.GetNodeStateRequest(node_name=random.choice(nodes)),
                             timeout=30)
            took.append(time.perf_counter() - start)
            time.sleep(0.02)
        conn.send(took)


def eager_snapshots() -> None:
    """The behaviour before: every message of a snapshot encoded up front, 1 MiB each."""
    def snapshot(self: Snapshots, view: Any, reset: bool = False) -> list[bytes]:
        return list(chunk_events(self.changelog.revision, self.snapshot_ops(view), reset=reset,
                                 limit=1 << 20))
    Snapshots.snapshot = snapshot  # type: ignore[method-assign]


async def measure(args: argparse.Namespace, target: str, unary: Any,
                  nodes: list[str]) -> tuple[float, float, list[float], list[float]]:
    """(idle RSS, peak RSS while stalled, unary latencies idle, while stalled)."""
    loop = asyncio.get_running_loop()
    gc.collect()
    await asyncio.sleep(1)
    idle = _status(os.getpid(), "VmRSS")
    unary.send("go")
    idle_calls = await loop.run_in_executor(None, unary.recv)
    _reset_peak()
    parent, child = mp.Pipe()
    names = [nodes[i % len(nodes)] for i in range(args.streams)]
    proc = mp.Process(target=stall_process, daemon=True,
                      args=(target, names, min(args.connections, args.streams), child))
    t0 = time.perf_counter()
    proc.start()
    await loop.run_in_executor(None, parent.recv)
    print(f"  {args.streams} streams open and not reading after "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    unary.send("go")
    stalled_calls = await loop.run_in_executor(None, unary.recv)
    await asyncio.sleep(1)
    peak = _status(os.getpid(), "VmHWM")
    parent.send("close")
    await loop.run_in_executor(None, parent.recv)
    proc.join(10)
    return idle, peak, idle_calls, stalled_calls


def report(name: str, idle: float, peak: float, idle_calls: list[float],
           stalled_calls: list[float]) -> None:
    ms = [1000 * pct(c, q) for c in (idle_calls, stalled_calls) for q in (0.5, 0.99)]
    print(f"{name}: RSS idle {idle:.0f} MB, peak with the streams stalled {peak:.0f} MB "
          f"({peak / idle:.2f}x idle); GetNodeState p50 / p99 idle {ms[0]:.1f} / {ms[1]:.1f}"
          f" ms, with the streams stalled {ms[2]:.1f} / {ms[3]:.1f} ms", flush=True)


async def run(args: argparse.Namespace) -> None:
    engine = Engine()
    engine.loop = asyncio.get_running_loop()
    limits = StreamLimits(max_streams=args.streams * 2, max_streams_per_peer=args.streams * 2,
                          write_timeout=3600)
    server, port = await start_server(engine, "127.0.0.1:0",
                                      servicer=NodeStateServicer(engine, limits))
    target = f"127.0.0.1:{port}"
    t0 = time.perf_counter()
    engine.submit(make_cluster(args.services, args.endpoints, args.nodes))
    snapshot = sum(len(m) for m in engine.snapshots.snapshot(engine.changelog.view("n1")))
    print(f"cluster: {args.services} services x {args.endpoints} endpoints, {args.nodes} "
          f"nodes, loaded in {time.perf_counter() - t0:.1f} s; one node's snapshot "
          f"{snapshot / 1e6:.2f} MB", flush=True)
    nodes = [f"n{i}" for i in range(args.nodes)]
    # Every node's view made first, as in a cluster whose nodes watch (a view is made on a
    # node's first watch): the idle RSS holds the state the streams then watch, and the
    # ratio is what the stalled clients add (without it, the views count as theirs).
    for node in nodes:
        engine.changelog.view(node)
    unary, child = mp.Pipe()
    uproc = mp.Process(target=unary_process, daemon=True,
                       args=(target, nodes, args.unary, child))
    uproc.start()
    print(f"{args.streams} streams over {min(args.connections, args.streams)} connections; "
          f"{args.unary} GetNodeState calls per phase", flush=True)
    report(f"bounded (encoded as written, {MESSAGE_BYTES >> 10} KiB messages)",
           *await measure(args, target, unary, nodes))
    if args.compare:
        eager_snapshots()
        report("before (whole snapshot encoded up front, 1 MiB messages)",
               *await measure(args, target, unary, nodes))
    unary.send("stop")
    uproc.join(5)
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=2000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=1000,
                        help="TCP connections the streams are spread over (default: one "
                        "each, as nodes would)")
    parser.add_argument("--unary", type=int, default=300,
                        help="GetNodeState calls timed per phase")
    parser.add_argument("--compare", action="store_true",
                        help="then the same with the previous behaviour, side by side")
    args = parser.parse_args()
    mp.set_start_method("spawn")
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

"""Frontend benchmark: a synthetic cluster, many watching clients, one change at a time.

    .venv/bin/python bench/bench_frontend.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--clients 1000] [--changes 100] [--client-procs 2]
        [--stream-workers 1]

The frontend (engine + grpc.aio server, plus ``--stream-workers`` - 1 worker processes)
runs as in production, on TCP loopback. Clients are grpc.aio streams with the SDK's
channel options, each on its own TCP connection as each node would be, in
``--client-procs`` separate processes, spread
over the nodes; they keep messages as raw bytes except the revision, like a backend
that applies ops lazily. Prints:

- initial load of the cluster into the engine;
- one node's initial snapshot: time to the last byte at a client, and its size;
- latency from an EndpointSlice change to each client having it (p50, p99), and to
  every client having it (p50, p99 over changes);
- frontend CPU time per change; full garbage collections meanwhile; frontend peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import logging
import math
import multiprocessing as mp
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.frontend.serving.server import NodeStateServicer, start_server
from svcproxy.frontend.serving.workers import StreamWorkers
from svcproxy.frontend.sources.events import Replace, Upsert
from svcproxy.sdk.client import CHANNEL_OPTIONS
from svcproxy.v1 import nodestate_pb2 as pb


def _ip(i: int, base: int) -> str:
    return f"{base}.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def make_slice(s: int, endpoints: int, nodes: int, flip: int = -1) -> dict[str, Any]:
    eps = []
    for e in range(endpoints):
        n = (s * endpoints + e) % nodes
        eps.append({"addresses": [_ip(s * endpoints + e, 10)], "nodeName": f"n{n}",
                    "zone": f"z{n % 3}", "conditions": {"ready": e != flip}})
    return {"kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"s{s}-x", "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": f"s{s}"}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps}


def make_cluster(services: int, endpoints: int, nodes: int) -> list[Any]:
    svcs = [{"kind": "Service", "metadata": {"name": f"s{s}", "namespace": "bench"},
             "spec": {"clusterIP": _ip(s, 100), "ports": [
                 {"name": "http", "port": 80, "targetPort": 8080}]}} for s in range(services)]
    node_objs = [{"kind": "Node", "metadata": {"name": f"n{n}", "labels": {
        "topology.kubernetes.io/zone": f"z{n % 3}"}}} for n in range(nodes)]
    return [Replace("Service", svcs),
            Replace("EndpointSlice", [make_slice(s, endpoints, nodes)
                                      for s in range(services)]),
            Replace("Node", node_objs)]


# The SDK's channel options: among them, each client its own TCP connection, as each
# node has (gRPC would otherwise share one between the channels of a process).
CLIENT_OPTIONS = CHANNEL_OPTIONS


def _revision(data: bytes) -> tuple[int, bool]:
    """(revision, more) of a serialised WatchEvent without parsing its ops."""
    rev, shift, i = 0, 0, 1
    while True:
        b = data[i]
        rev |= (b & 0x7F) << shift
        i += 1
        shift += 7
        if b < 0x80:
            break
    more = b"\x18\x01" in data[i:i + 4]
    return rev, more


async def _client(target: str, node: str, since: int, got: dict[int, float],
                  ready: Any, options: list[tuple[str, int]]) -> None:
    async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS + options) as ch:
        call = ch.unary_stream("/svcproxy.v1.NodeStateService/Watch",
                               request_serializer=pb.WatchRequest.SerializeToString,
                               response_deserializer=lambda b: b)(
            pb.WatchRequest(node_name=node, since_revision=since))
        first = True
        async for data in call:
            rev, more = _revision(data)
            if more:
                continue
            if first:
                first = False
                ready()
                continue
            got.setdefault(rev, time.time())


def client_process(target: str, nodes: list[str], since: int, conn: Any,
                   idle: bool, options: list[tuple[str, int]]) -> None:
    """Run streams for ``nodes`` resuming at ``since`` (they already hold the state);
    report readiness once each got a first batch, then receive times per revision.
    With ``idle`` the process runs SCHED_IDLE: it gets only CPU the frontend leaves."""
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    got: list[dict[int, float]] = [{} for _ in nodes]
    left = [len(nodes)]

    def ready() -> None:
        left[0] -= 1
        if left[0] == 0:
            conn.send("ready")

    async def main() -> None:
        tasks = [asyncio.create_task(_client(target, n, since, got[i], ready, options))
                 for i, n in enumerate(nodes)]
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        for t in tasks:
            t.cancel()
        conn.send(got)

    asyncio.run(main())


def _first_at_or_after(batches: list[tuple[int, float]], rev: int) -> float:
    """When a client got its first batch of revision ``rev`` or later (inf: never)."""
    i = bisect.bisect_left(batches, (rev, -math.inf))
    return batches[i][1] if i < len(batches) else math.inf


def _cpu_seconds(pid: int | None, stat: str = "") -> float:
    """CPU seconds of process ``pid`` (or of the stat file ``stat``)."""
    text = Path(stat or f"/proc/{pid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu() -> Counter[str]:
    """CPU seconds of this process's threads, by thread name."""
    out: Counter[str] = Counter()
    for tid in os.listdir("/proc/self/task"):
        name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        out[name] += _cpu_seconds(None, f"/proc/self/task/{tid}/stat")
    return out


def _rss_mb(pid: int | None) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class FullCollections:
    """A gc callback: how many full collections ran, and for how long."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._start


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(args: argparse.Namespace) -> None:
    engine = Engine()
    engine.loop = asyncio.get_running_loop()
    # Every client connects from 127.0.0.1: the caps must let them all in.
    servicer = NodeStateServicer(engine, StreamLimits(
        max_streams=2 * args.clients, max_streams_per_peer=2 * args.clients))
    server, port = await start_server(engine, args.listen, servicer=servicer)
    target = args.listen if args.listen.startswith("unix:") else f"127.0.0.1:{port}"
    workers = StreamWorkers(engine, args.stream_workers, target, None, logging.WARNING,
                            servicer=servicer)
    workers.start()
    t0 = time.perf_counter()
    engine.submit(make_cluster(args.services, args.endpoints, args.nodes))
    print(f"cluster: {args.services} services x {args.endpoints} endpoints "
          f"({args.services * args.endpoints} endpoints), {args.nodes} nodes; "
          f"loaded in {time.perf_counter() - t0:.2f} s", flush=True)

    loop = asyncio.get_running_loop()
    for attempt in ("cold", "warm"):
        t0 = time.perf_counter()
        size = 0
        async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as ch:
            call = ch.unary_stream("/svcproxy.v1.NodeStateService/Watch",
                                   request_serializer=pb.WatchRequest.SerializeToString,
                                   response_deserializer=lambda b: b)(
                pb.WatchRequest(node_name="n1" if attempt == "cold" else "n2"))
            async for data in call:
                size += len(data)
                if not _revision(data)[1]:
                    break
            call.cancel()
        print(f"snapshot of one node ({attempt}): {time.perf_counter() - t0:.3f} s, "
              f"{size / 1e6:.1f} MB", flush=True)

    procs, conns = [], []
    names = [f"n{i % args.nodes}" for i in range(args.clients)]
    t0 = time.perf_counter()
    # The clients stand for nodes that already hold their state: their views exist (a
    # view is made on a node's first watch, and a client resuming into a view made after
    # its revision gets a reset and a full snapshot - 1,000 of 4.4 MB at 10,000 services).
    for name in sorted(set(names)):
        engine.changelog.view(name)
    for p in range(args.client_procs):
        parent, child = mp.Pipe()
        proc = mp.Process(target=client_process, daemon=True,
                          args=(target, names[p::args.client_procs],
                                engine.changelog.revision, child,
                                args.client_sched == "idle", args.client_option))
        proc.start()
        procs.append(proc)
        conns.append(parent)
    warmup = 0
    for c in conns:
        while not c.poll(0):
            # Warm-up changes until every stream has delivered one batch.
            engine.submit([Upsert("EndpointSlice", make_slice(
                args.services - 1, args.endpoints, args.nodes, flip=warmup % 2))])
            warmup += 1
            await asyncio.sleep(0.5)
        c.recv()
    print(f"{args.clients} clients watching (resumed at the current revision: they already "
          f"hold the state) after {time.perf_counter() - t0:.1f} s, "
          f"{args.client_procs} client processes", flush=True)

    sent: dict[int, float] = {}
    pauses = FullCollections()
    gc.callbacks.append(pauses)
    cpu0 = time.process_time()
    worker_cpu0 = sum(_cpu_seconds(pid) for pid in workers.pids)
    client_cpu0 = sum(_cpu_seconds(p.pid) for p in procs)
    threads0 = _thread_cpu()
    for i in range(args.changes):
        s = (i * 7919) % args.services
        sent_at = time.time()
        engine.submit([Upsert("EndpointSlice", make_slice(s, args.endpoints, args.nodes,
                                                          flip=i % args.endpoints))])
        sent[engine.changelog.revision] = sent_at
        await asyncio.sleep(args.interval)
    cpu = time.process_time() - cpu0
    gc.callbacks.remove(pauses)
    worker_cpu = sum(_cpu_seconds(pid) for pid in workers.pids) - worker_cpu0
    client_cpu = sum(_cpu_seconds(p.pid) for p in procs) - client_cpu0
    threads = _thread_cpu()
    threads.subtract(threads0)
    await asyncio.sleep(1)
    for c in conns:
        c.send("stop")
    results: list[list[dict[int, float]]] = [await loop.run_in_executor(None, c.recv)
                                             for c in conns]
    per_client, to_all = [], []
    # A client that fell behind gets several changes in one batch (coalesced): it has a
    # change from the first batch at or after its revision.
    received = [sorted(got.items()) for r in results for got in r]
    for rev, at in sent.items():
        times = [_first_at_or_after(batches, rev) - at for batches in received]
        times = [t for t in times if t != math.inf]
        missing = args.clients - len(times)
        if missing:
            print(f"revision {rev}: {missing} clients never got it", flush=True)
        per_client += times
        to_all.append(max(times))
    print(f"change -> client latency over {len(per_client)} deliveries: "
          f"p50 {1000 * pct(per_client, 0.5):.1f} ms, p99 {1000 * pct(per_client, 0.99):.1f} ms")
    print(f"change -> every client: p50 {1000 * pct(to_all, 0.5):.1f} ms, "
          f"p90 {1000 * pct(to_all, 0.9):.1f} ms, p99 {1000 * pct(to_all, 0.99):.1f} ms "
          f"over {len(to_all)} changes")
    print(f"frontend CPU per change (compute + fan-out): {1000 * cpu / args.changes:.1f} ms "
          f"in the main process, {1000 * worker_cpu / args.changes:.1f} ms in "
          f"{args.stream_workers - 1} stream workers")
    print(f"clients' CPU per change (receiving it on {args.clients} streams, same machine): "
          f"{1000 * client_cpu / args.changes:.1f} ms")
    print("  main process by thread (ms per change): " + ", ".join(
        f"{name} {1000 * v / args.changes:.1f}" for name, v in threads.most_common() if v > 0))
    print(f"full garbage collections in the main process during the changes: {pauses.count}"
          f" ({1000 * pauses.seconds:.0f} ms in all)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_rss = sum(_rss_mb(pid) for pid in workers.pids)
    print(f"frontend peak RSS: {rss:.0f} MB main process, stream workers now {worker_rss:.0f} "
          f"MB in all", flush=True)
    for p in procs:
        p.join(5)
    await workers.stop()
    await server.stop(0)


def _channel_option(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    return name, int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--client-procs", type=int, default=2,
                        help="processes the clients are spread over (default: one per "
                        "core of this 2-core machine; the README also gives 4)")
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--client-sched", choices=("normal", "idle"), default="normal",
                        help="idle: client processes run SCHED_IDLE, standing in for nodes "
                        "on other machines (they never take CPU the frontend wants)")
    parser.add_argument("--client-option", type=_channel_option, action="append", default=[],
                        metavar="NAME=INT", help="a gRPC channel option for the clients on "
                        "top of the SDK's, e.g. grpc.http2.bdp_probe=1 (repeatable)")
    parser.add_argument("--listen", default="127.0.0.1:0",
                        help="where the frontend listens (unix:///path for a unix socket)")
    parser.add_argument("--stream-workers", type=int, default=1,
                        help="processes serving streams, as the frontend's --stream-workers")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="seconds between changes")
    args = parser.parse_args()
    mp.set_start_method("spawn")
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

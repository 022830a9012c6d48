"""One careless client calling GetNodeState / ListNodes in a tight loop, and what the
others see meanwhile.

    .venv/bin/python bench/bench_unary_flood.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--flooders 2] [--seconds 8] [--rounds 2]
        [--qps 5] [--burst 20]

The frontend (engine + grpc.aio server, as in production) runs in this process with a
synthetic cluster, listening on both loopback families. ``--flooders`` processes call
GetNodeState (every page of a random node) and ListNodes in a tight loop from 127.0.0.1,
reading every answer: one client address, several connections. Well-behaved clients
connect from ::1, another address: a Watch of node n1 (the time from each change to
its batch's last message) and a GetNodeState of node n2 every 500 ms (its latency:
each is a new listing, since the state changed since the last; ~80 ms of CPU).
One EndpointSlice change that reaches n1 is handed to the loop every 100 ms from a
thread, as a source's reflector does (the Watch latency counts from the hand-over).

Three phases, alternating (ABC CBA ...): **quiet** (no flooder), **flood** (no limit,
as before --unary-qps-per-peer), **limited** (the flooders' address limited to
``--qps`` calls per second, ``--burst``). Each prints the frontend's CPU (share of one
core), the event loop's lag (a 10 ms timer's delay, p99), the Watch delivery latency
p50 / p99, the well-behaved GetNodeState p50 / p99, and the flooders' answered and
refused calls per second; then the medians per phase and their ratios to quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.limits import StreamLimits, UnaryRates
from svcproxy.frontend.serving.server import NodeStateServicer, start_server
from svcproxy.frontend.sources.events import Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).parent))
from bench_frontend import CLIENT_OPTIONS, _revision, make_cluster, make_slice, pct  # noqa: E402

BIG = [("grpc.max_receive_message_length", 64 << 20)]
PHASES = ("quiet", "flood", "limited")


def flood_process(target: str, nodes: list[str], go: Any, stop: Any, conn: Any) -> None:
    """Call GetNodeState (every page) and ListNodes as fast as answers come, while
    ``go`` is set; report (answered, refused) calls when asked."""
    api = pb_grpc.NodeStateServiceStub(grpc.insecure_channel(target, options=BIG))
    done = refused = 0
    while not stop.is_set():
        if conn.poll():
            conn.recv()
            conn.send((done, refused))
            done = refused = 0
        if not go.wait(0.1):
            continue
        token, node = "", random.choice(nodes)
        try:
            while True:
                page = api.GetNodeState(pb.GetNodeStateRequest(node_name=node,
                                                               page_token=token), timeout=30)
                done += 1
                token = page.next_page_token
                if not token:
                    break
            api.ListNodes(pb.ListNodesRequest(), timeout=30)
            done += 1
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            refused += 1


def watch_process(target: str, conn: Any) -> None:
    """Watch n1; the receive time of each batch's last message, by revision, on ask."""
    async def main() -> None:
        got: dict[int, float] = {}
        async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as ch:
            call = ch.unary_stream("/svcproxy.v1.NodeStateService/Watch",
                                   request_serializer=pb.WatchRequest.SerializeToString,
                                   response_deserializer=lambda b: b)(
                pb.WatchRequest(node_name="n1"))

            async def read() -> None:
                async for data in call:
                    rev, more = _revision(data)
                    if not more:
                        got.setdefault(rev, time.time())
            reader = asyncio.ensure_future(read())
            loop = asyncio.get_running_loop()
            while await loop.run_in_executor(None, conn.recv) == "take":
                conn.send(dict(got))
                got.clear()
            reader.cancel()

    asyncio.run(main())


def unary_process(target: str, go: Any, stop: Any, conn: Any) -> None:
    """Time a GetNodeState of n2 (first page) every 500 ms while ``go`` is set."""
    api = pb_grpc.NodeStateServiceStub(grpc.insecure_channel(target, options=BIG))
    took: list[float] = []
    while not stop.is_set():
        if conn.poll():
            conn.recv()
            conn.send(took)
            took = []
        if not go.is_set():
            time.sleep(0.05)
            continue
        start = time.perf_counter()
        api.GetNodeState(pb.GetNodeStateRequest(node_name="n2"), timeout=60)
        took.append(time.perf_counter() - start)
        time.sleep(0.5)


async def ask(conn: Any) -> Any:
    """A client process's report (the frontend's loop goes on meanwhile)."""
    conn.send("take")
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


async def loop_lag(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(0.01)
        lags.append(loop.time() - start - 0.01)


async def phase(name: str, args: argparse.Namespace, engine: Engine,
                servicer: NodeStateServicer, flooders: list[Any], watcher: Any,
                unary: Any, flood_go: Any, good_go: Any) -> dict[str, float]:
    servicer.rates = UnaryRates(args.qps if name == "limited" else 0, args.burst)
    await ask(watcher)
    load0 = os.getloadavg()[0]
    if name != "quiet":
        flood_go.set()
    await asyncio.sleep(1)  # the flood under way
    for conn in flooders:
        await ask(conn)
    good_go.set()
    lags: list[float] = []
    stop = asyncio.Event()
    lag_task = asyncio.ensure_future(loop_lag(lags, stop))
    made: dict[int, float] = {}
    loop = asyncio.get_running_loop()

    def apply(flip: int, asked: float) -> None:
        engine.submit([Upsert("EndpointSlice", make_slice(0, args.endpoints, args.nodes,
                                                          flip))])
        made[engine.changelog.revision] = asked

    def changes() -> None:
        """As a source's thread hands changes to the loop: timed from the hand-over."""
        for n in range(int(args.seconds * 10)):
            loop.call_soon_threadsafe(apply, (n + 1) % args.endpoints, time.time())
            time.sleep(0.1)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await loop.run_in_executor(None, changes)
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    good_go.clear()
    flood_go.clear()
    stop.set()
    await lag_task
    calls = await ask(unary)
    flood = [await ask(conn) for conn in flooders]
    await asyncio.sleep(2)  # batches still on their way
    got = await ask(watcher)
    # A change is delivered with the first batch at its revision or later (a client
    # behind gets several changes coalesced into one batch).
    seen = sorted(got.items())
    delays = [min(at for rev, at in seen if rev >= r) - t for r, t in made.items()
              if seen and seen[-1][0] >= r]
    missing = len(made) - len(delays)
    done, refused = (sum(f[i] for f in flood) / args.seconds for i in (0, 1))
    out = {"cpu": cpu, "lag99": 1000 * pct(lags, 0.99),
           "watch50": 1000 * pct(delays, 0.5) if delays else float("nan"),
           "watch99": 1000 * pct(delays, 0.99) if delays else float("nan"),
           "get50": 1000 * pct(calls, 0.5) if calls else float("nan"),
           "get99": 1000 * pct(calls, 0.99) if calls else float("nan"),
           "flood": done, "refused": refused, "load": (load0 + os.getloadavg()[0]) / 2}
    print(f"  {name:8s} frontend CPU {out['cpu']:.2f} core, loop lag p99 "
          f"{out['lag99']:.0f} ms; Watch {out['watch50']:.0f} / {out['watch99']:.0f} ms "
          f"({len(delays)} changes, {missing} not delivered); GetNodeState {out['get50']:.0f} / "
          f"{out['get99']:.0f} ms ({len(calls)} calls); flood {done:.1f} answered, "
          f"{refused:.1f} refused /s; load {out['load']:.1f}", flush=True)
    return out


async def run(args: argparse.Namespace) -> None:
    engine = Engine()
    engine.loop = asyncio.get_running_loop()
    servicer = NodeStateServicer(engine, StreamLimits())
    server, port = await start_server(engine, "[::]:0", servicer=servicer)
    t0 = time.perf_counter()
    engine.submit(make_cluster(args.services, args.endpoints, args.nodes))
    nodes = [f"n{i}" for i in range(args.nodes)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=BIG) as ch:
        first = await pb_grpc.NodeStateServiceStub(ch).GetNodeState(
            pb.GetNodeStateRequest(node_name="n2"))
    print(f"cluster: {args.services} services x {args.endpoints} endpoints, {args.nodes} "
          f"nodes, loaded in {time.perf_counter() - t0:.1f} s; a GetNodeState page "
          f"{first.ByteSize() / 1e6:.2f} MB", flush=True)
    stop, flood_go, good_go = mp.Event(), mp.Event(), mp.Event()
    procs, flooders = [], []
    for _ in range(args.flooders):
        ours, theirs = mp.Pipe()
        flooders.append(ours)
        procs.append(mp.Process(target=flood_process, daemon=True, args=(
            f"127.0.0.1:{port}", nodes, flood_go, stop, theirs)))
    watcher, theirs = mp.Pipe()
    procs.append(mp.Process(target=watch_process, daemon=True,
                            args=(f"[::1]:{port}", theirs)))
    unary, theirs2 = mp.Pipe()
    procs.append(mp.Process(target=unary_process, daemon=True,
                            args=(f"[::1]:{port}", good_go, stop, theirs2)))
    for p in procs:
        p.start()
    await asyncio.sleep(3)
    print(f"{args.flooders} flooders from 127.0.0.1; a watcher and a GetNodeState caller "
          f"from ::1; limited: --unary-qps-per-peer {args.qps:g} --unary-burst-per-peer "
          f"{args.burst}", flush=True)
    results: dict[str, list[dict[str, float]]] = {p: [] for p in PHASES}
    for r in range(args.rounds):
        for name in PHASES if r % 2 == 0 else PHASES[::-1]:
            results[name].append(await phase(name, args, engine, servicer, flooders,
                                             watcher, unary, flood_go, good_go))
    print("medians (ratio to quiet):")
    quiet = {k: statistics.median(o[k] for o in results["quiet"]) for k in results["quiet"][0]}
    for name in PHASES:
        med = {k: statistics.median(o[k] for o in results[name]) for k in quiet}
        print(f"  {name:8s} " + ", ".join(
            f"{k} {med[k]:.2f}" + (f" ({med[k] / quiet[k]:.1f}x)" if quiet[k] > 0 else "")
            for k in ("cpu", "lag99", "watch50", "watch99", "get50", "get99")) +
            f"; flood {med['flood']:.1f} answered / {med['refused']:.1f} refused per s",
            flush=True)
    stop.set()
    watcher.send("stop")
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--flooders", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--qps", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=20)
    args = parser.parse_args()
    mp.set_start_method("spawn")
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

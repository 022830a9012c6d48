"""Reconnect storm: a frontend (re)started, every node watching from 0 at once.

    .venv/bin/python bench/bench_reconnect_storm.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--clients 1000] [--client-procs 2] [--timeout 300]

A fresh frontend (engine + grpc.aio server, as in production, on TCP loopback) holds a
synthetic cluster and no node views yet, as after a restart. Then ``--clients``
streams, in ``--client-procs`` separate processes, each on its own TCP connection with
the SDK's channel options, Watch from revision 0 at the same instant, keeping messages
as raw bytes. Each behaves as the SDK's watch loop (``NodeStateClient._run``): a new
channel per attempt; after a failed attempt it waits 0.1 s, doubling up to
``--max-backoff`` (the SDK's default 5 s), back to 0.1 s after an attempt that received
something; it is done at its first complete batch (a message with more=false). Prints:

- time from the storm's start until each client has its snapshot (p50, p90, max);
- attempts that failed, by status code, and how long they took;
- bytes the clients received (in all, and in attempts that failed);
- the frontend's CPU time and RSS (before, peak) during the storm; load average.

After ``--timeout`` seconds the clients that have no snapshot are reported.
``--server-option`` adds a gRPC server option to the frontend's, e.g.
grpc.server_max_unrequested_time_in_server=300 (gRPC cancels a call the server has not
picked up within that many seconds, 30 by default: under a storm, clients see CANCELLED).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import resource
import sys
import time
from collections import Counter
from typing import Any

import grpc
from bench_frontend import _channel_option, _revision, _rss_mb, make_cluster, pct

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.frontend.serving.server import NodeStateServicer, start_server
from svcproxy.sdk.client import CHANNEL_OPTIONS
from svcproxy.v1 import nodestate_pb2 as pb


class Outcome:
    """One client's storm: when it got its snapshot (None: never), its failed attempts
    as (status code, seconds), bytes received, and bytes received by failed attempts."""

    def __init__(self) -> None:
        self.done: float | None = None
        self.failed: list[tuple[str, float]] = []
        self.received = 0
        self.wasted = 0


async def _attempt(target: str, node: str, out: Outcome) -> tuple[str | None, bool]:
    """One Watch from 0: (None, True) once a complete batch arrived, else (status code,
    whether anything was received)."""
    got = 0
    try:
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
            call = ch.unary_stream("/svcproxy.v1.NodeStateService/Watch",
                                   request_serializer=pb.WatchRequest.SerializeToString,
                                   response_deserializer=lambda b: b)(
                pb.WatchRequest(node_name=node, since_revision=0))
            async for data in call:
                got += len(data)
                out.received += len(data)
                if not _revision(data)[1]:
                    call.cancel()
                    return None, True
            code = "ended without a complete batch"
    except grpc.aio.AioRpcError as err:
        code = err.code().name
    out.wasted += got
    return code, got > 0


async def _client(target: str, node: str, max_backoff: float, out: Outcome) -> None:
    backoff = 0.1
    while True:
        start = time.time()
        code, connected = await _attempt(target, node, out)
        if code is None:
            out.done = time.time()
            return
        out.failed.append((code, time.time() - start))
        if connected:
            backoff = 0.1
        await asyncio.sleep(backoff)
        backoff = min(max_backoff, backoff * 2)


def client_process(target: str, nodes: list[str], max_backoff: float, conn: Any) -> None:
    """Run the clients for ``nodes`` from the "go" message until each has its snapshot
    or "stop" arrives; send back [(done, failed, received, wasted)] per client."""
    outs = [Outcome() for _ in nodes]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn.send("ready")
        await loop.run_in_executor(None, conn.recv)
        tasks = [asyncio.create_task(_client(target, n, max_backoff, outs[i]))
                 for i, n in enumerate(nodes)]
        stop = loop.run_in_executor(None, conn.recv)
        everyone = asyncio.gather(*tasks)
        await asyncio.wait([stop, everyone], return_when=asyncio.FIRST_COMPLETED)
        conn.send("done")
        await stop
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        conn.send([(o.done, o.failed, o.received, o.wasted) for o in outs])

    asyncio.run(main())


async def _sample_rss(peak: list[float]) -> None:
    while True:
        peak[0] = max(peak[0], _rss_mb(os.getpid()))
        await asyncio.sleep(0.2)


def _with_server_options(extra: list[tuple[str, int]]) -> None:
    """Make grpc.aio.server (as serve_api calls it) add ``extra`` to its options."""
    server = grpc.aio.server

    def patched(*args: Any, options: Any = (), **kwargs: Any) -> grpc.aio.Server:
        return server(*args, options=[*options, *extra], **kwargs)

    grpc.aio.server = patched


async def run(args: argparse.Namespace) -> None:
    if args.server_option:
        _with_server_options(args.server_option)
        print(f"server options added: {args.server_option}", flush=True)
    engine = Engine()
    engine.loop = asyncio.get_running_loop()
    # Every client connects from 127.0.0.1: the caps must let them all in.
    servicer = NodeStateServicer(engine, StreamLimits(
        max_streams=2 * args.clients, max_streams_per_peer=2 * args.clients))
    server, port = await start_server(engine, "127.0.0.1:0", servicer=servicer)
    target = f"127.0.0.1:{port}"
    t0 = time.perf_counter()
    engine.submit(make_cluster(args.services, args.endpoints, args.nodes))
    print(f"cluster: {args.services} services x {args.endpoints} endpoints, {args.nodes} "
          f"nodes; loaded in {time.perf_counter() - t0:.2f} s", flush=True)

    loop = asyncio.get_running_loop()
    names = [f"n{i % args.nodes}" for i in range(args.clients)]
    procs, conns = [], []
    for p in range(args.client_procs):
        parent, child = mp.Pipe()
        proc = mp.Process(target=client_process, daemon=True,
                          args=(target, names[p::args.client_procs], args.max_backoff, child))
        proc.start()
        procs.append(proc)
        conns.append(parent)
    for c in conns:
        await loop.run_in_executor(None, c.recv)
    rss0 = _rss_mb(os.getpid())
    peak = [rss0]
    sampler = asyncio.create_task(_sample_rss(peak))
    load0 = os.getloadavg()
    cpu0 = time.process_time()
    start = time.time()
    for c in conns:
        c.send("go")
    deadline = time.perf_counter() + args.timeout
    for c in conns:
        while not c.poll(0) and time.perf_counter() < deadline:
            await asyncio.sleep(0.2)
    cpu = time.process_time() - cpu0
    elapsed = time.time() - start
    load1 = os.getloadavg()
    sampler.cancel()
    for c in conns:
        c.send("stop")
    results: list[Any] = []
    for c in conns:
        while True:
            msg = await loop.run_in_executor(None, c.recv)
            if msg != "done":
                break
        results += msg
    for p in procs:
        p.join(5)
    await server.stop(0)

    times = [done - start for done, *_ in results if done is not None]
    missing = len(results) - len(times)
    print(f"storm: {args.clients} clients in {args.client_procs} processes, Watch from 0 "
          f"at once; SDK backoff 0.1 s doubling to {args.max_backoff:g} s")
    if times:
        print(f"time to snapshot: p50 {pct(times, 0.5):.1f} s, p90 {pct(times, 0.9):.1f} s, "
              f"max {max(times):.1f} s ({len(times)} of {len(results)} clients)")
    if missing:
        print(f"NOT CONVERGED: {missing} clients without a snapshot after {elapsed:.0f} s")
    failed = [f for _, fs, *_ in results for f in fs]
    codes = Counter(code for code, _ in failed)
    retried = sum(1 for _, fs, *_ in results if fs)
    print(f"failed attempts: {len(failed)} ({retried} clients retried, at most "
          f"{max((len(fs) for _, fs, *_ in results), default=0)} times)"
          + "".join(f"; {code} {n} (after p50 {pct([s for c, s in failed if c == code], 0.5):.1f}"
                    f" s, max {max(s for c, s in failed if c == code):.1f} s)"
                    for code, n in codes.most_common()))
    received = sum(r for *_, r, _ in results)
    wasted = sum(w for *_, w in results)
    print(f"bytes received: {received / 1e6:.0f} MB ({wasted / 1e6:.1f} MB by failed attempts)")
    print(f"frontend CPU during the storm: {cpu:.1f} s over {elapsed:.1f} s; RSS "
          f"{rss0:.0f} MB before, peak {peak[0]:.0f} MB (process peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, with "
          f"loading)")
    print(f"load average: {load0[0]:.2f} before, {load1[0]:.2f} after", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--max-backoff", type=float, default=5.0,
                        help="the SDK's max_backoff (seconds)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds after which the clients without a snapshot are reported")
    parser.add_argument("--server-option", type=_channel_option, action="append", default=[],
                        metavar="NAME=INT", help="a gRPC server option on top of the "
                        "frontend's (repeatable)")
    args = parser.parse_args()
    mp.set_start_method("spawn")
    logging.basicConfig(level=logging.WARNING)
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

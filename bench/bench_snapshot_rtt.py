"""One node's snapshot over a slow link, with and without gRPC's bandwidth probing.

    .venv/bin/python bench/bench_snapshot_rtt.py [--services 10000] [--rtt-ms 50]

The SDK turns off gRPC's BDP probing (a PING answering received data, which costs the
frontend a read, an ack and two wake-ups per client and batch) and sets a fixed 16 MB
flow-control window instead. This checks what that does to a 4 MB snapshot: the
frontend serves the synthetic cluster of bench_frontend.py on loopback, and clients
fetch one node's snapshot directly and through a TCP proxy that delays every chunk by
half the round trip each way (the kernel here has no netem). Prints the time to the
last byte of the snapshot for each set of channel options.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import suppress

import grpc
from bench_frontend import _revision, make_cluster

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.server import start_server
from svcproxy.sdk.client import CHANNEL_OPTIONS
from svcproxy.v1 import nodestate_pb2 as pb

GRPC_DEFAULTS = [(k, v) for k, v in CHANNEL_OPTIONS
                 if k not in ("grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes")]
VARIANTS = {
    "SDK (no probing, 16 MB window)": CHANNEL_OPTIONS,
    "gRPC defaults (probing)": GRPC_DEFAULTS,
    "no probing, default window": [*GRPC_DEFAULTS, ("grpc.http2.bdp_probe", 0)],
}


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds late, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    while data := await reader.read(1 << 16):
        queue.put_nowait((time.monotonic() + delay, data))
    queue.put_nowait((time.monotonic() + delay, b""))
    await sender


async def delay_proxy(port: int, rtt: float) -> tuple[asyncio.Server, int]:
    """A loopback TCP proxy to ``port`` adding ``rtt`` of round trip."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        with suppress(ConnectionError, asyncio.CancelledError):
            await asyncio.gather(_forward(reader, up_writer, rtt / 2),
                                 _forward(up_reader, writer, rtt / 2))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def snapshot(target: str, options: list[tuple[str, int]], node: str) -> tuple[float, int]:
    """Seconds to the last byte of ``node``'s snapshot, and its size."""
    started, size = time.perf_counter(), 0
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        call = channel.unary_stream("/svcproxy.v1.NodeStateService/Watch",
                                    request_serializer=pb.WatchRequest.SerializeToString,
                                    response_deserializer=lambda b: b)(
            pb.WatchRequest(node_name=node))
        async for data in call:
            size += len(data)
            if not _revision(data)[1]:
                break
        call.cancel()
    return time.perf_counter() - started, size


async def run(args: argparse.Namespace) -> None:
    engine = Engine()
    engine.loop = asyncio.get_running_loop()
    server, port = await start_server(engine, "127.0.0.1:0")
    engine.submit(make_cluster(args.services, 10, 100))
    await snapshot(f"127.0.0.1:{port}", CHANNEL_OPTIONS, "n0")  # warm the encoder
    node = 1
    for rtt in (0.0, args.rtt_ms / 1000):
        proxy, proxy_port = await delay_proxy(port, rtt)
        for name, options in VARIANTS.items():
            times = []
            for _ in range(args.repeat):
                seconds, size = await snapshot(f"127.0.0.1:{proxy_port}", options, f"n{node}")
                times.append(seconds)
                node += 1
            print(f"round trip {rtt * 1000:3.0f} ms, {name}: {min(times):.3f}-{max(times):.3f} s"
                  f" for {size / 1e6:.1f} MB", flush=True)
        proxy.close()
    await asyncio.sleep(0.5)  # let the cancelled streams end before the server stops
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

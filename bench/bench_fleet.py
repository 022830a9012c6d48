"""The fleet at scale: simulated nodes reporting at full rate to a real frontend.

    .venv/bin/python bench/bench_fleet.py [--nodes 1000] [--rounds 10] [--concurrency 64]

A frontend process (``svcproxy frontend --manifests examples/cluster``, TCP loopback,
anonymous as on loopback) gets ``--rounds`` reports from each of ``--nodes`` node names,
as fast as ``--concurrency`` calls in flight over 8 channels send them (an SDK sends at
most one per --report-min-interval, 1 s: a round is what 1,000 nodes send in a second
when each applied something). Prints the frontend's CPU per report (its /proc times
over the rounds), reports per second, its RSS before the first report and after the
last, and GetFleet's latency for the whole fleet in one page (p50, p99 of 30 calls).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import grpc

from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
TICK = 100  # /proc clock ticks per second (sysconf CLK_TCK on Linux)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_frontend(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests",
         str(ROOT / "examples" / "cluster"), "--listen", f"127.0.0.1:{port}",
         "--metrics-bind-address", "", "--unary-qps-per-peer", "0"],
        stderr=subprocess.DEVNULL)


def epoch_and_revision(stub: pb_grpc.NodeStateServiceStub) -> tuple[str, int]:
    """The frontend's epoch (a Watch's initial metadata) and node-a's revision."""
    call = stub.Watch(pb.WatchRequest(node_name="node-a"), timeout=30)
    first = next(call)
    epoch = dict(call.initial_metadata() or ()).get("svcproxy-epoch", "")
    call.cancel()
    return str(epoch), first.revision


def send_rounds(stubs: list[pb_grpc.NodeStateServiceStub], nodes: int, rounds: int,
                concurrency: int, epoch: str, revision: int) -> tuple[int, int]:
    """Every node's report, ``rounds`` times; (sent, refused)."""
    sent = refused = 0
    pending: list[Future[pb.ReportAnswer]] = []
    for r in range(rounds):
        for n in range(nodes):
            report = pb.NodeReport(node_name=f"node-{n:05}", revision=revision, epoch=epoch,
                                   digest=n, backend="nft", backend_version="0.1.0",
                                   full_sync=r == 0, details={"round": str(r)})
            report.applied_time.GetCurrentTime()
            pending.append(stubs[n % len(stubs)].Report.future(report, timeout=60))
            if len(pending) >= concurrency:
                sent, refused = _drain(pending[: concurrency // 2], sent, refused)
                del pending[: concurrency // 2]
    return _drain(pending, sent, refused)


def _drain(futures: list[Future[pb.ReportAnswer]], sent: int, refused: int) -> tuple[int, int]:
    for future in futures:
        try:
            future.result()
            sent += 1
        except grpc.RpcError:
            refused += 1
    return sent, refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    frontend = start_frontend(port)
    try:
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(8)]
        stubs = [pb_grpc.NodeStateServiceStub(c) for c in channels]
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=60)
        epoch, revision = epoch_and_revision(stubs[0])
        rss_before = rss_mb(frontend.pid)
        cpu_before, start = cpu_seconds(frontend.pid), time.monotonic()
        sent, refused = send_rounds(stubs, args.nodes, args.rounds, args.concurrency, epoch,
                                    revision)
        wall, cpu = time.monotonic() - start, cpu_seconds(frontend.pid) - cpu_before
        rss_after = rss_mb(frontend.pid)
        latencies = []
        for _ in range(30):
            t = time.perf_counter()
            answer = stubs[0].GetFleet(pb.GetFleetRequest(page_size=5000), timeout=60)
            latencies.append(time.perf_counter() - t)
        latencies.sort()
        print(f"{args.nodes} nodes x {args.rounds} rounds: {sent} reports taken, {refused} "
              f"refused, in {wall:.2f} s ({sent / wall:.0f}/s)")
        print(f"frontend CPU per report: {cpu / max(sent, 1) * 1e6:.0f} us "
              f"({cpu:.2f} s in all; gRPC's own per-call cost included)")
        per_node = (rss_after - rss_before) * 1024 / max(1, len(answer.nodes))
        print(f"frontend RSS: {rss_before:.1f} MB before, {rss_after:.1f} MB with "
              f"{len(answer.nodes)} nodes' reports ({per_node:.2f} KB per node)")
        print(f"GetFleet of {len(answer.nodes)} nodes ({answer.ByteSize() / 1024:.0f} KiB): "
              f"p50 {statistics.median(latencies) * 1e3:.1f} ms, "
              f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1e3:.1f} ms")
        for channel in channels:
            channel.close()
    finally:
        frontend.terminate()
        frontend.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

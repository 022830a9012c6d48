"""Cluster-wide network programming latency: simulated nodes watching and reporting.

    .venv/bin/python bench/bench_fleet_latency.py [--nodes 100] [--procs 4] [--changes 20]
        [--light] [--interval 2]

A frontend process on a manifest directory (examples/cluster and a Service ``lat``);
``--nodes`` simulated nodes in ``--procs`` processes, each a real NodeStateClient whose
every state is applied at once (a no-op backend) and reported by the SDK's Reporter
(default --report-min-interval 1 s). With ``--light`` a node is one asyncio Watch stream
instead (all of a process's nodes on one loop, two threads less per node: 1,000 fit two
cores), which notes the trigger times of the ServicePorts its batches set and reports
each complete batch as the Reporter does (the batch's revision, epoch and digest, at most
once a second, the newest replacing one not sent). ``--changes`` times, ``--interval``
seconds apart, the EndpointSlice of ``lat`` is rewritten; each node notes when it
applied each change (its trigger time, the frontend's). Prints, over the changes: the
per-node latency (trigger -> that node applied, every node's), the cluster-wide latency
(trigger -> the last node applied), both p50 / p99, the frontend's
svcproxy_frontend_cluster_programming_latency_seconds (count, mean) as a cross-check, and
the frontend's CPU over the changes (per report it accepted, per node and change) and
while nothing changes (per node and second).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import yaml

from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slice_doc(generation: int) -> list[dict]:
    eps = [{"addresses": [f"10.250.{generation % 200}.{i + 1}"], "nodeName": "node-a",
            "conditions": {"ready": True}} for i in range(3)]
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lat", "namespace": "b"},
         "spec": {"clusterIP": "10.96.99.1", "clusterIPs": ["10.96.99.1"],
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "lat-1", "namespace": "b",
                      "labels": {"kubernetes.io/service-name": "lat"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps}]


def write(directory: Path, generation: int) -> None:
    tmp = directory / ".lat.yaml.tmp"
    tmp.write_text(yaml.safe_dump_all(slice_doc(generation)))
    tmp.replace(directory / "lat.yaml")


def nodes_main(api: str, names: list[str], out: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    """One process's simulated nodes: apply at once, report through the SDK."""
    from svcproxy.sdk.backend import Backend, Changes, NodeState
    from svcproxy.sdk.client import NodeStateClient
    from svcproxy.sdk.report import Reporter

    class Nothing(Backend):
        name = "bench"

        def sync(self, state: NodeState, changes: Changes) -> None:
            pass

    applied: list[tuple[str, float, float]] = []  # node, trigger, applied at
    lock = threading.Lock()

    def run(name: str) -> None:
        client = NodeStateClient(api, name)
        reporter = Reporter(client, Nothing())
        client.start()
        reporter.start()
        while not stop.is_set():
            if not client.wait(0.5):
                continue
            taken = client.take()
            if taken is None:
                continue
            now = time.time()
            reporter.applied(*taken)
            with lock:
                applied.extend((name, t, now) for t in taken[1].trigger_times)
        reporter.stop()
        client.stop()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in names]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(10)
    out.put(applied)


def light_main(api: str, names: list[str], out: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    """One process's simulated nodes as asyncio streams (``--light``); puts what they
    applied and their reports' outcomes by status."""
    applied: list[tuple[str, float, float]] = []
    outcomes: Counter[str] = Counter()

    async def main() -> None:
        channels = [grpc.aio.insecure_channel(api) for _ in range(8)]
        tasks = [asyncio.ensure_future(light_node(pb_grpc.NodeStateServiceStub(
            channels[i % len(channels)]), name, applied, outcomes))
            for i, name in enumerate(names)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()

    asyncio.run(main())
    out.put((applied, dict(outcomes)))


async def light_node(stub: pb_grpc.NodeStateServiceStub, name: str,
                     applied: list[tuple[str, float, float]], outcomes: Counter[str]) -> None:
    """Watch ``name``; each complete batch is applied at once and reported as the SDK's
    Reporter does (at most once a second, the newest replacing one not sent)."""
    call = stub.Watch(pb.WatchRequest(node_name=name))
    epoch = str(dict(await call.initial_metadata() or ()).get("svcproxy-epoch", ""))
    seen: set[float] = set()
    triggers: list[float] = []
    newest: list[pb.NodeReport] = []
    wake = asyncio.Event()
    sender = asyncio.ensure_future(light_reports(stub, newest, wake, outcomes))
    try:
        async for event in call:
            for op in event.ops:
                kind = op.WhichOneof("op")
                port = (op.set_service if kind == "set_service" else
                        op.replace_service.service if kind == "replace_service" else None)
                if port is not None and port.HasField("trigger_time"):
                    triggers.append(port.trigger_time.ToNanoseconds() / 1e9)
            if event.more:
                continue
            now = time.time()
            for trigger in triggers:
                if trigger not in seen:
                    seen.add(trigger)
                    applied.append((name, trigger, now))
            triggers.clear()
            report = pb.NodeReport(node_name=name, revision=event.revision, epoch=epoch,
                                   backend="bench-light", backend_version="0")
            if event.HasField("digest"):
                report.digest = event.digest
            report.applied_time.FromNanoseconds(int(now * 1e9))
            newest[:] = [report]
            wake.set()
    finally:
        sender.cancel()


async def light_reports(stub: pb_grpc.NodeStateServiceStub, newest: list[pb.NodeReport],
                        wake: asyncio.Event, outcomes: Counter[str]) -> None:
    """Send the newest report whenever there is one, at most once a second; count each
    one's outcome."""
    while True:
        await wake.wait()
        wake.clear()
        report = newest.pop()
        started = time.monotonic()
        try:
            await stub.Report(report, timeout=30)
            outcomes["OK"] += 1
        except grpc.aio.AioRpcError as err:
            outcomes[err.code().name] += 1
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def fleet_applied(stub: pb_grpc.NodeStateServiceStub) -> int:
    return stub.GetFleet(pb.GetFleetRequest(page_size=5000),
                         timeout=30).nodes_by_state["NODE_APPLIED"]


def histogram(port: int) -> tuple[float, float, float]:
    """(count, sum) of the cluster latency histogram, and the reports accepted."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    values = {}
    for line in text.decode().splitlines():
        if line.startswith("svcproxy_frontend_cluster_programming_latency_seconds_"):
            name, _, value = line.partition(" ")
            values[name.split("{")[0]] = float(value)
        if line.startswith('svcproxy_frontend_fleet_reports_total{result="accepted"}'):
            values["accepted"] = float(line.rpartition(" ")[2])
    base = "svcproxy_frontend_cluster_programming_latency_seconds_"
    return (values.get(base + "count", 0.0), values.get(base + "sum", 0.0),
            values.get("accepted", 0.0))


def cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and its children (the stream workers)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += (int(fields[11]) + int(fields[12])) / 100  # CLK_TCK
    return total


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between two changes (default %(default)s)")
    parser.add_argument("--quiet", type=float, default=10.0,
                        help="seconds with every node connected and nothing changing, "
                        "for the frontend's idle CPU per node (default %(default)s)")
    parser.add_argument("--stream-workers", type=int, default=1,
                        help="the frontend's --stream-workers (default %(default)s)")
    parser.add_argument("--light", action="store_true",
                        help="simulated nodes as asyncio streams, not SDK clients")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    manifests = work / "m"
    shutil.copytree(ROOT / "examples" / "cluster", manifests)
    write(manifests, 0)
    port, metrics_port = free_port(), free_port()
    api = f"127.0.0.1:{port}"
    frontend = subprocess.Popen(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests", str(manifests),
         "--listen", api, "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
         "--unary-qps-per-peer", "0", "--max-streams-per-peer", str(args.nodes + 100),
         "--max-streams", str(args.nodes + 100), "--stream-workers", str(args.stream_workers)],
        stderr=subprocess.DEVNULL)
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    names = [f"sim-{i:04}" for i in range(args.nodes)]
    target = light_main if args.light else nodes_main
    procs = [ctx.Process(target=target, args=(api, names[i::args.procs], out, stop))
             for i in range(args.procs)]
    try:
        channel = grpc.insecure_channel(api)
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb_grpc.NodeStateServiceStub(channel)
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 300
        while fleet_applied(stub) < args.nodes and time.monotonic() < deadline:
            time.sleep(0.5)
        idle = cpu_seconds(frontend.pid)
        time.sleep(args.quiet)
        idle = cpu_seconds(frontend.pid) - idle
        before, started = histogram(metrics_port), time.time()
        cpu_before = cpu_seconds(frontend.pid)
        for generation in range(1, args.changes + 1):
            write(manifests, generation)
            time.sleep(args.interval)
        cpu = cpu_seconds(frontend.pid) - cpu_before
        deadline = time.monotonic() + 60
        while fleet_applied(stub) < args.nodes and time.monotonic() < deadline:
            time.sleep(0.5)
        after = histogram(metrics_port)
        stop.set()
        applied: list[tuple[str, float, float]] = []
        outcomes: Counter[str] = Counter()
        for _ in procs:
            got = out.get(timeout=60)
            if isinstance(got, tuple):  # --light: and the reports' outcomes
                got, counts = got
                outcomes.update(counts)
            applied.extend(got)
        by_trigger: dict[float, list[float]] = {}
        for _node, trigger, at in applied:
            by_trigger.setdefault(trigger, []).append(at - trigger)
        changes = {t: v for t, v in by_trigger.items()
                   if t >= started and len(v) == args.nodes}
        per_node = [x for v in changes.values() for x in v]
        cluster = [max(v) for v in changes.values()]
        count, total = after[0] - before[0], after[1] - before[1]
        print(f"{args.nodes} nodes in {args.procs} processes, {len(changes)} changes seen by "
              f"every node (of {args.changes})")
        if per_node:
            print(f"per-node latency: p50 {statistics.median(per_node) * 1e3:.0f} ms, "
                  f"p99 {pct(per_node, 0.99) * 1e3:.0f} ms")
            print(f"cluster-wide (last node applied): p50 {statistics.median(cluster) * 1e3:.0f}"
                  f" ms, p99 {pct(cluster, 0.99) * 1e3:.0f} ms")
        mean = f"{total / count * 1e3:.0f} ms" if count else "-"
        print(f"frontend's histogram: {count:.0f} observations, mean {mean} "
              "(trigger -> last node's report received)")
        reports = after[2] - before[2]
        if outcomes:
            print(f"simulated nodes' reports (whole run): {dict(outcomes)}")
        print(f"frontend CPU over the changes: {cpu:.1f} s, {reports:.0f} reports accepted: "
              f"{cpu / max(reports, 1) * 1e6:.0f} us per report (its stream writes "
              f"included), {cpu / (args.nodes * args.changes) * 1e6:.0f} us per node and "
              f"change, {cpu / (args.changes * args.interval) * 100:.0f}% of a core")
        print(f"frontend CPU with every node connected and nothing changing: "
              f"{idle / args.quiet / args.nodes * 1e6:.1f} us per node and second")
    finally:
        stop.set()
        for proc in procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
        frontend.terminate()
        frontend.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

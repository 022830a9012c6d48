"""Benchmark of the ebpf backend next to nft and iptables; prints figures, draws a plot.

Run as root: it makes one network namespace, one cgroup (under the cgroup v2 mount),
one bpffs mount, and removes them at the end.

1. connect() + first byte latency to a ClusterIP at 100, 1,000, 10,000 and 30,000
   services (one endpoint each, 16 real endpoints on the namespace's loopback), for
   ebpf, nft and iptables side by side in one run on the same namespace: the ebpf
   client lives in the test cgroup, the nft/iptables client outside it. Rounds
   alternate ebpf with the other backend so load drift hits both. Also the floor:
   connecting straight to an endpoint.
2. ebpf at 10,000 services x 10 endpoints: the full load into empty maps, a full
   resync with nothing to change, and one change (one endpoint replaced) p50/p99.

Usage: .venv/bin/python bench/bench_ebpf.py [--sizes 100,1000,10000,30000]
       [--connects 1000] [--backends ebpf,nft,iptables] [--changes 200] [--svg FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import svgplot  # noqa: E402
from bench.svgplot import Axis, Plot, Series  # noqa: E402
from svcproxy.backends.ebpf.backend import EbpfBackend  # noqa: E402
from svcproxy.backends.ebpf.loader import Layout  # noqa: E402
from svcproxy.model import (  # noqa: E402
    Endpoint,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
)
from svcproxy.sdk import Backend, Changes, NodeConfig, NodeState  # noqa: E402

CGROUP2 = Path("/sys/fs/cgroup/unified")
POOL = [f"10.244.0.{i}" for i in range(1, 17)]
PORT = 8080
CONFIG = NodeConfig(node_name="node1", cluster_cidrs=("10.244.0.0/16",),
                    node_ips=("10.244.0.1",), service_cidrs=("10.96.0.0/12",))

SERVER = r'''
import selectors, socket, sys
sel = selectors.DefaultSelector()
for addr in sys.argv[1:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 8080)); s.listen(1024); s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        try:
            conn, _ = key.fileobj.accept()
            conn.send(b"x"); conn.close()
        except OSError:
            pass
'''

CLIENT = r'''
import json, socket, sys, time
for line in sys.stdin:
    c = json.loads(line)
    out = []
    targets = c["targets"]
    for i in range(c["count"]):
        host = targets[i % len(targets)]
        s = socket.socket()
        t0 = time.perf_counter_ns()
        try:
            s.connect((host, c["port"]))
            if s.recv(1) != b"x":
                raise ConnectionResetError(104, "no answer")
            out.append(time.perf_counter_ns() - t0)
        except OSError as e:
            out.append(-e.errno)
        s.close()
    print(json.dumps(out), flush=True)
'''

_libc = ctypes.CDLL(None, use_errno=True)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def cluster_ip(i: int) -> str:
    return f"10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"


def latency_state(n: int) -> NodeState:
    """``n`` ClusterIP services, one endpoint each from the pool of real ones."""
    records = {}
    for i in range(n):
        key = ServicePortKey("bench", f"svc{i}", "http", Protocol.TCP)
        svc = ServicePort(key, cluster_ips=(cluster_ip(i),), port=80, has_endpoints=True)
        ip = POOL[i % len(POOL)]
        records[key] = ServicePortState(svc, {ip: Endpoint(ip, PORT, internal=True,
                                                           external=True)})
    return NodeState("node1", 1, NodeInfo("node1"), records)


def pod_ip(n: int) -> str:
    return f"10.{100 + n // 62500}.{n // 250 % 250}.{n % 250 + 1}"


def load_state(n: int, per: int) -> NodeState:
    """``n`` services x ``per`` endpoints (addresses only; nothing connects to them)."""
    records = {}
    for i in range(n):
        key = ServicePortKey("bench", f"svc{i}", "http", Protocol.TCP)
        svc = ServicePort(key, cluster_ips=(cluster_ip(i),), port=80, has_endpoints=True)
        eps = {pod_ip(i * per + j): Endpoint(pod_ip(i * per + j), PORT, internal=True,
                                             external=True) for j in range(per)}
        records[key] = ServicePortState(svc, eps)
    return NodeState("node1", 1, NodeInfo("node1"), records)


class Bench:
    """The namespace, cgroup, bpffs, server and two clients (in and out of the cgroup)."""

    def __init__(self) -> None:
        tag = f"{os.getpid()}{secrets.token_hex(2)}"
        self.ns = f"spbench{tag}"
        self.cgroup = CGROUP2 / f"svcproxy-bench-{tag}"
        self.bpffs = Path(tempfile.mkdtemp(prefix="spbench-bpf-"))
        self.procs: list[subprocess.Popen[str]] = []
        self.old_ns = os.open("/proc/self/ns/net", os.O_RDONLY)

    def start(self) -> Bench:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        for ip in POOL:
            sh("ip", "-n", self.ns, "addr", "add", f"{ip}/32", "dev", "lo")
        # ClusterIPs route to lo from a pod address (so nft/iptables see pod traffic).
        sh("ip", "-n", self.ns, "route", "add", "10.96.0.0/12", "dev", "lo", "src", POOL[0])
        sh("ip", "netns", "exec", self.ns, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
        self.cgroup.mkdir()
        sh("mount", "-t", "bpf", "bpf", str(self.bpffs))
        server = self._spawn(SERVER, *POOL)
        assert server.stdout and server.stdout.readline().strip() == "ready"
        self.inside = self._spawn(CLIENT)
        (self.cgroup / "cgroup.procs").write_text(f"{self.inside.pid}\n")
        self.outside = self._spawn(CLIENT)
        fd = os.open(f"/var/run/netns/{self.ns}", os.O_RDONLY)
        try:  # this process programs nft/iptables: it works inside the namespace
            if _libc.setns(fd, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        return self

    def _spawn(self, code: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.ns}", sys.executable, "-u", "-c", code,
             *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def layout(self) -> Layout:
        return Layout(pin_dir=self.bpffs / "pins", cgroup=self.cgroup,
                      max_services=65536, max_endpoints=262144)

    def measure(self, inside: bool, targets: list[str], count: int) -> list[float]:
        proc = self.inside if inside else self.outside
        assert proc.stdin and proc.stdout
        proc.stdin.write(json.dumps({"targets": targets, "port": 80 if targets[0].startswith(
            "10.9") else PORT, "count": count}) + "\n")
        proc.stdin.flush()
        values = json.loads(proc.stdout.readline())
        errors = [v for v in values if v < 0]
        if errors:
            raise RuntimeError(f"{len(errors)} of {count} connects failed: errno "
                               f"{sorted(set(-e for e in errors))}")
        return [v / 1000 for v in values]  # microseconds

    def stop(self) -> None:
        _libc.setns(self.old_ns, 0x40000000)
        for proc in self.procs:
            proc.kill()
            proc.wait(5)
        subprocess.run(["umount", str(self.bpffs)], capture_output=True)
        os.rmdir(self.bpffs)
        if self.cgroup.exists():
            self.cgroup.rmdir()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def make_backend(name: str, bench: Bench) -> Backend:
    if name == "ebpf":
        return EbpfBackend(CONFIG, bench.layout())
    from svcproxy.cli import build_parser

    args = build_parser().parse_args(["backend", name, "--node-name", "node1"])
    return args.backend_module.create(args, CONFIG)


def full_sync(backend: Backend, state: NodeState, reason: str = "initial") -> float:
    start = time.perf_counter()
    backend.sync(state, Changes(frozenset(state.services), full=True, reason=reason))
    return time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def loaded(name: str, bench: Bench, state: NodeState) -> Iterator[float]:
    backend = make_backend(name, bench)
    try:
        yield full_sync(backend, state)
    finally:
        backend.cleanup()


def _rounds(bench: Bench, results: dict[str, dict[int, list[float]]], n: int,
            runs: list[tuple[str, bool, list[str]]], rounds: int, per_round: int) -> None:
    """Alternate the measurements of ``runs`` (label, in the cgroup, targets) in rounds."""
    for _label, inside, targets in runs:
        bench.measure(inside, targets, 100)  # warm up
    for _ in range(rounds):
        for label, inside, targets in runs:
            results.setdefault(label, {}).setdefault(n, []).extend(
                bench.measure(inside, targets, per_round))


def latency(bench: Bench, sizes: list[int], others: list[str], connects: int,
            rounds: int = 20) -> dict[str, dict[int, list[float]]]:
    """Samples per label and size. Phases per size: ebpf alone (and "direct", straight to
    an endpoint, as the floor); then each other backend loaded next to it ("ebpf+nft" is
    the default deployment); iptables' rules are traversed by every new connection of the
    namespace, so "direct+iptables" shows what they cost connections to no service."""
    results: dict[str, dict[int, list[float]]] = {}
    per_round = max(1, connects // rounds)
    rng = random.Random(1)
    for n in sizes:
        state = latency_state(n)
        targets = [cluster_ip(i) for i in rng.sample(range(n), min(n, 64))]
        with loaded("ebpf", bench, state) as took:
            print(f"  {n:>6} services: ebpf loaded in {took:.2f} s", flush=True)
            _rounds(bench, results, n, [("ebpf", True, targets), ("direct", False, POOL)],
                    rounds, per_round)
            for other in others:
                with loaded(other, bench, state) as took:
                    print(f"  {n:>6} services: {other} loaded in {took:.2f} s", flush=True)
                    runs = [(other, False, targets)]
                    if other == "nft":
                        runs.append(("ebpf+nft", True, targets))
                    if other == "iptables":
                        runs.append(("direct+iptables", False, POOL))
                    _rounds(bench, results, n, runs, rounds, per_round)
    return results


def changes(bench: Bench, services: int, per: int, count: int) -> dict[str, Any]:
    """Full load, no-op resync and one-change latency of the ebpf backend."""
    state = load_state(services, per)
    backend = EbpfBackend(CONFIG, bench.layout())
    try:
        out: dict[str, Any] = {"full_load": full_sync(backend, state)}
        out["resync"] = full_sync(backend, state, "periodic")
        out["reread"] = full_sync(backend, state, "retry")
        rng = random.Random(2)
        keys = sorted(state.services)
        times = []
        services_map = dict(state.services)
        for rev in range(count):
            key = rng.choice(keys)
            record = services_map[key]
            ip = f"10.250.{rev // 250 % 250}.{rev % 250 + 1}"
            eps = dict(list(record.endpoints.items())[1:])
            eps[ip] = Endpoint(ip, PORT, internal=True, external=True)
            services_map[key] = replace(record, endpoints=eps)
            new = NodeState("node1", rev + 2, state.node, services_map)
            start = time.perf_counter()
            backend.sync(new, Changes(frozenset({key})))
            times.append((time.perf_counter() - start) * 1000)
        out["change_ms"] = times
        return out
    finally:
        backend.cleanup()


COLORS = {"ebpf": "#1b7837", "ebpf+nft": "#7fbf7b", "nft": "#2166ac", "iptables": "#b2182b",
          "direct": "#777777", "direct+iptables": "#f4a582"}


def latency_plot(results: dict[str, dict[int, list[float]]]) -> Plot:
    """p50 (solid) and p90 (dashed) per backend over the service counts, both axes log:
    iptables' growth and ebpf's floor both show."""
    sizes = tuple(sorted({n for r in results.values() for n in r}))
    series = tuple(
        Series(name, tuple((n, pct(v, q)) for n, v in sorted(by_size.items())),
               COLORS.get(name, "black"), dashed=q == 0.9, legend=q == 0.5)
        for name, by_size in sorted(results.items()) for q in (0.5, 0.9))
    return Plot("connect() + first byte, microseconds, log scale (p50 solid, p90 dashed)",
                Axis("services", log=True, ticks=sizes), Axis(log=True), series)


def svg(results: dict[str, dict[int, list[float]]], path: Path) -> None:
    """The latency plot, written to ``path``."""
    svgplot.write(path, [latency_plot(results)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100,1000,10000,30000")
    p.add_argument("--backends", default="ebpf,nft,iptables")
    p.add_argument("--connects", type=int, default=2000)
    p.add_argument("--changes", type=int, default=200)
    p.add_argument("--load-services", type=int, default=10000)
    p.add_argument("--load-endpoints", type=int, default=10)
    p.add_argument("--svg", type=Path, default=None, help="write the latency plot here")
    p.add_argument("--json", type=Path, default=None, help="write the latency samples here")
    p.add_argument("--plot-only", type=Path, default=None, metavar="JSON",
                   help="only redraw --svg from samples a previous run wrote with --json")
    args = p.parse_args()
    if args.plot_only:
        raw = json.loads(args.plot_only.read_text())
        svg({k: {int(n): v for n, v in by.items()} for k, by in raw.items()}, args.svg)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    others = [b for b in args.backends.split(",") if b != "ebpf"]
    print(f"# bench_ebpf: {os.cpu_count()} cores, Linux {os.uname().release}, "
          f"Python {sys.version.split()[0]}", flush=True)
    bench = Bench().start()
    try:
        print("connect() + first byte:", flush=True)
        results = latency(bench, sizes, others, args.connects)
        print(f"{'backend':>9} {'services':>8} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8} "
              f"{'n':>5}")
        for name, by_size in sorted(results.items()):
            for n, values in sorted(by_size.items()):
                print(f"{name:>9} {n:>8} {statistics.median(values):8.1f} "
                      f"{pct(values, 0.9):8.1f} {pct(values, 0.99):8.1f} {len(values):>5}")
        for name, by_size in sorted(results.items()):
            if len(by_size) > 1:
                lo, hi = min(by_size), max(by_size)
                ratio = statistics.median(by_size[hi]) / statistics.median(by_size[lo])
                print(f"{name}: p50 at {hi:,} / p50 at {lo:,} = {ratio:.2f}")
        for name, by_size in sorted(results.items()):
            if name != "direct" and "direct" in results:
                over = [statistics.median(v) / statistics.median(results["direct"][n])
                        for n, v in sorted(by_size.items())]
                print(f"{name}: p50 / direct's p50 at the same size: "
                      + ", ".join(f"{r:.2f}" for r in over))
        if args.json:
            args.json.write_text(json.dumps(results))
        if args.svg:
            svg(results, args.svg)
            print(f"plot: {args.svg}")
        if args.changes:
            c = changes(bench, args.load_services, args.load_endpoints, args.changes)
            print(f"ebpf {args.load_services:,} services x {args.load_endpoints} endpoints: "
                  f"full load {c['full_load']:.2f} s, periodic resync (nothing changed) "
                  f"{c['resync']:.2f} s, resync reading the maps back (retry) "
                  f"{c['reread']:.2f} s; one change p50 {statistics.median(c['change_ms']):.2f}"
                  f" ms, p99 {pct(c['change_ms'], 0.99):.2f} ms ({len(c['change_ms'])} changes)")
    finally:
        bench.stop()


if __name__ == "__main__":
    main()

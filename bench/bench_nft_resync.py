"""Benchmark: change -> kernel latency of the nft backend while periodic resyncs run.

The nft backend at 10,000 services x 10 endpoints in a network namespace this bench
creates, driven by the node agent's sync runner (``SyncRunner``, ``--min-sync-period
0``) from an in-process source. One endpoint of some service is replaced at a steady
rate; each change's new endpoint is watched for with ``nft monitor`` in the namespace
(the kernel's own event for the element), and change -> kernel p50/p99/max printed,
side by side in one run for:

1. resyncs every ``--sync-period`` seconds (several fall inside the window): a resync
   is a diff against what was applied;
2. resyncs disabled (``--sync-period`` of an hour): the floor;

alternating over ``--rounds`` in ABBA order (each run a fresh backend), then
3. (``--rewrite``) resyncs that rewrite both tables, as the backend did before issue 15.

Usage (root): .venv/bin/python bench/bench_nft_resync.py [--services N] [--window S]
    [--rate HZ] [--sync-period S] [--rounds N] [--rewrite]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from endpoint_swap import swap_one_endpoint  # noqa: E402

from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.backends.nft.libnft import LibNftRunner  # noqa: E402
from svcproxy.sdk import Backend, Changes, NodeState  # noqa: E402
from svcproxy.sdk.health import ProxyHealth  # noqa: E402
from svcproxy.sdk.node_context import ContextResolver  # noqa: E402
from svcproxy.sdk.runner import SyncRunner  # noqa: E402
from svcproxy.sdk.testing import FakeSource  # noqa: E402
from tests.support.nft_fixtures import CONFIG, big_state, pod_ip  # noqa: E402

PROBE = "spbench_probe"
NEW_ENDPOINT = re.compile(r"(10\.13\d\.\d+\.\d+) \. 8080")


@dataclass
class Timed(Backend):
    """The backend, with each sync's reason and duration recorded."""

    inner: NftBackend
    syncs: list[tuple[str, float, float]] = field(default_factory=list)  # reason, start, end

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def sync(self, state: NodeState, changes: Changes) -> None:
        t0 = time.perf_counter()
        self.inner.sync(state, changes)
        self.syncs.append((changes.reason, t0, time.perf_counter()))


class Stamped(LibNftRunner):
    """libnftables, noting when each transaction writing a new endpoint returned."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: dict[str, float] = {}
        self.durations: list[float] = []

    def apply(self, text: str) -> None:
        t0 = time.perf_counter()
        super().apply(text)
        at = time.perf_counter()
        self.durations.append(at - t0)
        for ip in NEW_ENDPOINT.findall(text):
            self.applied.setdefault(ip, at)


class Monitor:
    """``nft monitor`` in this namespace: when each new endpoint's element appeared."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self._probed = threading.Event()
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(["stdbuf", "-oL", "nft", "monitor"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            at = time.perf_counter()
            if PROBE in line:
                self._probed.set()
            found = NEW_ENDPOINT.findall(line)
            if found:
                with self._lock:
                    for ip in found:
                        self.seen.setdefault(ip, at)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the monitor reports an event made now (it has caught up)."""
        self._probed.clear()
        deadline = time.monotonic() + timeout
        while not self._probed.wait(1.0):
            if time.monotonic() > deadline:
                raise TimeoutError("nft monitor reported nothing")
            subprocess.run(["nft", "-f", "-"], check=True,
                           input=f"add table ip {PROBE}\ndelete table ip {PROBE}\n".encode())

    def when(self, ip: str) -> float | None:
        with self._lock:
            return self.seen.get(ip)

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_mode(label: str, state: NodeState, sync_period: float, window: float, rate: float,
             first_ip: int, rewrite: bool = False) -> dict[str, float]:
    """Drive one fresh backend through ``window`` seconds of changes; print its figures."""
    stamped = Stamped()
    nft = NftBackend(CONFIG, stamped)
    nft.full_sync_interval = 0.0 if rewrite else None
    backend = Timed(nft)
    source = FakeSource()
    runner = SyncRunner(source, backend, health=ProxyHealth(timeout=3600),
                        sync_period=sync_period, min_sync_period=0.0, poll=0.05,
                        context=ContextResolver(CONFIG, NftBackend.node_port_default))
    thread = threading.Thread(target=runner.run, daemon=True)
    # Started on an empty ruleset: nft monitor first reads the whole ruleset (~40 s at
    # 10,000 services on a loaded machine), then follows the new objects' events.
    monitor = Monitor()
    try:
        monitor.wait_ready()
        source.push(state)
        thread.start()
        t0 = time.perf_counter()
        while not backend.syncs:
            time.sleep(0.05)
        initial = time.perf_counter() - t0
        monitor.wait_ready()
        time.sleep(1.0)
        backend.syncs.clear()
        stamped.durations.clear()
        pushed: dict[str, float] = {}
        keys = sorted(state.services)
        count = int(window * rate)
        start = time.perf_counter()
        for i in range(count):
            at = start + i / rate
            time.sleep(max(0.0, at - time.perf_counter()))
            key = keys[(i * 7919) % len(keys)]
            state = swap_one_endpoint(state, key, first_ip + i)
            pushed[pod_ip(first_ip + i)] = time.perf_counter()
            source.push(state, [key])
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline and any(monitor.when(ip) is None for ip in pushed):
            time.sleep(0.05)
        latencies = [seen - t for ip, t in pushed.items()
                     if (seen := monitor.when(ip)) is not None]
        lost = len(pushed) - len(latencies)
        applied = [stamped.applied[ip] - t for ip, t in pushed.items() if ip in stamped.applied]
    finally:
        runner.stop()
        if thread.is_alive():
            thread.join(timeout=60)
        monitor.stop()
        nft.cleanup()
    resyncs = [(s, e) for reason, s, e in backend.syncs if reason == "periodic"]
    # The changes that met a resync: one ran between the push and the kernel's event.
    met = [seen - t for ip, t in pushed.items() if (seen := monitor.when(ip)) is not None
           and any(s < seen and e > t for s, e in resyncs)]
    print(f"-- {label}: initial sync {initial:.2f} s; {len(latencies)} changes over "
          f"{window:.0f} s ({rate:g}/s){f', {lost} NOT SEEN' if lost else ''}; "
          f"{len(resyncs)} resyncs in the window"
          + (f" ({_ms([e - s for s, e in resyncs])} each)" if resyncs else ""))
    print(f"   syncs of changes: {_ms([e - s for r, s, e in backend.syncs if r == 'changes'])};"
          f" nft transactions: {_ms(stamped.durations)}")
    print(f"   change -> kernel (nft monitor): {_ms(latencies)}; nft transaction returned: "
          f"{_ms(applied)}" + (f"; the {len(met)} changes that met a resync: max "
                               f"{1e3 * max(met):.1f} ms" if met else ""), flush=True)
    return Figures(latencies, met)


@dataclass
class Figures:
    latencies: list[float]
    met: list[float]

    def __iadd__(self, other: Figures) -> Figures:
        self.latencies += other.latencies
        self.met += other.met
        return self

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


def _ms(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"p50 {1e3 * statistics.median(values):.1f} ms, p99 "
            f"{1e3 * percentile(values, 0.99):.1f} ms, max {1e3 * max(values):.1f} ms")


def inside(args: argparse.Namespace) -> None:
    print(f"== {args.services} services x {args.endpoints} endpoints, changes at "
          f"{args.rate:g}/s for {args.window:.0f} s per run, --min-sync-period 0, "
          f"{args.rounds} rounds in ABBA order", flush=True)
    state = big_state(args.services, args.endpoints)
    with_ = Figures([], [])
    without = Figures([], [])
    first = 2_000_000
    for round_ in range(args.rounds):
        # ABBA: each mode runs first in every other round (the machine's load drifts).
        for mode in ("with", "without") if round_ % 2 == 0 else ("without", "with"):
            if mode == "with":
                with_ += run_mode(f"resyncs every {args.sync_period:g} s", state,
                                  args.sync_period, args.window, args.rate, first)
            else:
                without += run_mode("resyncs disabled", state, 3600.0, args.window, args.rate,
                                    first)
            first += 50_000
    if args.rewrite:
        run_mode(f"resyncs every {args.sync_period:g} s that rewrite both tables (as before "
                 "issue 15)", state, args.sync_period, args.window, args.rate, first, True)
    print(f"== all rounds: with resyncs {_ms(with_.latencies)}; without {_ms(without.latencies)}"
          f"; p99 ratio {with_.p99 / without.p99:.2f}; changes that met a resync: "
          f"{_ms(with_.met)} (goal: p99 < 50 ms with resyncs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of changes")
    parser.add_argument("--rate", type=float, default=10.0, help="changes per second")
    parser.add_argument("--sync-period", type=float, default=5.0,
                        help="resync period of the first mode (several fit in the window)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each mode, alternating (the machine's load drifts)")
    parser.add_argument("--rewrite", action="store_true",
                        help="also run resyncs that rewrite the tables (the old behaviour)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_nft_resync: needs root (creates a network namespace)")
    if args.inside:
        inside(args)
        return
    ns = f"spresync{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside",
                        *sys.argv[1:]], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()

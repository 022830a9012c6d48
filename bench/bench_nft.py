"""Benchmark of the nft backend; prints figures (run as root: creates network namespaces).

1. 10,000 services x 10 endpoints: full sync (render + ``nft -f``) next to the raw
   ``nft -f`` load of the same text, each into a fresh namespace.
2. One endpoint change at that scale (render the delta + ``nft -f``).
3. Manifest edit -> rule in the kernel: the real frontend (manifest source) and
   the real backend process (``--min-sync-period 0``) over a unix socket,
   p50 / p99 over 50 edits, observed with ``nft monitor``.
4. RSS: this process after the 10k full sync; the backend process of part 3.

Usage: .venv/bin/python bench/bench_nft.py [--services N] [--endpoints N] [--edits N]
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from endpoint_swap import swap_one_endpoint  # noqa: E402

from svcproxy.backends.nft.apply import NftRunner  # noqa: E402
from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.backends.nft.libnft import LibNftRunner  # noqa: E402
from svcproxy.model import ServicePortKey  # noqa: E402
from svcproxy.sdk import Changes, NodeState  # noqa: E402
from tests.support.lab import manifests as m  # noqa: E402
from tests.support.lab.plan import NodeSpec, PodSpec  # noqa: E402
from tests.support.lab.processes import SVCPROXY, Process, frontend, wait_for_path  # noqa: E402
from tests.support.nft_fixtures import CONFIG, big_state  # noqa: E402


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Netns:
    """A throwaway network namespace."""

    def __init__(self, label: str) -> None:
        self.name = f"spbench{os.getpid()}-{label}"

    def __enter__(self) -> str:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        return self.name

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)


def scale(services: int, endpoints: int) -> None:
    """Run inside a fresh namespace (as the backend runs on a node): no ``ip netns exec``."""
    print(f"== {services} services x {endpoints} endpoints "
          f"({services * endpoints} endpoints; NodePorts on the first 2000)", flush=True)
    t0 = time.perf_counter()
    state = big_state(services, endpoints)
    print(f"   building the node state (not part of the sync): {time.perf_counter() - t0:.2f} s")
    base_rss = rss_mb()
    backend = NftBackend(CONFIG, LibNftRunner())
    gc.collect()
    t0 = time.perf_counter()
    backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))
    first = time.perf_counter() - t0
    print(f"   RSS of this process after the full sync: {rss_mb():.0f} MB "
          f"({rss_mb() - base_rss:.0f} MB more than before it; state built before)")
    text = backend.applied_text()
    ours, raw = [first], []
    for _ in range(2):
        backend.cleanup()
        t0 = time.perf_counter()
        subprocess.run(["nft", "-f", "-"], input=text.encode(), check=True)
        raw.append(time.perf_counter() - t0)
        backend.cleanup()
        t0 = time.perf_counter()
        backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))
        ours.append(time.perf_counter() - t0)
    last = backend.last
    assert last is not None
    print(f"   full sync into an empty table (render + nft -f), best of 3: {min(ours):.2f} s "
          f"(last: render {last.render_seconds:.2f} s, apply {last.apply_seconds:.2f} s, "
          f"{last.text_bytes / 1e6:.1f} MB of nft text)")
    print(f"   raw nft -f of the same text, best of 2: {min(raw):.2f} s "
          f"-> ours / raw = {min(ours) / min(raw):.2f}")
    key = sorted(state.services)[services // 2]
    for first_ip, runner in ((2_000_000, LibNftRunner()), (2_100_000, NftRunner())):
        backend.runner = runner
        state = _endpoint_changes(backend, state, key, type(runner).__name__, first_ip)
    t0 = time.perf_counter()
    backend.sync(state, Changes(frozenset(state.services), full=True, reason="periodic"))
    print(f"   periodic resync with nothing changed (a diff against what was applied): "
          f"{1e3 * (time.perf_counter() - t0):.1f} ms")
    backend.cleanup()


def _endpoint_changes(backend: NftBackend, state: NodeState, key: ServicePortKey,
                      label: str, first: int, count: int = 20) -> NodeState:
    """Replace one endpoint of ``key`` ``count`` times; print delta sync times."""
    changes: list[float] = []
    for i in range(count):
        state = swap_one_endpoint(state, key, first + i)
        t0 = time.perf_counter()
        backend.sync(state, Changes(frozenset({key})))
        changes.append(time.perf_counter() - t0)
        assert backend.last and backend.last.mode == "delta"
        time.sleep(0.05)
    changes.sort()
    print(f"   one endpoint change (delta render + apply, {label}): median "
          f"{1e3 * statistics.median(changes):.1f} ms, p90 "
          f"{1e3 * changes[int(0.9 * len(changes))]:.1f} ms over {len(changes)} changes")
    return state


def _edited(i: int) -> list[m.Doc]:
    """The edited service: two fixed endpoints and a third whose address is 10.250.0.i."""
    pods = [m.endpoint(PodSpec(f"e{j}", NodeSpec("node2", 2), 100 + j)) for j in range(2)]
    extra = {"addresses": [f"10.250.0.{i}"], "conditions": {"ready": True}, "nodeName": "node2"}
    return [m.service("edited", ("10.96.255.1",), [m.port("http", 80, 8080)]),
            m.endpoint_slice("edited", [*pods, extra], [m.slice_port("http", 8080)])]


def _background(count: int) -> list[m.Doc]:
    docs = []
    for i in range(count):
        pods = [PodSpec(f"b{i}-{j}", NodeSpec("node2", 2), 2 + j) for j in range(10)]
        docs.append(m.service(f"bg{i}", (f"10.96.{1 + i // 250}.{1 + i % 250}",),
                              [m.port("http", 80, 8080)]))
        docs.append(m.endpoint_slice(f"bg{i}", [m.endpoint(p) for p in pods],
                                     [m.slice_port("http", 8080)]))
    return docs


def _wait_in_kernel(ns: str, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "list", "map", "ip", "svcproxy", "endpoints-3"],
            capture_output=True, text=True).stdout:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{needle!r} not in the kernel within {timeout}s")
        time.sleep(0.2)


def edit_latency(edits: int, background: int) -> None:
    print(f"== manifest edit -> rule in the kernel ({edits} edits, {background} other "
          "services of 10 endpoints, --min-sync-period 0, event-driven manifest source)",
          flush=True)
    with Netns("e2e") as ns, tempfile.TemporaryDirectory(prefix="spbench") as tmp:
        work = Path(tmp)
        mdir = work / "manifests"
        mdir.mkdir()
        m.write(mdir, "background.yaml", _background(background))
        m.write(mdir, "node.yaml", [m.node(NodeSpec("node1", 1))])
        m.write(mdir, "edited.yaml", _edited(200))
        sock = work / "api.sock"
        fe = frontend(mdir, sock, work / "frontend.log").start()
        be = None
        monitor = None
        try:
            wait_for_path(sock, process=fe)
            be = Process(["ip", "netns", "exec", ns, *SVCPROXY, "backend", "nft",
                          "--api", f"unix://{sock}", "--node-name", "node1",
                          "--node-ip", "192.168.50.2", "--min-sync-period", "0",
                          "--sync-period", "1h",
                          "--metrics-bind-address", "", "--healthz-bind-address", ""],
                         work / "backend.log").start()
            _wait_in_kernel(ns, "10.250.0.200 . 8080", 120)
            # nft monitor prints elements of the sets it knew when it started.
            monitor = subprocess.Popen(
                ["ip", "netns", "exec", ns, "stdbuf", "-oL", "nft", "monitor", "elements"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            seen: queue.Queue[tuple[float, str]] = queue.Queue()

            def read() -> None:
                assert monitor is not None and monitor.stdout is not None
                for line in monitor.stdout:
                    seen.put((time.perf_counter(), line))

            threading.Thread(target=read, daemon=True).start()
            time.sleep(1.0)
            latencies = []
            for i in range(1, edits + 1):
                while not seen.empty():
                    seen.get()
                t0 = time.perf_counter()
                m.write(mdir, "edited.yaml", _edited(i))
                try:
                    latencies.append(_wait_for(seen, f"10.250.0.{i} . 8080", 10) - t0)
                except TimeoutError:
                    print(f"--- backend log\n{be.tail()}\n--- frontend log\n{fe.tail()}")
                    raise
                time.sleep(0.05)
            latencies.sort()
            p50 = statistics.median(latencies)
            p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
            print(f"   p50 {1e3 * p50:.0f} ms, p99 {1e3 * p99:.0f} ms, "
                  f"max {1e3 * latencies[-1]:.0f} ms")
            assert be.popen is not None
            print(f"   backend process RSS: {rss_mb(be.popen.pid):.0f} MB")
        finally:
            if monitor is not None:
                monitor.terminate()
            for proc in (be, fe):
                if proc is not None:
                    proc.stop()


def _wait_for(seen: queue.Queue[tuple[float, str]], needle: str, timeout: float) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError(f"{needle!r} not seen in the kernel within {timeout}s")
        try:
            at, line = seen.get(timeout=left)
        except queue.Empty:
            continue
        if needle in line:
            return at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--background", type=int, default=0,
                        help="other services in the manifests during the edit test")
    parser.add_argument("--only", choices=("scale", "edits"),
                        help="run only one part of the benchmark")
    parser.add_argument("--inside", action="store_true",
                        help="(internal) run the scale part in the current namespace")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_nft: needs root (creates network namespaces)")
    if args.inside:
        scale(args.services, args.endpoints)
        return
    if args.only != "edits":
        with Netns("scale") as ns:
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside",
                            "--services", str(args.services),
                            "--endpoints", str(args.endpoints)], check=True)
    if args.only != "scale":
        edit_latency(args.edits, args.background)


if __name__ == "__main__":
    main()

"""Frontend cold start: process start -> synced (every Service, EndpointSlice and Node
listed from the apiserver through the official client, parsed, validated and computed).

    .venv/bin/python bench/bench_frontend_cold_start.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--profile] [--sync-only]

The stand-in apiserver (tests/fakeapiserver.py) runs in another process with the
cluster. The frontend runs here as in production (Frontend with --kubeconfig); the
time spent in ``Engine.submit`` (parse, validation, computation, on the event loop) is
measured apart from the rest (the listing: HTTP, JSON decoding, in the reflector
threads). Views are made when a client first asks for one, so the bench then times
the first snapshot of one node, of every other node and of the cluster view (what
100 backends and a cluster watcher connecting right after the sync would cost).
``--profile`` prints where the event loop thread's CPU goes (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APISERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from tests.fakeapiserver import FakeApiserver, write_kubeconfig
    services, endpoints, nodes = (int(a) for a in sys.argv[2:5])
    fake = FakeApiserver(token="t")
    for n in range(nodes):
        fake.create("Node", {"metadata": {"name": f"n{n}", "labels": {
            "topology.kubernetes.io/zone": f"z{n % 3}"}}})
    for i in range(services):
        ip = f"10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
        fake.create("Service", {"metadata": {"name": f"s{i}", "namespace": "bench"},
                    "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80}]}})
        eps = []
        for e in range(endpoints):
            k = i * endpoints + e
            eps.append({"addresses": [f"10.{(k >> 16) + 128}.{(k >> 8) & 255}.{k & 255}"],
                        "nodeName": f"n{k % nodes}", "zone": f"z{k % nodes % 3}",
                        "conditions": {"ready": True}})
        fake.create("EndpointSlice", {
            "metadata": {"name": f"s{i}-a", "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": f"s{i}"}},
            "addressType": "IPv4", "endpoints": eps,
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]})
    write_kubeconfig(Path(sys.argv[5]), fake.url, "t")
    print("ready", flush=True)
    sys.stdin.read()
""")


def start_apiserver(args: argparse.Namespace, kubeconfig: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", APISERVER, str(ROOT), str(args.services),
                             str(args.endpoints), str(args.nodes), str(kubeconfig)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the stand-in apiserver did not start")
    return proc


async def cold_start(kubeconfig: Path, sock: Path, profile: bool, sync_only: bool) -> None:
    from svcproxy.frontend.engine import Engine
    from svcproxy.frontend.main import Frontend, FrontendOptions

    in_submit = [0.0, 0]
    submit = Engine.submit

    def timed(self: Engine, events: object) -> None:
        start = time.perf_counter()
        submit(self, events)  # type: ignore[arg-type]
        in_submit[0] += time.perf_counter() - start
        in_submit[1] += 1

    Engine.submit = timed  # type: ignore[method-assign]
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    cpu0, t0 = time.process_time(), time.perf_counter()
    frontend = Frontend(FrontendOptions(kubeconfig=str(kubeconfig), listen=f"unix://{sock}",
                                        metrics_bind_address=""))
    await frontend.start()
    await frontend.engine.synced.wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if profiler is not None:
        profiler.disable()
    engine = frontend.engine
    print(f"synced in {wall:.2f} s wall, {cpu:.2f} s CPU (this process, every thread): "
          f"{len(engine.store.services)} services, {len(engine.store.slices)} slices, "
          f"{len(engine.store.nodes)} nodes")
    print(f"  Engine.submit (parse, validate, compute; {in_submit[1]} batches): "
          f"{in_submit[0]:.2f} s; the rest (list: HTTP, JSON, events) "
          f"{wall - in_submit[0]:.2f} s of the wall time")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    names = [] if sync_only else sorted(engine.store.nodes)
    for what, batch in (("first node", names[:1]), (f"{len(names) - 1} other nodes", names[1:]),
                        ("the cluster view", [""])) if names else ():
        cpu0, t0 = time.process_time(), time.perf_counter()
        size = sum(len(m) for name in batch
                   for m in engine.snapshots.snapshot(engine.changelog.view(name)))
        print(f"  then the snapshot of {what}: {time.perf_counter() - t0:.2f} s wall, "
              f"{time.process_time() - cpu0:.2f} s CPU ({size / 1e6:.1f} MB)")
    await frontend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--profile", action="store_true",
                        help="print where the loop thread's CPU goes (cProfile)")
    parser.add_argument("--sync-only", action="store_true",
                        help="stop at the sync (no snapshots): for instruction counts, e.g. "
                        "under valgrind --tool=cachegrind, which a loaded machine leaves exact")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load "
          f"{os.getloadavg()[0]:.1f}; {args.services} services x {args.endpoints} endpoints,"
          f" {args.nodes} nodes", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        t0 = time.perf_counter()
        apiserver = start_apiserver(args, kubeconfig)
        print(f"stand-in apiserver filled in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            asyncio.run(cold_start(kubeconfig, Path(tmp) / "api.sock", args.profile,
                                   args.sync_only))
        finally:
            assert apiserver.stdin is not None
            apiserver.stdin.close()
            apiserver.wait(10)


if __name__ == "__main__":
    main()

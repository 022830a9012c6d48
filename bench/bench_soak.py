"""Soak benchmark: a fixed world churned for as long as asked; the frontend's memory must
stay where it was after the warm-up (issue 28).

    .venv/bin/python bench/bench_soak.py [--minutes 60] [--rate 50] [--services 60]
        [--endpoints 6] [--nodes 20] [--watchers 20] [--names 1000] [--interval 60]
        [--warmup 10] [--json FILE] [--svg FILE] [--unbounded]
    .venv/bin/python bench/bench_soak.py --cpu [--changes 400]

The stand-in apiserver (tests/support/fakeapiserver.py) holds ``--services`` Services with one
EndpointSlice of ``--endpoints`` pods each on ``--nodes`` Nodes; ``--rate`` changes a
second churn it as rollouts do (tests/support/soak.py: a pod goes terminating, is replaced by a
new IP not ready yet, turns ready; readiness flips), the object count flat. The frontend
runs as ``svcproxy frontend --kubeconfig`` in its own process (with tracemalloc on:
what Python allocated, besides RSS), ``--watchers`` SDK NodeStateClients watch one node
each, and with ``--names N`` a prober asks GetNodeState about N distinct names that are
no Node, one after another, 5 a second. Every ``--interval`` seconds the frontend
prints its RSS, Python-allocated memory, the encoder's cache entries, its views and
their history's bytes; at the end, the slope of RSS and allocated memory after
``--warmup`` minutes (MB per hour, least squares) and RSS at the end over RSS at the
warm-up's end (the goal: at most 1.1). ``--unbounded`` runs the frontend with the
bounds off (huge --history-max-bytes, no cache sweep) to see what they hold back.

``--cpu``: the frontend's CPU per change with the bounds and without them, side by side
in one run, counted in instructions by valgrind's callgrind (not seconds: the machine is
shared). Each way the engine (in-process, watched views, snapshots taken as new streams
take them) applies ``--changes`` and twice as many changes of the same world; the
difference over ``--changes`` is the instructions of one change, set-up excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402

from bench import svgplot  # noqa: E402
from bench.svgplot import Axis, Plot, Series  # noqa: E402
from svcproxy.sdk.client import NodeStateClient, open_channel  # noqa: E402
from svcproxy.v1 import nodestate_pb2 as pb  # noqa: E402
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig  # noqa: E402
from tests.support.soak import Rollouts  # noqa: E402

UNBOUNDED = ["--history-max-bytes", str(1 << 62), "--max-views", str(1 << 30)]


# ---- the frontend's side (``--child``): the real CLI, reporting on itself ----------------
def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _mallinfo() -> dict[str, int]:
    """glibc's heap: bytes in use, free inside the arenas (fragmentation), mmapped."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {"heap_used": info.uordblks, "heap_free": info.fordblks, "mmapped": info.hblkhd,
            "arenas_bytes": info.arena}


def _rss_by_mapping() -> dict[str, int]:
    """RSS by kind of mapping (/proc/self/smaps): glibc's main heap, anonymous 1 MiB
    mappings (Python's object arenas: pymalloc's stats are hidden under tracemalloc), other
    anonymous memory (glibc's thread arenas, large blocks, stacks), files (code)."""
    out = {"rss_heap": 0, "rss_pyarenas": 0, "rss_anon": 0, "rss_files": 0}
    kind = "rss_files"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=6)
            if "-" in first[0] and not first[0].endswith(":"):
                low, high = (int(x, 16) for x in first[0].split("-"))
                name = first[5].strip() if len(first) > 5 else ""
                kind = ("rss_heap" if name == "[heap]" else "rss_files" if name
                        else "rss_pyarenas" if high - low == 1 << 20 else "rss_anon")
            elif first[0] == "Rss:":
                out[kind] += int(first[1]) * 1024
    return out


def _diagnose(out: Any, base: Any, counts: dict[str, int], group: str) -> None:
    """Where allocations grew since the baseline (by ``group``), and which types."""
    import gc
    import tracemalloc
    from collections import Counter

    now = tracemalloc.take_snapshot()
    for stat in now.compare_to(base, group)[:15]:
        print(stat, file=out)
        if group == "traceback":
            for line in stat.traceback.format()[-12:]:
                print("   ", line, file=out)
    types = Counter(type(o).__name__ for o in gc.get_objects())
    grew = sorted(((n - counts.get(t, 0), t) for t, n in types.items()), reverse=True)[:15]
    print("gc objects", sum(types.values()), "grew:", grew, file=out)
    print("----", file=out, flush=True)


def _report(frontends: list[Any], interval: float, applied: list[int]) -> None:
    """Every ``interval`` seconds one JSON line of what the frontend holds.

    Diagnostics by the environment: SOAK_TOP (a file) gets, every sample after
    SOAK_BASE seconds (300), where allocations grew since the sample at SOAK_BASE
    (grouped by traceback with SOAK_FRAMES > 1) and which object types grew;
    SOAK_TRIM=1 calls malloc_trim(0) before each sample (RSS before it is kept)."""
    import ctypes
    import gc
    import tracemalloc
    from collections import Counter

    start = time.monotonic()
    top = os.environ.get("SOAK_TOP")
    base_at = float(os.environ.get("SOAK_BASE", "300"))
    group = "traceback" if tracemalloc.get_traceback_limit() > 1 else "lineno"
    trim = os.environ.get("SOAK_TRIM") == "1"
    base: Any = None
    counts: dict[str, int] = {}
    while True:
        time.sleep(interval)
        if not frontends:
            continue
        t = time.monotonic() - start
        extra: dict[str, Any] = {}
        if trim:
            extra["rss_untrimmed"] = _rss()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        if top and base is None and t >= base_at:
            base = tracemalloc.take_snapshot()
            counts = dict(Counter(type(o).__name__ for o in gc.get_objects()))
        elif top and base is not None:
            with open(top, "a") as out:
                print(f"t={t:.0f}s", file=out)
                _diagnose(out, base, counts, group)
        log = frontends[0].engine.changelog
        views = list(log.views.values())
        print(json.dumps({
            "t": t, "rss": _rss(), "applied": applied[0],
            "traced": tracemalloc.get_traced_memory()[0], "revision": log.revision,
            "encoder": log.digests.encoder.sizes(), "sweeps": log.digests.encoder.sweeps,
            "views": len(views), "history_bytes": log.history_bytes,
            "history_ops": sum(v.history_ops for v in views),
            "history_batches": sum(len(v.history) for v in views), **_mallinfo(),
            **_rss_by_mapping(),
            "gc_objects": len(gc.get_objects()), **extra}), flush=True)


def child(argv: list[str], interval: float, unbounded: bool) -> int:
    import tracemalloc

    if os.environ.get("SOAK_TRACEMALLOC") != "0":  # --no-tracemalloc: RSS as in production
        tracemalloc.start(int(os.environ.get("SOAK_FRAMES", "1")))
    from svcproxy import cli
    from svcproxy.frontend import main as frontend_main
    from svcproxy.frontend.sources.events import Upsert

    frontends: list[Any] = []
    made = frontend_main.Frontend.__init__

    def keep(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        if unbounded:
            self.engine.changelog.digests.encoder.floor = 1 << 62
            self.engine.changelog.digests.encoder._allowance = 1 << 62
        submit = self.engine.submit

        def counted(events: Any) -> None:
            """Count the slices' changes applied (the listing aside)."""
            events = list(events)
            applied[0] += sum(isinstance(e, Upsert) and e.kind == "EndpointSlice"
                              for e in events)
            submit(events)

        self.engine.submit = counted
        frontends.append(self)

    applied = [0]
    frontend_main.Frontend.__init__ = keep  # type: ignore[method-assign]
    threading.Thread(target=_report, args=(frontends, interval, applied),
                     daemon=True).start()
    return cli.main(["frontend", *argv])


# ---- the driver's side -------------------------------------------------------------------
def _paced(rate: float, stop: threading.Event, step: Any) -> None:
    """Call ``step`` ``rate`` times a second (on a fixed schedule: a late one catches up)."""
    period, due = 1.0 / rate, time.monotonic()
    while not stop.is_set():
        due += period
        delay = due - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        step()


def _prober(target: str, names: int, stop: threading.Event) -> None:
    """GetNodeState for ``names`` distinct names that are no Node, 5 a second."""
    count = [0]
    with open_channel(target) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)

        def ask() -> None:
            try:
                stub.GetNodeState(pb.GetNodeStateRequest(
                    node_name=f"probe-{count[0] % names}"), timeout=10)
            except grpc.RpcError:
                pass
            count[0] += 1

        _paced(5.0, stop, ask)


def _wait_ready(target: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open_channel(target) as channel:
                pb_grpc.NodeStateServiceStub(channel).GetNodeState(
                    pb.GetNodeStateRequest(node_name="node-0", page_size=1), timeout=5)
            return
        except grpc.RpcError:
            time.sleep(0.2)
    raise SystemExit("the frontend did not serve within 5 minutes")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 for fewer than two)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def summary(samples: list[dict[str, Any]], warmup: float) -> dict[str, float]:
    """Slopes after the warm-up (MB per hour) and RSS at the end over RSS at its end."""
    after = [s for s in samples if s["t"] >= warmup * 60]
    if not after:
        return {}
    mb = 1 << 20
    return {"rss_mb_per_hour": slope([(s["t"] / 3600, s["rss"] / mb) for s in after]),
            "traced_mb_per_hour": slope([(s["t"] / 3600, s["traced"] / mb) for s in after]),
            "rss_end_over_warmup": samples[-1]["rss"] / after[0]["rss"],
            "traced_end_over_warmup": (samples[-1]["traced"] / after[0]["traced"]
                                       if after[0]["traced"] else 0.0),  # --no-tracemalloc
            "minutes": samples[-1]["t"] / 60}


def soak(args: argparse.Namespace) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    world = Rollouts(args.services, args.endpoints, args.nodes)
    fake = FakeApiserver(bookmark_interval=1.0)
    for kind, objs in world.objects().items():
        for obj in objs:
            fake.create(kind, obj)
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", fake.url)
    target = f"unix://{tmp / 'api.sock'}"
    flags = ["--kubeconfig", str(kubeconfig), "--listen", target, "--metrics-bind-address",
             "", "--unary-qps-per-peer", "0"] + (UNBOUNDED if args.unbounded else [])
    if args.history_max_bytes:
        flags += ["--history-max-bytes", str(args.history_max_bytes)]
    env = os.environ | ({"SOAK_TRACEMALLOC": "0"} if args.no_tracemalloc else {})
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "--interval", str(args.interval)]
        + (["--unbounded"] if args.unbounded else []) + ["--", *flags], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    clients: list[NodeStateClient] = []
    try:
        _wait_ready(target)
        clients = [NodeStateClient(target, f"node-{i % args.nodes}", max_backoff=1.0)
                   for i in range(args.watchers)]
        for client in clients:
            client.start()

        def change() -> None:
            fake.update("EndpointSlice", world.step())
            for client in clients:
                client.take()

        threads = [threading.Thread(target=_paced, args=(args.rate, stop, change),
                                    daemon=True)]
        if args.names:
            threads.append(threading.Thread(target=_prober, args=(target, args.names, stop),
                                            daemon=True))
        for thread in threads:
            thread.start()
        print(f"soak: {args.services} services x {args.endpoints} endpoints, {args.nodes} "
              f"nodes, {args.watchers} watchers, {args.names} names, {args.rate:g} "
              f"changes/s for {args.minutes:g} min (nproc {os.cpu_count()}, "
              f"{os.uname().release})", flush=True)
        assert proc.stdout is not None
        end = time.monotonic() + args.minutes * 60
        for line in proc.stdout:
            sample = json.loads(line)
            sample["changes"] = world.changes
            samples.append(sample)
            enc = sample["encoder"]
            print(f"{sample['t'] / 60:6.1f} min  rss {sample['rss'] / 2**20:7.1f} MB  "
                  f"python {sample['traced'] / 2**20:7.1f} MB  changes {world.changes:8d} "
                  f"(behind {world.changes - sample['applied']:5d})  "
                  f"encoder {sum(enc.values()):7d} entries ({sample['sweeps']} sweeps)  "
                  f"views {sample['views']:4d}  history {sample['history_bytes'] / 2**20:6.1f}"
                  f" MB / {sample['history_ops']} ops  malloc used "
                  f"{sample['heap_used'] / 2**20:.1f} free {sample['heap_free'] / 2**20:.1f}"
                  f" mmapped {sample['mmapped'] / 2**20:.1f} MB  rss: heap "
                  f"{sample['rss_heap'] / 2**20:.1f} arenas "
                  f"{sample['rss_pyarenas'] / 2**20:.1f} anon "
                  f"{sample['rss_anon'] / 2**20:.1f} files "
                  f"{sample['rss_files'] / 2**20:.1f} MB  batches "
                  f"{sample['history_batches']}"
                  + (f"  rss before malloc_trim {sample['rss_untrimmed'] / 2**20:.1f} MB"
                     if "rss_untrimmed" in sample else ""), flush=True)
            if time.monotonic() >= end:
                break
    finally:
        stop.set()
        for client in clients:
            client.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        fake.stop()
    return samples


def memory_plot(samples: list[dict[str, Any]], warmup: float, title: str) -> Plot:
    """RSS and Python-allocated MB over minutes, the warm-up's end marked."""
    minutes = [s["t"] / 60 for s in samples]
    series = tuple(Series(name, tuple(zip(minutes, (s[key] / 2**20 for s in samples),
                                          strict=True)), color)
                   for name, key, color in (("RSS", "rss", "#2166ac"),
                                            ("Python (tracemalloc)", "traced", "#b2182b")))
    return Plot(title, Axis("minutes of churn"), Axis(unit=" MB"), series, marks=(warmup,))


def svg(samples: list[dict[str, Any]], warmup: float, title: str, path: Path) -> None:
    """The memory plot, written to ``path``."""
    svgplot.write(path, [memory_plot(samples, warmup, title)])


# ---- CPU per change (``--cpu``) ----------------------------------------------------------
def cpu_child(changes: int, bounded: bool) -> None:
    """Apply ``changes`` changes of the world to an in-process engine (watched views, a
    snapshot of one every 20 changes, as new streams take them)."""
    from svcproxy.frontend.pipeline.engine import Engine
    from svcproxy.frontend.publication.changelog import ViewBounds
    from svcproxy.frontend.sources.events import Replace, Upsert

    world = Rollouts(60, 6, 20)
    # Bounded: the caches swept as often as their live set allows (the floor below it)
    # and the histories past their budget from the start, so the window counts the
    # bounds' work at its most.
    bounds = ViewBounds(history_bytes=4 << 20, cache_floor=256) if bounded else ViewBounds(
        history_bytes=1 << 62, cache_floor=1 << 62)
    engine = Engine(bounds=bounds)
    engine.submit([Replace(kind, objs)  # type: ignore[arg-type]
                   for kind, objs in world.objects().items()])
    views = [engine.changelog.watch(f"node-{i}") for i in range(20)]
    steps = [world.step() for _ in range(changes)]
    for i, obj in enumerate(steps):
        engine.submit([Upsert("EndpointSlice", obj)])
        if i % 20 == 0:
            for _ in engine.snapshots.snapshot(views[i // 20 % len(views)]):
                pass


def _instructions(changes: int, bounded: bool, tmp: Path) -> int:
    out = tmp / f"callgrind.{changes}.{int(bounded)}"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, __file__, "--cpu-child", "--changes", str(changes)]
                   + ([] if bounded else ["--unbounded"]),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for line in out.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no instruction count in {out}")


def cpu(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-cpu-"))
    per: dict[str, float] = {}
    for name, bounded in (("without bounds", False), ("with bounds", True)):
        one = _instructions(args.changes, bounded, tmp)
        two = _instructions(2 * args.changes, bounded, tmp)
        per[name] = (two - one) / args.changes
        print(f"{name:15s}: {per[name] / 1e6:7.2f} M instructions per change "
              f"({one / 1e6:.0f} M for {args.changes}, {two / 1e6:.0f} M for "
              f"{2 * args.changes})", flush=True)
    ratio = per["with bounds"] / per["without bounds"]
    print(f"bounds cost: {100 * (ratio - 1):+.1f}% instructions per change (callgrind; "
          f"nproc {os.cpu_count()}, {os.uname().release})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=50.0, help="changes per second")
    p.add_argument("--services", type=int, default=60)
    p.add_argument("--endpoints", type=int, default=6)
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--watchers", type=int, default=20)
    p.add_argument("--names", type=int, default=0,
                   help="distinct unknown names asked about by GetNodeState (0: none)")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=10.0, help="minutes before the slope")
    p.add_argument("--json", type=Path, help="write the samples here")
    p.add_argument("--svg", type=Path, help="plot RSS and allocated memory here")
    p.add_argument("--history-max-bytes", type=int, default=0,
                   help="the frontend's --history-max-bytes (0: its default); small, "
                   "the histories are full soon")
    p.add_argument("--no-tracemalloc", action="store_true",
                   help="the frontend without tracemalloc (its own tables live in malloc's "
                   "heap): RSS as in production, no Python-allocated figure")
    p.add_argument("--unbounded", action="store_true", help="the frontend without bounds")
    p.add_argument("--cpu", action="store_true", help="CPU per change, bounds on and off")
    p.add_argument("--changes", type=int, default=400)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        raise SystemExit(child(args.rest, args.interval, args.unbounded))
    if args.cpu_child:
        cpu_child(args.changes, not args.unbounded)
        return
    if args.cpu:
        cpu(args)
        return
    samples = soak(args)
    result = summary(samples, args.warmup)
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json),
                                                               "svg": str(args.svg)},
                                         "samples": samples, "summary": result}, indent=1))
    if args.svg and samples:
        svg(samples, args.warmup, f"frontend memory, {args.rate:g} changes/s, "
            f"{args.services} services, {args.names} names probed", args.svg)
        print(f"plot: {args.svg}")


if __name__ == "__main__":
    main()

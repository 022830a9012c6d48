"""Frontend cold start: 10,000 services x 10 endpoints, 100 nodes listed from the
stand-in apiserver (tests/support/fakeapiserver.py, another process) through the official client,
parsed, validated and computed, until the frontend is synced. Two figures:

- **from process start**: ``svcproxy frontend --kubeconfig ... --listen unix://...`` run
  as a process, from its start to its "frontend synced" log line (wall, and its CPU time
  then from /proc), interpreter, imports and all, with its modules' bytecode cached as an
  installed package has it (``$PYTHONPYCACHEPREFIX``, .cache/bench-pycache, filled by one
  uncounted start);
- **in process**: a Frontend made in this process, after the imports, to its sync, with
  the time in ``Engine.submit`` (parse, validation, computation, on the event loop) apart
  from the rest (the listing: HTTP, JSON decoding, in the reflector threads).

    .venv/bin/python bench/bench_frontend_cold_start.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--profile] [--sync-only] [--before DIR [--after DIR] [--rounds 3]]
        [--python PYTHON [--rounds 3]]

Views are made when a client first asks for one, so the bench then times the first
snapshot of one node, of every other node and of the cluster view (what 100 backends and
a cluster watcher connecting right after the sync would cost). ``--profile`` prints where
the event loop thread's CPU goes (cProfile). ``--before DIR`` compares with another
commit's checkout (``git worktree add --detach DIR COMMIT``, mapped as
bench_local_cold_start.py maps it; ``--after DIR`` another, default this tree): both
figures of both trees, alternating (ABBA...), against one apiserver, with medians and
ratios. ``--python PYTHON`` runs this tree's frontend under this interpreter and under
PYTHON alternately: the interpreter's build matters (a CPython built with PGO and LTO, as
the image's python:3.11-slim is, against a plain build such as pyenv's default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench_local_cold_start import cpu_seconds, interpreter_venv, prepare_tree, stop

ROOT = Path(__file__).resolve().parents[1]
PYCACHE = ROOT / ".cache" / "bench-pycache"
IN_PROCESS = re.compile(r"synced in ([0-9.]+) s wall, ([0-9.]+) s CPU")
APISERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
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


def children(pid: int) -> set[int]:
    """The live child processes of ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found.update(int(c) for c in (task / "children").read_text().split())
    return found


def children_cpu(pid: int, leave_out: frozenset[int] = frozenset()) -> float:
    """The CPU seconds of ``pid``'s live children but ``leave_out`` (the frontend's CPU
    figures are its own and its children's, such as stream workers)."""
    total = 0.0
    for child in children(pid) - leave_out:
        with contextlib.suppress(OSError):
            total += cpu_seconds(child)
    return total


def start_apiserver(args: argparse.Namespace, kubeconfig: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", APISERVER, str(ROOT), str(args.services),
                             str(args.endpoints), str(args.nodes), str(kubeconfig)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the stand-in apiserver did not start")
    return proc


async def cold_start(kubeconfig: Path, sock: Path, profile: bool, sync_only: bool) -> None:
    from svcproxy.frontend.main import Frontend, FrontendOptions
    from svcproxy.frontend.pipeline.engine import Engine

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
    others = frozenset(children(os.getpid()))  # the stand-in, when this process started it
    cpu0, t0 = time.process_time(), time.perf_counter()
    frontend = Frontend(FrontendOptions(kubeconfig=str(kubeconfig), listen=f"unix://{sock}",
                                        metrics_bind_address=""))
    await frontend.start()
    await frontend.engine.synced.wait()
    children_s = children_cpu(os.getpid(), others)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0 + children_s
    if profiler is not None:
        profiler.disable()
    engine = frontend.engine
    print(f"in process (after the imports): synced in {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"(this process, every thread, and its children's {children_s:.2f} s): "
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


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process of ``tree``'s svcproxy (another checkout first on the
    path, ahead of this tree's editable install), its bytecode cached."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    if tree != ROOT:
        env["PYTHONPATH"] = str(tree)
    return env


def from_process_start(kubeconfig: Path, sock: Path, tree: Path = ROOT,
                       python: str = sys.executable) -> tuple[float, float]:
    """Wall and CPU seconds (with its children's) from starting ``svcproxy frontend``
    (``tree``'s, run by ``python``) to its "frontend synced"."""
    start = time.monotonic()
    proc = subprocess.Popen([python, "-m", "svcproxy.cli", "frontend", "--kubeconfig",
                             str(kubeconfig), "--listen", f"unix://{sock}",
                             "--metrics-bind-address", ""], env=tree_env(tree),
                            stderr=subprocess.PIPE, text=True, cwd=tree)  # -m: cwd first
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "frontend synced" in line:
                wall = time.monotonic() - start
                return wall, cpu_seconds(proc.pid) + children_cpu(proc.pid)
        raise RuntimeError("the frontend ended before syncing")
    finally:
        stop(proc)


def in_process(kubeconfig: Path, tree: Path) -> tuple[float, float]:
    """The in-process figure (wall, CPU) of ``tree``, from this bench run in a process of
    its own against the running apiserver."""
    out = subprocess.run([sys.executable, __file__, "--kubeconfig", str(kubeconfig),
                          "--sync-only"], env=tree_env(tree), capture_output=True, text=True,
                         check=True, timeout=600).stdout
    m = IN_PROCESS.search(out)
    if m is None:
        raise RuntimeError(f"no figure in {out!r}")
    return float(m[1]), float(m[2])


def compare(kubeconfig: Path, tmp: Path, before: Path, after: Path, rounds: int) -> None:
    """Both figures of ``before``'s tree and of ``after``'s, alternating (ABBA...)."""
    for tree in {before, after} - {ROOT}:
        prepare_tree(tree)
    for tree in (before, after):
        from_process_start(kubeconfig, tmp / "warm.sock", tree)  # fills the bytecode cache
    runs: dict[str, list[tuple[float, float, float, float]]] = {"before": [], "after": []}
    for i in range(rounds):
        for which in ("before", "after") if i % 2 == 0 else ("after", "before"):
            tree = before if which == "before" else after
            start = from_process_start(kubeconfig, tmp / f"{which}{i}.sock", tree)
            inside = in_process(kubeconfig, tree)
            runs[which].append((*start, *inside))
            print(f"round {i + 1} {which:<6} from process start {start[0]:.2f} s wall, "
                  f"{start[1]:.2f} s CPU; in process {inside[0]:.2f} s wall, {inside[1]:.2f} s "
                  f"CPU (load {os.getloadavg()[0]:.1f})", flush=True)
    med = {w: [statistics.median(r[k] for r in rs) for k in range(4)] for w, rs in runs.items()}
    names = ("from process start wall", "CPU", "in process wall", "CPU")
    for k, name in enumerate(names):
        print(f"median {name}: before {med['before'][k]:.2f} s, after {med['after'][k]:.2f} s "
              f"(after/before {med['after'][k] / med['before'][k]:.2f})")


def compare_interpreters(kubeconfig: Path, tmp: Path, python: str, rounds: int) -> None:
    """From process start, this interpreter against ``python`` (ABBA...), same tree."""
    other, tree = interpreter_venv(python)
    runs: dict[str, list[tuple[float, float]]] = {"this": [], "other": []}
    for which, exe, where in (("this", sys.executable, ROOT), ("other", other, tree)):
        from_process_start(kubeconfig, tmp / f"warm-{which}.sock", where, exe)
    for i in range(rounds):
        for which in ("this", "other") if i % 2 == 0 else ("other", "this"):
            exe, where = (sys.executable, ROOT) if which == "this" else (other, tree)
            wall, cpu = from_process_start(kubeconfig, tmp / f"{which}{i}.sock", where, exe)
            runs[which].append((wall, cpu))
            print(f"round {i + 1} {which:<5} from process start {wall:.2f} s wall, "
                  f"{cpu:.2f} s CPU (load {os.getloadavg()[0]:.1f})", flush=True)
    for k, name in enumerate(("wall", "CPU")):
        this, that = (statistics.median(r[k] for r in runs[w]) for w in ("this", "other"))
        print(f"median {name}: {sys.executable} {this:.2f} s, {python} {that:.2f} s "
              f"({python}/this {that / this:.2f})")


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
    parser.add_argument("--before", type=Path, help="another commit's checkout to compare with")
    parser.add_argument("--after", type=Path, default=ROOT,
                        help="the checkout compared with --before's (default this tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", metavar="PYTHON",
                        help="compare this interpreter with PYTHON (e.g. a PGO+LTO build as "
                        "the image's, /usr/bin/python3.11 on Debian), from process start, "
                        "alternating --rounds times; PYTHON's virtualenv is made in .cache")
    parser.add_argument("--kubeconfig", type=Path,
                        help="a running apiserver's (no stand-in started): the in-process "
                        "figure alone")
    args = parser.parse_args()
    if args.kubeconfig is not None:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(cold_start(args.kubeconfig, Path(tmp) / "api.sock", args.profile,
                                   args.sync_only))
        return
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load "
          f"{os.getloadavg()[0]:.1f}; {args.services} services x {args.endpoints} endpoints,"
          f" {args.nodes} nodes", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        t0 = time.perf_counter()
        apiserver = start_apiserver(args, kubeconfig)
        print(f"stand-in apiserver filled in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            if args.python is not None:
                compare_interpreters(kubeconfig, Path(tmp), args.python, args.rounds)
                return
            if args.before is not None:
                compare(kubeconfig, Path(tmp), args.before.resolve(), args.after.resolve(),
                        args.rounds)
                return
            from_process_start(kubeconfig, Path(tmp) / "warm.sock")  # the bytecode cache
            wall, cpu = from_process_start(kubeconfig, Path(tmp) / "start.sock")
            print(f"from process start (svcproxy frontend): synced in {wall:.2f} s wall, "
                  f"{cpu:.2f} s CPU (load {os.getloadavg()[0]:.1f})", flush=True)
            asyncio.run(cold_start(kubeconfig, Path(tmp) / "api.sock", args.profile,
                                   args.sync_only))
        finally:
            assert apiserver.stdin is not None
            apiserver.stdin.close()
            try:
                apiserver.wait(60)
            except subprocess.TimeoutExpired:
                apiserver.kill()
                apiserver.wait()


if __name__ == "__main__":
    main()

"""What the edge's typed decode of listed objects costs (issue 29 item 3).

    .venv/bin/python bench/bench_edge_decode.py [--objects 2000] [--endpoints 10]
        [--rounds 20] [--before DIR [--after DIR]]

Decodes the listed items bench_frontend_cold_start.py serves (N Services of one port,
N EndpointSlices of M endpoints each, as JSON) with the intake's typed paths,
``decode_service`` and ``decode_slice``, and prints the CPU microseconds per object of
each kind (the best round, and the median). Every object must take the typed path.
``--before DIR`` compares with another commit's checkout (``git worktree add --detach DIR
COMMIT``, mapped as bench_local_cold_start.py maps it): a process for each tree, their
rounds alternating (ABBA...), and the ratios after/before of the best rounds and the
median of the rounds' ratios pair by pair (``--after DIR``: another checkout, not this
tree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("Service", "EndpointSlice")


def items(objects: int, endpoints: int) -> dict[str, list[bytes]]:
    """Services and EndpointSlices as the stand-in apiserver lists them."""
    services, slices = [], []
    for i in range(objects):
        meta = {"name": f"s{i}", "namespace": "bench", "uid": f"u{i}", "resourceVersion": "3",
                "creationTimestamp": "2026-11-27T05:00:00Z"}
        services.append(json.dumps({"metadata": meta, "spec": {
            "clusterIP": f"10.96.{i // 250 % 250}.{i % 250 + 1}",
            "ports": [{"name": "p", "port": 80}]}}).encode())
        eps = [{"addresses": [f"10.{(k >> 16) + 128}.{(k >> 8) & 255}.{k & 255}"],
                "nodeName": f"n{k % 100}", "zone": f"z{k % 3}", "conditions": {"ready": True}}
               for k in range(i * endpoints, (i + 1) * endpoints)]
        slices.append(json.dumps({
            "metadata": dict(meta, name=f"s{i}-a", labels={"kubernetes.io/service-name": f"s{i}"}),
            "addressType": "IPv4", "endpoints": eps,
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]}).encode())
    return {"Service": services, "EndpointSlice": slices}


def worker(objects: int, endpoints: int) -> None:
    """Answers each kind read on stdin with one round's CPU seconds per object."""
    from svcproxy.frontend.edge.limits import ObjectLimits
    from svcproxy.frontend.intake.intake import _TYPED

    data, limits = items(objects, endpoints), ObjectLimits()
    print("ready", flush=True)
    for line in sys.stdin:
        kind = line.strip()
        decode = _TYPED[kind]
        t0 = time.process_time()
        for item in data[kind]:
            if decode(item, limits) is None:
                raise SystemExit(f"a {kind} took the general path")
        print((time.process_time() - t0) / len(data[kind]), flush=True)


def start(tree: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    """A worker importing svcproxy from ``tree`` (run outside it: no checkout on the path)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--objects",
         str(args.objects), "--endpoints", str(args.endpoints)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir(),
        env=dict(os.environ, PYTHONPATH=str(tree)))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def one_round(proc: subprocess.Popen[str], kind: str) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(kind + "\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--before", type=Path, help="another commit's checkout to compare with")
    parser.add_argument("--after", type=Path, default=ROOT,
                        help="the checkout compared (default this tree)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.objects, args.endpoints)
    trees = {"after": args.after, **({"before": args.before} if args.before else {})}
    procs = {name: start(tree, args) for name, tree in trees.items()}
    times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in trees for k in KINDS}
    try:
        for r in range(args.rounds):
            for kind in KINDS:
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    times[name, kind].append(one_round(procs[name], kind))
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    for kind in KINDS:
        line = "  ".join(f"{name} best {min(times[name, kind]) * 1e6:6.2f} median "
                         f"{statistics.median(times[name, kind]) * 1e6:6.2f}" for name in trees)
        if args.before:
            after, before = times["after", kind], times["before", kind]
            pairs = statistics.median(a / b for a, b in zip(after, before, strict=True))
            line += f"  after/before best {min(after) / min(before):.3f} pairs {pairs:.3f}"
        print(f"decode {kind:<14} us CPU per object: {line}", flush=True)


if __name__ == "__main__":
    main()

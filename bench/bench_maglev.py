"""Maglev tables (backends/ebpf/maglev.py): flows moved when an endpoint leaves, and how
long the tables take to build. No root.

1. 10,000 flows (distinct client addresses and ports to one NodePort) over 10 endpoints;
   one endpoint removed: how many flows now map to another endpoint, with Maglev and
   with a random pick (what a flow whose connection-tracking entry is gone gets from the
   ``random`` algorithm: a fresh draw over the remaining endpoints).
2. The tables of ``--services`` service ports x 10 endpoints as the backend writes them:
   each service port has ``--addresses`` frontends (ClusterIP, NodePort on each node
   address, externalIPs), each its own endpoint set in the maps; ``maglev.tables`` builds
   one table per distinct endpoint list, its loop in C (``native/maglev.c``, when built).
   Beside it in the same run, the same tables by the pure Python loop
   (``maglev.reference``, what every build was before the helper) for the first
   ``--compare`` service ports (all of them: ``--compare`` = ``--services``), each
   checked equal to the helper's. CPU seconds (``time.process_time``): on a shared
   machine the wall clock says more about the neighbours.

Usage: .venv/bin/python bench/bench_maglev.py [--size 16381] [--services 10000]
       [--addresses 4] [--compare 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.backends.ebpf import maglev, maglev_native  # noqa: E402


def flows_moved(size: int, flows: int, endpoints: int, seed: int) -> tuple[float, float]:
    """(Maglev, random): the fraction of ``flows`` whose endpoint changes."""
    rnd = random.Random(seed)
    eps = [f"10.244.{i}.{rnd.randrange(2, 250)}:8080".encode() for i in range(endpoints)]
    gone = eps[rnd.randrange(endpoints)]
    rest = [e for e in eps if e != gone]
    before, after = maglev.build(eps, size), maglev.build(rest, size)
    node = bytes([192, 168, 50, 2]) + bytes(12)
    moved_maglev = moved_random = 0
    for _ in range(flows):
        client = bytes([192, 168, rnd.randrange(256), rnd.randrange(256)]) + bytes(12)
        h = maglev.flow_hash(client, node, rnd.randrange(1024, 65536), 30080, 6)
        was = eps[before[h % size]]
        moved_maglev += rest[after[h % size]] != was
        moved_random += rnd.choice(rest) != eps[rnd.randrange(endpoints)]
    return moved_maglev / flows, moved_random / flows


def endpoint_sets(services: int, endpoints: int) -> list[list[bytes]]:
    return [[f"10.{s >> 8 & 255}.{s & 255}.{e}:8080".encode() for e in range(endpoints)]
            for s in range(services)]


def build_time(size: int, services: int, endpoints: int, addresses: int) -> float:
    """CPU seconds to build the tables of every set the maps hold, as the backend does."""
    sets = [eps for eps in endpoint_sets(services, endpoints) for _ in range(addresses)]
    start = time.process_time()
    built = maglev.tables(sets, size)
    assert len(built) == services
    return time.process_time() - start


def build_time_python(size: int, services: int, endpoints: int) -> float:
    """CPU seconds of the pure Python loop for the same distinct tables, each checked
    equal to the one the backend writes."""
    sets = endpoint_sets(services, endpoints)
    start = time.process_time()
    built = [maglev.pack(maglev.reference(eps, size)) for eps in sets]
    seconds = time.process_time() - start
    assert built == [maglev.table(eps, size) for eps in sets]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=maglev.DEFAULT_SIZE)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--flows", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--addresses", type=int, default=4)
    parser.add_argument("--compare", type=int, default=200)
    args = parser.parse_args()
    for seed in range(args.rounds):
        m, r = flows_moved(args.size, args.flows, 10, seed)
        print(f"table {args.size}, 1 of 10 endpoints removed: {m:.1%} of {args.flows} flows "
              f"moved with maglev (goal <= 12%), {r:.1%} with random")
    n, k = args.services, args.addresses
    helper = "C helper" if maglev_native.available() else "no C helper: Python"
    seconds = build_time(args.size, n, 10, k)
    print(f"{n} service ports x {k} addresses x 10 endpoints, table {args.size}: "
          f"{n} tables built in {seconds:.2f} s CPU ({seconds / n * 1000:.3f} ms each, "
          f"{helper})")
    if args.compare:
        m = min(args.compare, n)
        old = build_time_python(args.size, m, 10)
        print(f"the same {m} tables by the Python loop: {old:.2f} s CPU "
              f"({old / m * 1000:.2f} ms each; extrapolated to {n}: {old / m * n:.0f} s, "
              f"{old / m * n / seconds:.0f} x the helper's)")


if __name__ == "__main__":
    main()

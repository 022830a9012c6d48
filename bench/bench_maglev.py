"""Maglev tables (backends/ebpf/maglev.py): flows moved when an endpoint leaves, and how
long the tables take to build. Pure Python, no root.

1. 10,000 flows (distinct client addresses and ports to one NodePort) over 10 endpoints;
   one endpoint removed: how many flows now map to another endpoint, with Maglev and
   with a random pick (what a flow whose connection-tracking entry is gone gets from the
   ``random`` algorithm: a fresh draw over the remaining endpoints).
2. The tables of ``--services`` service ports x 10 endpoints, built one by one.

Usage: .venv/bin/python bench/bench_maglev.py [--size 16381] [--services 10000]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.backends.ebpf import maglev  # noqa: E402


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


def build_time(size: int, services: int, endpoints: int) -> float:
    sets = [[f"10.{s >> 8 & 255}.{s & 255}.{e}:8080".encode() for e in range(endpoints)]
            for s in range(services)]
    start = time.perf_counter()
    for eps in sets:
        maglev.build(eps, size)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=maglev.DEFAULT_SIZE)
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--flows", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for seed in range(args.rounds):
        m, r = flows_moved(args.size, args.flows, 10, seed)
        print(f"table {args.size}, 1 of 10 endpoints removed: {m:.1%} of {args.flows} flows "
              f"moved with maglev (goal <= 12%), {r:.1%} with random")
    seconds = build_time(args.size, args.services, 10)
    print(f"{args.services} service ports x 10 endpoints, table {args.size}: built in "
          f"{seconds:.1f} s ({seconds / args.services * 1000:.2f} ms each)")


if __name__ == "__main__":
    main()

"""What reading every object at the edge costs (issues 12, 29).

    .venv/bin/python bench/bench_validation.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--rounds 4]

Loads the same synthetic cluster as bench_frontend.py (N services, one EndpointSlice of
M endpoints each, nodes) into a fresh engine --rounds times, through the engine's intake
as it runs (each kind's one pass: Kubernetes' rules, each building the object from the
value it checked), and prints the load time (best of the rounds); then the cost of that
pass (``READERS``, the general path) per object of each kind.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_frontend import make_cluster  # noqa: E402

from svcproxy.frontend.edge.limits import DEFAULT_LIMITS  # noqa: E402
from svcproxy.frontend.intake.intake import READERS  # noqa: E402
from svcproxy.frontend.pipeline.engine import Engine  # noqa: E402


def load(events: list[Any]) -> tuple[float, float]:
    """(wall, CPU) seconds to load ``events`` into a fresh engine."""
    engine = Engine()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    engine.submit(events)
    elapsed = time.perf_counter() - t0, time.process_time() - c0
    assert engine.synced.is_set() and len(engine.store.services) == len(events[0].objs)
    return elapsed


def per_object(events: list[Any]) -> None:
    for ev in events:
        objs = ev.objs[:2000]
        t0 = time.process_time()
        read = READERS[ev.kind]
        for obj in objs:
            assert read(obj, DEFAULT_LIMITS)[0] is not None
        cost = (time.process_time() - t0) / len(objs)
        print(f"read {ev.kind:<14} {cost * 1e6:7.1f} us CPU per object", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    events = make_cluster(args.services, args.endpoints, args.nodes)
    print(f"== loading {args.services} services x {args.endpoints} endpoints, {args.nodes} "
          f"nodes into a fresh engine ({args.rounds} rounds, the best)", flush=True)
    times = [load(events) for _ in range(args.rounds)]
    print(f"load: wall {min(t[0] for t in times):6.2f} s, CPU {min(t[1] for t in times):6.2f} s",
          flush=True)
    per_object(events)


if __name__ == "__main__":
    main()

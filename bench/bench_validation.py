"""What validating every object at the edge costs (issue 12).

    .venv/bin/python bench/bench_validation.py [--services 10000] [--endpoints 10]
        [--nodes 100] [--rounds 4]

Loads the same synthetic cluster as bench_frontend.py (N services, one EndpointSlice of
M endpoints each, nodes) into a fresh engine, alternating (ABBA) rounds with the engine's
intake as it runs (Kubernetes' rules, then parsing) and with parsing alone, and prints
the load time of each (best of the rounds) and their ratio; then the cost of
``validate`` per object of each kind.
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

from svcproxy.frontend.edge.validation import validate  # noqa: E402
from svcproxy.frontend.intake.intake import _PARSERS, Intake  # noqa: E402
from svcproxy.frontend.pipeline.engine import Engine  # noqa: E402


class ParseOnly(Intake):
    """The intake without Kubernetes' rules: what loading cost before issue 12."""

    def parse(self, kind: str, obj: Any, served: bool) -> Any:
        return _PARSERS[kind](obj)


def load(events: list[Any], validating: bool) -> tuple[float, float]:
    """(wall, CPU) seconds to load ``events`` into a fresh engine."""
    engine = Engine()
    if not validating:
        engine.store.intake = ParseOnly()
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
        for obj in objs:
            assert validate(ev.kind, obj).ok
        cost = (time.process_time() - t0) / len(objs)
        print(f"validate {ev.kind:<14} {cost * 1e6:7.1f} us CPU per object", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    events = make_cluster(args.services, args.endpoints, args.nodes)
    print(f"== loading {args.services} services x {args.endpoints} endpoints, {args.nodes} "
          f"nodes into a fresh engine ({args.rounds} rounds in ABBA order, best of each)",
          flush=True)
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for round_ in range(args.rounds):
        for validating in ((False, True) if round_ % 2 == 0 else (True, False)):
            times[validating].append(load(events, validating))
    for i, what in ((0, "wall"), (1, "CPU")):
        plain = min(t[i] for t in times[False])
        checked = min(t[i] for t in times[True])
        print(f"{what:>4}: parse only {plain:6.2f} s, validate and parse {checked:6.2f} s, "
              f"ratio {checked / plain:.3f}", flush=True)
    per_object(events)


if __name__ == "__main__":
    main()

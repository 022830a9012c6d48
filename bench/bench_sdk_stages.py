"""Benchmark of the SDK's render -> diff -> apply helper (svcproxy.sdk.StagedBackend).

What a periodic resync costs when it is a diff: 10,000 service ports x 10 endpoints,
rendered with the nft backend's real per-service renderer into a dict "dataplane".
Printed side by side, in one run:

1. the first sync (rebuild: render all, apply all);
2. a resync with nothing changed (render all, diff, apply nothing);
3. one endpoint change (render one, diff, apply one).

No kernel is involved: the figures are the SDK's and the renderer's CPU, i.e. what a
resync adds before a change behind it can be applied.

Usage: .venv/bin/python bench/bench_sdk_stages.py [--services N] [--endpoints N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.backends.nft.context import family_context  # noqa: E402
from svcproxy.backends.nft.render import ServiceObjects, render_service  # noqa: E402
from svcproxy.sdk import (  # noqa: E402
    Changes,
    Delta,
    NodeState,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
)
from tests.support.nft_fixtures import CONFIG, big_state, endpoint  # noqa: E402


class DictBackend(StagedBackend[ServiceObjects]):
    """The nft renderer, applied to a dict: the SDK's work without a kernel's."""

    name = "dict"

    def __init__(self) -> None:
        super().__init__()
        self.ctx = family_context(CONFIG, None, 4)
        self.table: dict[ServicePortKey, ServiceObjects] = {}
        self.applied_items = 0

    def render(self, state: NodeState, record: ServicePortState) -> ServiceObjects | None:
        return render_service(record, self.ctx)

    def apply(self, delta: Delta[ServicePortKey, ServiceObjects]) -> None:
        if delta.rebuild:
            self.table.clear()
        for key in delta.removed:
            del self.table[key]
        self.table.update(delta.set)
        self.applied_items = len(delta.set) + len(delta.removed)


def timed(backend: DictBackend, state: NodeState, changes: Changes) -> tuple[float, int]:
    backend.applied_items = 0
    start = time.perf_counter()
    backend.sync(state, changes)
    return (time.perf_counter() - start) * 1e3, backend.applied_items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    state = big_state(args.services, args.endpoints)
    everything = frozenset(state.services)
    rows: dict[str, list[tuple[float, int]]] = {"rebuild": [], "resync": [], "change": []}
    for run in range(args.runs):
        backend = DictBackend()
        rows["rebuild"].append(timed(backend, state, Changes(everything, True, True, "initial")))
        rows["resync"].append(timed(backend, state, Changes(everything, True, True, "periodic")))
        key = sorted(state.services)[run % len(state.services)]
        record = state.services[key]
        moved = dict(record.endpoints)
        moved.pop(next(iter(moved)))
        moved["10.255.0.1"] = endpoint("10.255.0.1")
        changed = replace(state, revision=state.revision + 1,
                          services={**state.services, key: ServicePortState(record.service,
                                                                            moved)})
        rows["change"].append(timed(backend, changed, Changes(frozenset({key}))))
    print(f"{args.services} service ports x {args.endpoints} endpoints, nft renderer, "
          f"median of {args.runs} runs")
    base = statistics.median(ms for ms, _ in rows["rebuild"])
    for name, values in rows.items():
        ms = statistics.median(v for v, _ in values)
        print(f"  {name:<8} {ms:9.1f} ms  ({values[0][1]} items applied; "
              f"{ms / base:.2f} x the rebuild)")


if __name__ == "__main__":
    main()

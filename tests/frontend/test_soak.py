"""The soak, short (issue 28; bench/bench_soak.py runs it for an hour): a fixed world
churned as rollouts do, watched views read as streams read them, new streams' snapshots
and GetNodeState for 1,000 distinct names that are no Node. After the warm-up what
Python holds stays where it was, and every cache and history within its bound.

Counts, not timings: the churn is as fast as the machine goes, checkpoints are every so
many changes.
"""

from __future__ import annotations

import gc
import tracemalloc

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.changelog import ViewBounds
from svcproxy.frontend.serving.pages import NodeStatePages
from svcproxy.frontend.sources.events import Replace, Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.soak import Rollouts

PHASES, CHANGES, WARMUP = 8, 250, 2
BOUNDS = ViewBounds(history_bytes=1 << 20, cache_floor=512)


def test_an_endless_churn_leaves_memory_flat_and_every_bound_held() -> None:
    world = Rollouts(services=30, endpoints=4, nodes=10)
    engine = Engine(bounds=BOUNDS)
    engine.submit([Replace(kind, objs)  # type: ignore[arg-type]
                   for kind, objs in world.objects().items()])
    log, pages = engine.changelog, NodeStatePages(engine)
    encoder = log.digests.encoder
    watched = [log.watch(f"node-{i}") for i in range(5)] + [log.watch("")]
    cursors = {view.name: log.revision for view in watched}
    held: list[int] = []
    tracemalloc.start()
    try:
        for phase in range(PHASES):
            for i in range(CHANGES):
                engine.submit([Upsert("EndpointSlice", world.step())])
                view = watched[i % len(watched)]
                since = cursors[view.name]
                cursors[view.name], first = engine.snapshots.catch_up(view, since)
                for _ in first:
                    pass
                if i % 50 == 0:  # a new stream: a whole snapshot
                    for _ in engine.snapshots.snapshot(watched[i // 50 % len(watched)]):
                        pass
                if i % 3 == 0:
                    name = f"probe-{(phase * CHANGES + i) // 3 % 1000}"
                    pages.answer(pb.GetNodeStateRequest(node_name=name))
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])
            live = {id(r) for v in log.views.values() for r in v.records.values()}
            sizes = encoder.sizes()
            assert sizes["records"] <= 2 * len(live) + 2 * BOUNDS.cache_floor, sizes
            assert log.history_bytes <= BOUNDS.history_bytes
            assert len(log.views) == len(watched)
    finally:
        tracemalloc.stop()
    assert encoder.sweeps >= 3
    # Flat: the later phases hold no more than the phases just after the warm-up (a
    # sweep's saw-tooth included), with 256 KiB to spare.
    early = max(held[WARMUP:WARMUP + (PHASES - WARMUP) // 2])
    late = max(held[WARMUP + (PHASES - WARMUP) // 2:])
    assert late <= early * 1.05 + (256 << 10), [h >> 10 for h in held]

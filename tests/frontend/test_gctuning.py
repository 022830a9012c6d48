"""The collector is paused for the whole initial load and runs again after it."""

from __future__ import annotations

import asyncio
import gc

from svcproxy.frontend.runtime.gctuning import paused_until


def test_no_collection_until_synced_then_as_before() -> None:
    async def run() -> list[bool]:
        synced = asyncio.Event()
        task = asyncio.create_task(paused_until(synced))
        await asyncio.sleep(0)
        seen = [gc.isenabled()]
        synced.set()
        await task
        seen.append(gc.isenabled())
        stopped = asyncio.create_task(paused_until(asyncio.Event()))
        await asyncio.sleep(0)
        seen.append(gc.isenabled())
        stopped.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
        return seen + [gc.isenabled()]

    assert gc.isenabled()
    assert asyncio.run(run()) == [False, True, False, True]


def test_the_initial_load_leaves_next_to_no_cyclic_garbage() -> None:
    """The state is frozen at sync without a collection first (one over 10,000 services
    cost 0.6 s): whatever the load leaves in reference cycles would stay for good."""
    from svcproxy.frontend.pipeline.engine import Engine
    from svcproxy.frontend.sources.events import Replace
    from tests.frontend.test_initial_sync import NODES, cluster

    services, slices = cluster(200)
    gc.collect()
    gc.disable()
    try:
        eng = Engine()
        for kind, objs in (("Node", NODES), ("Service", services), ("EndpointSlice", slices)):
            eng.submit([Replace(kind, objs)])  # type: ignore[arg-type]
        eng.changelog.view("n1")
        garbage = gc.collect()
    finally:
        gc.enable()
        gc.unfreeze()
    assert eng.synced.is_set() and garbage < 100

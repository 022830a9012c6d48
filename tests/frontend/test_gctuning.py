"""The collector is paused for the whole initial load and runs again after it."""

from __future__ import annotations

import asyncio
import gc

from svcproxy.frontend.gctuning import paused_until


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

"""How the frontend's processes use Python's cyclic garbage collector.

Serving streams allocates a few short-lived objects per message (futures, callback
wrappers, coroutine frames), and with the default thresholds (700, 10, 10) every
young collection promotes those still in flight. Promotions soon trigger a full
collection, which pauses every stream for 75-150 ms (measured with 1,000 streams).
Fewer, larger young collections promote far less, and full ones become rare.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Young objects between collections, and how many younger collections trigger the
# next older one: fewer promotions of in-flight objects, full passes about 100x rarer.
STREAMING_THRESHOLDS = (5000, 10, 100)


def tune_for_streaming() -> None:
    """Set the collector's thresholds for a process that serves many streams."""
    gc.set_threshold(*STREAMING_THRESHOLDS)


def settle_long_lived_state() -> None:
    """Keep what was just loaded (the cluster's initial state) out of the collector.

    Full passes over millions of long-lived objects would stall fan-out for 0.5 s. No
    collection first: the load leaves next to no cyclic garbage (checked by a test),
    and one pass over the loaded state cost 0.6 s of a cold start at 10,000 services.
    """
    gc.freeze()
    tune_for_streaming()


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside: for the initial load, whose objects all live on
    (with the default thresholds, the passes over the growing store were 5 s of a 20 s
    cold start at 10,000 services); ``settle_long_lived_state`` freezes it after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def paused_until(event: asyncio.Event) -> None:
    """No cyclic collection until ``event`` is set (or this task is cancelled): for the
    whole initial load, as the sources' threads decode the listing while the loop
    parses it (``collector_paused`` covers only the loop's part). ``svcproxy frontend``
    pauses it earlier, from its start (svcproxy/collector.py); this covers a
    Frontend made in a process that did not."""
    was = gc.isenabled()
    gc.disable()
    try:
        await event.wait()
    finally:
        if was:
            gc.enable()

"""The frontend's core, wired along the data flow: store → computation → changelog.

``Engine.submit`` hands a batch of source events to the store, which keeps the objects
and says what they touched; the changelog has the touched services recomputed (once
per node class, computation/) and publishes each view's changes under a new revision;
the snapshots answer streams that start. Runs on the asyncio loop; sources in other
threads use ``submit_threadsafe``. Each piece is its own class, testable alone; this
one only composes them and marks the sync.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.publication.changelog import DEFAULT_BOUNDS, Changelog, ViewBounds
from svcproxy.frontend.publication.snapshots import Snapshots
from svcproxy.frontend.runtime.gctuning import collector_paused, settle_long_lived_state
from svcproxy.frontend.sources.events import Event
from svcproxy.frontend.store.store import Store

log = logging.getLogger(__name__)
Submit = Callable[[Sequence[Event]], None]
# Events queued from source threads at most (a relist's are one Replace per kind): past
# it a source waits for the loop (an event holds one parsed object).
QUEUE_EVENTS = 10_000


class Engine:
    """A store, its computed records, the changelog and the snapshots, wired together;
    callers use the piece that owns what they need (``engine.changelog.view(name)``,
    ``engine.snapshots.catch_up``, ``engine.store.services``)."""

    def __init__(self, proxy_name: str = "", history_limit: int = 20000,
                 bounds: ViewBounds = DEFAULT_BOUNDS,
                 queue_events: int = QUEUE_EVENTS) -> None:
        self.store = Store()
        self.computed = ServiceRecords(self.store, proxy_name)
        self.changelog = Changelog(self.store, self.computed, history_limit, bounds)
        self.snapshots = Snapshots(self.changelog)
        self.synced = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        # Events from source threads the loop has not applied yet, at most
        # ``queue_events`` (and one batch): a source past it waits until the loop drains.
        self._queued: list[Event] = []
        self._room = threading.Condition()
        self.queue_events = queue_events
        # Source threads waiting for room in the queue now.
        self.sources_waiting = 0

    def submit_threadsafe(self, events: Sequence[Event]) -> None:
        """Hand a batch from another thread to the loop. Batches that come while the
        loop is busy are applied together, as one batch (one revision): a loop slower
        than its source catches up instead of queueing a call per batch. Past
        ``queue_events`` queued the source waits for the loop (backpressure: its
        apiserver watch waits with it), so what is queued is bounded and nothing is
        dropped; a batch larger than the bound alone waits for an empty queue."""
        loop = self.loop
        assert loop is not None, "Engine.loop must be set before sources start"
        with self._room:
            while self._queued and len(self._queued) + len(events) > self.queue_events:
                if loop.is_closed():  # the frontend stopped: nothing is applied any more
                    return
                self.sources_waiting += 1
                self._room.wait(1.0)
                self.sources_waiting -= 1
            first = not self._queued
            self._queued.extend(events)
        if first:
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._room:
            events, self._queued = self._queued, []
            self._room.notify_all()
        self.submit(events)

    def submit(self, events: Iterable[Event]) -> None:
        """Apply one batch of source events and publish the resulting changes."""
        if self.synced.is_set():
            self._submit(events)
        else:
            with collector_paused():
                self._submit(events)

    def _submit(self, events: Iterable[Event]) -> None:
        self.changelog.publish(self.store.apply(events))
        if not self.synced.is_set() and self.store.listed_all:
            self.changelog.start()
            settle_long_lived_state()
            self.synced.set()
            log.info("frontend synced: %d services, %d endpoint slices, %d nodes",
                     len(self.store.services), len(self.store.slices), len(self.store.nodes))

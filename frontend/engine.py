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
from svcproxy.frontend.gctuning import collector_paused, settle_long_lived_state
from svcproxy.frontend.publication.changelog import DEFAULT_BOUNDS, Changelog, ViewBounds
from svcproxy.frontend.publication.snapshots import Snapshots
from svcproxy.frontend.sources.events import Event
from svcproxy.frontend.store.store import Store

log = logging.getLogger(__name__)
Submit = Callable[[Sequence[Event]], None]


class Engine:
    """A store, its computed records, the changelog and the snapshots, wired together;
    callers use the piece that owns what they need (``engine.changelog.view(name)``,
    ``engine.snapshots.catch_up``, ``engine.store.services``)."""

    def __init__(self, proxy_name: str = "", history_limit: int = 20000,
                 bounds: ViewBounds = DEFAULT_BOUNDS) -> None:
        self.store = Store()
        self.computed = ServiceRecords(self.store, proxy_name)
        self.changelog = Changelog(self.store, self.computed, history_limit, bounds)
        self.snapshots = Snapshots(self.changelog)
        self.synced = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        # Events from source threads the loop has not applied yet.
        self._queued: list[Event] = []
        self._queue_lock = threading.Lock()

    def submit_threadsafe(self, events: Sequence[Event]) -> None:
        """Hand a batch from another thread to the loop. Batches that come while the
        loop is busy are applied together, as one batch (one revision): a loop slower
        than its source catches up instead of queueing a call per batch."""
        assert self.loop is not None, "Engine.loop must be set before sources start"
        with self._queue_lock:
            first = not self._queued
            self._queued.extend(events)
        if first:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._queue_lock:
            events, self._queued = self._queued, []
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

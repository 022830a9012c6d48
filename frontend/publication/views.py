"""A node's view: its current records and a bounded, revisioned history of changes.

Clients read the history from their own cursor, so a slow client costs no
memory of its own: when it falls behind the history it gets a reset and a
fresh snapshot; otherwise the entries it missed are coalesced (latest state
wins) into one batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping

from svcproxy.frontend.publication.wire import MESSAGE_BYTES, WireOp, chunk_events, coalesce
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState

# The name of the cluster's view (every node, every service, no node's selection).
CLUSTER_VIEW = ""
# What one op in a history is charged besides its bytes: its WireOp, its key's tuple and
# its place in the batch's list (~150 bytes measured with tracemalloc, rounded up). An op
# shared by several views (one per node class) is charged to each: the charge is an
# upper bound of what the histories hold.
OP_OVERHEAD = 200
# What one batch is charged besides its ops: its (revision, ops, charge) entry, the list
# of its ops, the two integers and its deque slot (212 bytes measured with tracemalloc,
# rounded up). Without it a one-op batch was charged its op alone (260 bytes here), and
# a full history grew as batches merged while the loop was behind were replaced by
# single ones (the soak's late growth, issue 28).
BATCH_OVERHEAD = 220
# A view's history at most, in bytes charged (a stream worker's copy of a view too).
VIEW_HISTORY_BYTES = 32 << 20


def charge(ops: list[WireOp]) -> int:
    """The bytes a batch of ``ops`` is charged in a history."""
    return sum([len(op.data) for op in ops]) + OP_OVERHEAD * len(ops) + BATCH_OVERHEAD


class NodeView:
    """The state one node (or, with name "", the whole cluster) is served."""

    def __init__(self, name: str, revision: int, history_limit: int,
                 history_bytes: int = VIEW_HISTORY_BYTES) -> None:
        self.name = name
        self.node: NodeInfo | None = None
        self.nodes: dict[str, NodeInfo] = {}
        self.records: dict[ServicePortKey, ServicePortState] = {}
        self.revision = revision
        self.history_start = revision
        # Batches (revision, ops, bytes charged), oldest first.
        self.history: deque[tuple[int, list[WireOp], int]] = deque()
        self.history_ops = 0
        self.history_limit = history_limit
        self.history_bytes = 0
        self.history_max_bytes = history_bytes
        self.watchers = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._encoded: tuple[int, int, list[bytes]] | None = None
        # The state digest (WatchEvent.digest) at ``revision``; None when unknown.
        self.digest: int | None = None

    @property
    def is_cluster(self) -> bool:
        return self.name == ""

    def set_records(self, old_keys: set[ServicePortKey],
                    new: Mapping[ServicePortKey, ServicePortState]) -> None:
        for key in old_keys - new.keys():
            self.records.pop(key, None)
        self.records.update(new)

    def append(self, revision: int, ops: list[WireOp], digest: int | None = None) -> None:
        """Record a batch (and the state digest after it) and wake this view's watchers;
        the oldest batches go past ``history_limit`` ops (the last batch stays) or past
        ``history_max_bytes`` (a batch larger than that alone too)."""
        size = charge(ops)
        self.history.append((revision, ops, size))
        self.history_ops += len(ops)
        self.history_bytes += size
        self.revision = revision
        self.digest = digest
        while self.history_ops > self.history_limit and len(self.history) > 1:
            self.drop_oldest()
        while self.history_bytes > self.history_max_bytes:
            self.drop_oldest()
        self._wake()

    def drop_oldest(self) -> int:
        """Forget the oldest batch (a client behind it resumes with a reset); its bytes."""
        rev, old, size = self.history.popleft()
        self.history_ops -= len(old)
        self.history_bytes -= size
        self.history_start = rev
        return size

    def clear_history(self, revision: int) -> None:
        """No history: the view starts at ``revision``."""
        self.history.clear()
        self.history_ops = self.history_bytes = 0
        self.history_start = self.revision = revision

    def can_resume(self, since: int) -> bool:
        """Whether every change after ``since`` is still in the history."""
        return self.history_start <= since

    def ops_since(self, since: int) -> list[WireOp] | None:
        """Coalesced ops after revision ``since``; None when the history no longer has them."""
        if not self.can_resume(since):
            return None
        return coalesce(reversed(self._batches_after(since)))

    def messages_since(self, since: int) -> list[bytes] | None:
        """The encoded batch from ``since`` to now, shared by every client at that cursor."""
        cached = self._encoded
        if cached is not None and cached[0] == since and cached[1] == self.revision:
            return cached[2]
        ops = self.ops_since(since)
        if ops is None:
            return None
        msgs = list(chunk_events(self.revision, [op.data for op in ops], limit=MESSAGE_BYTES,
                                 digest=self.digest))
        self._encoded = (since, self.revision, msgs)
        return msgs

    def _batches_after(self, since: int) -> list[list[WireOp]]:
        """The batches after revision ``since``, newest first (read from the end: most
        clients are one batch behind, however long the history)."""
        out = []
        for rev, ops, _ in reversed(self.history):
            if rev <= since:
                break
            out.append(ops)
        return out

    def batches_after(self, since: int) -> int:
        """How many batches of the history came after revision ``since``."""
        return len(self._batches_after(since))

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_change(self, since: int) -> None:
        """Return once the view is past revision ``since``.

        A future per waiter from the loop found once: asyncio.Event looks the running
        loop up on every wait, and on Python 3.11 that is a getpid system call, 5% of
        the fan-out's CPU with a thousand streams.
        """
        while self.revision <= since:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter

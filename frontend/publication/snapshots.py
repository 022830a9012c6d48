"""What a Watch stream sends first: the batch it missed, or a reset and a full snapshot.

A snapshot is encoded one message at a time as the stream writes it; the serialised
``replace_service`` op of each record comes from the digests' ``RecordEncoder`` (cached
by record object, shared by every stream and by GetNodeState's pages).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from svcproxy.frontend.publication.changelog import Changelog
from svcproxy.frontend.publication.views import NodeView
from svcproxy.frontend.publication.wire import (
    MESSAGE_BYTES,
    chunk_events,
    set_node,
)
from svcproxy.frontend.runtime import metrics
from svcproxy.model import ServicePortState

log = logging.getLogger(__name__)


class Snapshots:
    """Catch-up and snapshots of the changelog's views."""

    def __init__(self, changelog: Changelog) -> None:
        self.changelog = changelog
        self.encoder = changelog.digests.encoder

    def catch_up(self, view: NodeView, since: int) -> tuple[int, Iterable[bytes]]:
        """Where a stream whose client last applied ``since`` starts: its cursor and the
        messages to send first (what it missed, or a reset and a snapshot when ``since``
        is 0 or no longer in the history)."""
        revision = self.changelog.revision
        if since and view.can_resume(since) and since <= revision:
            missed = view.messages_since(since) if view.revision > since else []
            if missed is not None:
                return revision, missed
        if since:
            metrics.RESETS.inc()
            log.info("node %s: revision %d is not in the history; sending a reset and a "
                     "full snapshot", view.name or "<cluster>", since)
        return revision, self.snapshot(view, reset=since != 0)

    def snapshot(self, view: NodeView, reset: bool = False) -> Iterator[bytes]:
        """The messages of a full snapshot of ``view`` at the current revision, encoded
        one at a time as the stream writes them: a stream holds the list of its ops
        (bytes shared with every other stream) and the one message being written."""
        return _measured(chunk_events(self.changelog.revision, self.snapshot_ops(view),
                                      reset=reset, limit=MESSAGE_BYTES, digest=view.digest))

    def snapshot_ops(self, view: NodeView) -> list[bytes]:
        """The ops that build ``view`` from nothing (serialised records are cached)."""
        out = [set_node(n).data for n in view.nodes.values()]
        if view.node is not None:
            out.append(set_node(view.node).data)
        out += self.encoder.ops(view.records.values())
        return out

    def service_op(self, rec: ServicePortState) -> bytes:
        """The serialised replace_service op of ``rec``."""
        return self.encoder.op(rec)


def _measured(msgs: Iterator[bytes]) -> Iterator[bytes]:
    size = 0
    for msg in msgs:
        size += len(msg)
        yield msg
    metrics.SNAPSHOT_BYTES.observe(size)

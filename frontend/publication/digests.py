"""State digests (``WatchEvent.digest``): the sum of the terms of a view's nodes and records.

A view's digest is kept up to date by adding each change's delta; ``Digests.of``
computes it from scratch. A record's term comes from the ``RecordEncoder``: the sum of
its service port's term and its endpoints' terms, each computed once.
"""

from __future__ import annotations

from collections.abc import Callable

from svcproxy.convert import DIGEST_MASK, node_term, node_to_pb
from svcproxy.frontend.publication.encoding import RecordEncoder
from svcproxy.frontend.publication.views import NodeView
from svcproxy.model import NodeInfo, ServicePortState


class Digests:
    """Digest terms of records, from the encoder's cache."""

    def __init__(self, encoder: RecordEncoder | None = None) -> None:
        self.encoder = encoder or RecordEncoder()
        # The digest term of a record (``convert.record_term`` of its message).
        self.record_term: Callable[[ServicePortState], int] = self.encoder.term

    def of(self, view: NodeView) -> int:
        """The state digest of ``view`` computed from scratch."""
        total = nodes_term(view)
        total += sum(self.record_term(r) for r in view.records.values())
        return total & DIGEST_MASK


def nodes_term(view: NodeView) -> int:
    """The digest terms of the nodes in ``view`` (unmasked)."""
    nodes = list(view.nodes.values()) + ([view.node] if view.node else [])
    return sum(node_term(node_to_pb(n)) for n in nodes)


def node_delta(old: NodeInfo | None, new: NodeInfo | None) -> int:
    """How a node's change moves the state digest."""
    if old == new:
        return 0
    return ((node_term(node_to_pb(new)) if new else 0)
            - (node_term(node_to_pb(old)) if old else 0))


def add_digest(view: NodeView, delta: int) -> None:
    """Move ``view``'s digest by ``delta`` (a view whose digest is unknown stays so)."""
    if view.digest is not None and delta:
        view.digest = (view.digest + delta) & DIGEST_MASK

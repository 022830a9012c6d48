"""State digests (``WatchEvent.digest``): the sum of the terms of a view's nodes and records.

A view's digest is kept up to date by adding each change's delta; ``Digests.of``
computes it from scratch. A record's term is cached by record object (records are
shared by every view of a node class).
"""

from __future__ import annotations

from svcproxy.convert import DIGEST_MASK, node_term, node_to_pb, record_term, state_to_pb
from svcproxy.frontend.publication.views import NodeView
from svcproxy.model import NodeInfo, ServicePortState


class Digests:
    """Digest terms of records, cached per record object."""

    def __init__(self) -> None:
        self._terms: dict[int, tuple[ServicePortState, int]] = {}

    def record_term(self, rec: ServicePortState) -> int:
        """The digest term of a record (cached per record object)."""
        hit = self._terms.get(id(rec))
        if hit is None or hit[0] is not rec:
            if len(self._terms) > 1_000_000:
                self._terms = {}
            hit = self._terms[id(rec)] = (rec, record_term(state_to_pb(rec)))
        return hit[1]

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

"""State digests (``WatchEvent.digest``): the sum of the terms of a view's nodes and records.

A view's digest is kept up to date by adding each change's delta; ``Digests.of``
computes it from scratch. A record's term is the sum of its service port's term and
its endpoints' terms, each computed once: the node classes of a service share their
service port (by value) and most of their endpoint objects.
"""

from __future__ import annotations

from svcproxy.convert import (
    DIGEST_MASK,
    endpoint_term,
    endpoint_to_pb,
    key_to_pb,
    node_term,
    node_to_pb,
    service_term,
    service_to_pb,
)
from svcproxy.frontend.publication.views import NodeView
from svcproxy.model import Endpoint, NodeInfo, ServicePort, ServicePortKey, ServicePortState

# Cached terms past which the caches start again (records and endpoints no longer in
# use would otherwise be kept for good).
MAX_CACHED = 2_000_000


class Digests:
    """Digest terms of records, cached per record object, service port and endpoint."""

    def __init__(self) -> None:
        self._records: dict[int, tuple[ServicePortState, int]] = {}
        self._services: dict[ServicePort, int] = {}
        # By object, kept with its port's key: an endpoint's term depends on the port.
        self._endpoints: dict[int, tuple[Endpoint, ServicePortKey, int]] = {}

    def record_term(self, rec: ServicePortState) -> int:
        """The digest term of a record (``convert.record_term`` of its message)."""
        hit = self._records.get(id(rec))
        if hit is not None and hit[0] is rec:
            return hit[1]
        if len(self._records) + len(self._endpoints) + len(self._services) > MAX_CACHED:
            self.__init__()  # type: ignore[misc]
        svc = rec.service
        total = self._services.get(svc)
        if total is None:
            total = self._services[svc] = service_term(service_to_pb(svc))
        key_pb = None
        for ep in rec.endpoints.values():
            known = self._endpoints.get(id(ep))
            if known is None or known[0] is not ep or (known[1] is not svc.key
                                                       and known[1] != svc.key):
                if key_pb is None:
                    key_pb = key_to_pb(svc.key)
                known = self._endpoints[id(ep)] = (ep, svc.key,
                                                   endpoint_term(key_pb, endpoint_to_pb(ep)))
            total += known[2]
        total &= DIGEST_MASK
        self._records[id(rec)] = (rec, total)
        return total

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

"""The views' first state, built once at sync.

Before sync nothing is served, so no service is computed per view: at sync
``InitialFill`` takes each service once (its ``NodeClassCache``) and gives every view
its records and their digest. A view gets a copy of its zone's shared records, then
the records of the few services whose endpoints or hints name its node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from svcproxy.convert import (
    DIGEST_MASK,
    endpoint_term,
    endpoint_to_pb,
    key_to_pb,
    service_term,
    service_to_pb,
)
from svcproxy.frontend.computation.compute import NodeClassCache
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServicePortState

Records = Mapping[ServicePortKey, ServicePortState]


class InitialFill:
    """Every view's records and records digest at sync, each node class computed once."""

    def __init__(self, zones: Mapping[str, str]) -> None:
        self.zones = zones
        self.by_zone: dict[str, list[str]] = {}
        for name, zone in zones.items():
            self.by_zone.setdefault(zone, []).append(name)
        self.shared: dict[str, dict[ServicePortKey, ServicePortState]] = {
            zone: {} for zone in self.by_zone}
        self.own: dict[str, list[Records]] = {}
        self._shared_terms: dict[str, int] = {}

    def add(self, cache: NodeClassCache) -> None:
        """Add one service; when its computation raises, nothing of it has been added."""
        base = cache.base
        if not base.ports:
            return
        own = {n for n in base.endpoint_nodes | base.hinted_nodes if n in self.zones}
        shared: dict[str, Records] = {}
        for zone, names in self.by_zone.items():
            rep = next((n for n in names if n not in own), None)
            if rep is not None:
                shared[zone] = cache.records(rep, zone)
        mine = [(n, cache.records(n, self.zones[n])) for n in own]
        for zone, recs in shared.items():
            self.shared[zone].update(recs)
        for name, recs in mine:
            self.own.setdefault(name, []).append(recs)

    def view(self, name: str, term: Callable[[ServicePortState], int]
             ) -> tuple[dict[ServicePortKey, ServicePortState], int]:
        """The records of view ``name`` and the sum of their digest terms (unmasked)."""
        zone = self.zones[name]
        shared = self.shared[zone]
        total = self._shared_terms.get(zone)
        if total is None:
            total = self._shared_terms[zone] = sum(term(r) for r in shared.values())
        records = dict(shared)
        for recs in self.own.get(name, ()):
            for key, rec in recs.items():
                old = shared.get(key)
                total += term(rec) - (term(old) if old is not None else 0)
            records.update(recs)
        return records, total


class TermCache:
    """A record's digest term (``convert.record_term``) from the terms of its service port
    and of each endpoint, each computed once: the node classes of a service share most
    of them. Lives for one sync."""

    def __init__(self) -> None:
        self._records: dict[int, tuple[ServicePortState, int]] = {}
        self._services: dict[ServicePort, int] = {}
        # By object (the node classes of a service share their endpoint objects), kept
        # with its port's key: an endpoint's term depends on the port it is in.
        self._endpoints: dict[int, tuple[Endpoint, ServicePortKey, int]] = {}

    def __call__(self, rec: ServicePortState) -> int:
        hit = self._records.get(id(rec))
        if hit is not None and hit[0] is rec:
            return hit[1]
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

"""Each service's per-node records, computed from the store once per node class.

``ServiceRecords`` keeps, per service, the ``NodeClassCache`` of its current version:
the views take their records from it, on demand. Every node a service's endpoints or
hints do not name gets that service's records for its zone, so a node's records are
its zone's ``shared`` ones with those of the few services naming it (``own``) on top.
Before sync nothing is served, so services changed then are only noted, and computed
between the listing's pages once they have their Service and a slice
(``compute_settled``), the rest at sync (``compute_deferred``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping

from svcproxy.frontend.computation.compute import EMPTY_BASE, NodeClassCache, service_base
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.store.store import ObjKey, Store
from svcproxy.model import ServicePortKey, ServicePortState

log = logging.getLogger(__name__)
Records = Mapping[ServicePortKey, ServicePortState]


class ServiceRecords:
    """The computed records of every service, by node class."""

    def __init__(self, store: Store, proxy_name: str = "") -> None:
        self.store = store
        self.proxy_name = proxy_name
        self.caches: dict[ObjKey, NodeClassCache] = {}
        # Services changed before sync: computed once, at sync (nothing is served before).
        self._deferred: set[ObjKey] = set()
        # What the last batch before sync noted (see ``compute_settled``).
        self._recent: set[ObjKey] = set()
        # Node name -> the services whose endpoints or hints name it.
        self._naming: dict[str, set[ObjKey]] = {}
        # Zone -> every service's records for a node of it that no service names; made
        # on demand, forgotten at the next change.
        self._shared: dict[str, dict[ServicePortKey, ServicePortState]] = {}

    def compute(self, svc: ObjKey) -> NodeClassCache:
        """Service ``svc`` computed from the store as it is now (kept by ``keep``)."""
        return NodeClassCache(service_base(self.store.services.get(svc),
                                           self.store.slices_for(svc), self.proxy_name))

    def keep(self, svc: ObjKey, cache: NodeClassCache) -> None:
        """Make ``cache`` the current version of ``svc`` (none when it has no ports)."""
        by_node = self._naming
        old = self.caches.get(svc)
        if old is not None:
            for names in (old.base.endpoint_nodes, old.base.hinted_nodes):
                for name in names:
                    naming = by_node.get(name)
                    if naming is not None:
                        naming.discard(svc)
                        if not naming:
                            del by_node[name]
        if cache.base.ports:
            self.caches[svc] = cache
            for names in (cache.base.endpoint_nodes, cache.base.hinted_nodes):
                for name in names:
                    naming = by_node.get(name)
                    if naming is None:
                        by_node[name] = {svc}
                    else:
                        naming.add(svc)
        else:
            self.caches.pop(svc, None)
        if self._shared:
            self._shared.clear()

    def port_keys(self, svc: ObjKey) -> set[ServicePortKey]:
        """The service ports the current version of ``svc`` has."""
        cache = self.caches.get(svc)
        return {p.service.key for p in (cache.base if cache else EMPTY_BASE).ports}

    def shared(self, zone: str) -> dict[ServicePortKey, ServicePortState]:
        """Every service's records for a node of ``zone`` that no service names (the same
        dict until the next change: do not modify it)."""
        found = self._shared.get(zone)
        if found is None:
            found = self._shared[zone] = {}
            for svc, cache in self.caches.items():
                found.update(_records(svc, cache, "", zone))
        return found

    def own(self, name: str) -> Iterator[Records]:
        """The records for node ``name`` of each service naming it."""
        zone = self.store.zone(name)
        for svc in self._naming.get(name, ()):
            yield _records(svc, self.caches[svc], name, zone)

    def node_records(self, name: str) -> dict[ServicePortKey, ServicePortState]:
        """Every service's records for node ``name``."""
        out = dict(self.shared(self.store.zone(name)))
        for records in self.own(name):
            out.update(records)
        return out

    def defer(self, services: Iterable[ObjKey]) -> None:
        """Note services changed before sync, for ``compute_deferred``."""
        self._deferred.update(services)

    def compute_settled(self, touched: set[ObjKey]) -> None:
        """While the listing goes on: compute the services the batch before noted that
        have their Service and a slice and that ``touched`` (the batch just stored) leaves
        alone, then note ``touched``. What the loop would otherwise compute at sync, done
        between the pages; one the listing changes again is computed again."""
        store = self.store
        ready = [svc for svc in self._recent
                 if svc in store.slices_of and svc in store.services and svc not in touched]
        self._compute(ready)
        self._deferred.difference_update(ready)
        self.defer(touched)
        self._recent = touched

    def compute_deferred(self) -> None:
        """Compute every noted service once; one that fails is left out alone (logged,
        counted) until it changes again."""
        self._compute(self._deferred)
        self._deferred.clear()
        self._recent = set()

    def _compute(self, services: Iterable[ObjKey]) -> None:
        for svc in services:
            try:
                cache = self.compute(svc)
            except Exception:  # noqa: BLE001 - one service's failure stays its own
                log.exception("computing service %s/%s failed: it is served without it "
                              "until it changes again", *svc)
                metrics.SERVICE_ERRORS.inc()
                continue
            self.keep(svc, cache)


def _records(svc: ObjKey, cache: NodeClassCache, name: str, zone: str) -> Records:
    """A service's records for one node; none when that fails (logged, counted): the
    node is served without it until it changes again."""
    try:
        return cache.records(name, zone)
    except Exception:  # noqa: BLE001 - one service's failure stays its own
        log.exception("computing service %s/%s for node %s failed: it is left out until "
                      "it changes again", *svc, name or "<cluster>")
        metrics.SERVICE_ERRORS.inc()
        return {}

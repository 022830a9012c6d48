"""Each service's per-node records, computed from the store once per node class.

``ServiceRecords`` keeps, per service, the ``NodeClassCache`` of its current version:
the views take their records from it. Before sync nothing is served, so services
changed then are only noted and computed once, at sync (``initial_fill``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from svcproxy.frontend import metrics
from svcproxy.frontend.computation.compute import EMPTY_BASE, NodeClassCache, service_base
from svcproxy.frontend.computation.initial import InitialFill
from svcproxy.frontend.store.store import ObjKey, Store
from svcproxy.model import ServicePortKey, ServicePortState

log = logging.getLogger(__name__)


class ServiceRecords:
    """The computed records of every service, by node class."""

    def __init__(self, store: Store, proxy_name: str = "") -> None:
        self.store = store
        self.proxy_name = proxy_name
        self.caches: dict[ObjKey, NodeClassCache] = {}
        # Services changed before sync: computed once, at sync (nothing is served before).
        self._deferred: set[ObjKey] = set()

    def compute(self, svc: ObjKey) -> NodeClassCache:
        """Service ``svc`` computed from the store as it is now (kept by ``keep``)."""
        return NodeClassCache(service_base(self.store.services.get(svc),
                                           self.store.slices_for(svc), self.proxy_name))

    def keep(self, svc: ObjKey, cache: NodeClassCache) -> None:
        """Make ``cache`` the current version of ``svc`` (none when it has no ports)."""
        if cache.base.ports:
            self.caches[svc] = cache
        else:
            self.caches.pop(svc, None)

    def port_keys(self, svc: ObjKey) -> set[ServicePortKey]:
        """The service ports the current version of ``svc`` has."""
        cache = self.caches.get(svc)
        return {p.service.key for p in (cache.base if cache else EMPTY_BASE).ports}

    def node_records(self, name: str) -> dict[ServicePortKey, ServicePortState]:
        """Every service's records for node ``name``."""
        zone = self.store.zone(name)
        out: dict[ServicePortKey, ServicePortState] = {}
        for cache in self.caches.values():
            out.update(cache.records(name, zone))
        return out

    def defer(self, services: Iterable[ObjKey]) -> None:
        """Note services changed before sync, for ``initial_fill``."""
        self._deferred.update(services)

    def initial_fill(self, names: Iterable[str]) -> InitialFill:
        """Compute every noted service once and fill the records of views ``names``."""
        fill = InitialFill({name: self.store.zone(name) for name in names})
        for svc in self._deferred:
            self._compute_initial(svc, fill)
        self._deferred.clear()
        return fill

    def _compute_initial(self, svc: ObjKey, fill: InitialFill) -> None:
        """Compute one service for sync; a failure leaves it out alone (logged, counted)."""
        try:
            cache = self.compute(svc)
            fill.add(cache)
        except Exception:  # noqa: BLE001 - one service's failure stays its own
            log.exception("computing service %s/%s failed: it is served without it until "
                          "it changes again", *svc)
            metrics.SERVICE_ERRORS.inc()
            return
        self.keep(svc, cache)


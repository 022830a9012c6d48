"""The cluster as the sources sent it: Services, EndpointSlices and Nodes, parsed and typed.

``Store.apply`` takes a batch of source events, lets the intake validate and parse each
object (a refused one is left out alone) and keeps the result; it answers with what the
batch touched (services and nodes whose state may have changed), for the computation.
Nothing here computes or publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from svcproxy.frontend.edge.objects import EndpointSlice, Node, Service
from svcproxy.frontend.edge.validation import object_key
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import (
    KINDS,
    Delete,
    Event,
    Kind,
    RawObject,
    Replace,
    Upsert,
)
from svcproxy.frontend.store.claims import UNALLOCATED, Claims
from svcproxy.model import NodeInfo

log = logging.getLogger(__name__)
ObjKey = tuple[str, str]


def node_info(node: Node) -> NodeInfo:
    """What the views carry of a Node."""
    return NodeInfo(node.name, node.zone, node.pod_cidrs, node.addresses, node.labels,
                    node.terminating)


@dataclass
class ChangedKeys:
    """What one batch changed: services (by namespace, name) and nodes (by name)."""

    services: set[ObjKey] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)


class Store:
    """The objects as received; an object equal to the one kept touches nothing."""

    def __init__(self, intake: Intake | None = None) -> None:
        self.services: dict[ObjKey, Service] = {}  # as served: claims.py's view
        # For sources no allocator guarded: the Services as declared, who holds what.
        self.claims = Claims()
        self.slices: dict[ObjKey, EndpointSlice] = {}
        self.slices_of: dict[ObjKey, set[ObjKey]] = {}
        self.nodes: dict[str, Node] = {}
        self.listed: set[Kind] = set()
        # The keys listed so far, per kind whose listing is coming in parts.
        self._listing: dict[Kind, set[ObjKey]] = {}
        # Validates every object whatever the source (main.py sets its source and limits).
        self.intake = intake or Intake()

    @property
    def listed_all(self) -> bool:
        """Whether every kind has been listed once (the cluster is known)."""
        return self.listed >= set(KINDS)

    def slices_for(self, svc: ObjKey) -> Iterator[EndpointSlice]:
        """The endpoint slices of service ``svc``."""
        return (self.slices[k] for k in self.slices_of.get(svc, ()))

    def zone(self, name: str) -> str:
        """The zone of node ``name`` ("" when unknown)."""
        node = self.nodes.get(name)
        return node.zone if node else ""

    def known_nodes(self) -> list[NodeInfo]:
        """Every node, by name."""
        return [node_info(self.nodes[n]) for n in sorted(self.nodes)]

    def apply(self, events: Iterable[Event]) -> ChangedKeys:
        """Apply one batch; an event that fails unexpectedly is logged, counted and skipped."""
        touched = ChangedKeys()
        for ev in events:
            try:
                if isinstance(ev, Replace):
                    self._replace(ev, touched)
                elif isinstance(ev, Upsert):
                    self._upsert(ev.kind, ev.obj, object_key(ev.kind, ev.obj), touched)
                elif isinstance(ev, Delete):
                    self._delete(ev.kind, (ev.namespace, ev.name), touched)
            except Exception:  # noqa: BLE001 - one event's failure must not lose the batch
                log.exception("unexpected error applying %s; the rest of the batch goes on",
                              type(ev).__name__)
                metrics.REJECTED_OBJECTS.labels(self.intake.source, ev.kind,
                                                "internal_error").inc()
            metrics.WATCH_EVENTS.labels(type(ev).__name__.lower()).inc()
        return touched

    def _parse(self, kind: Kind, obj: dict[str, Any],
               key: ObjKey) -> Service | EndpointSlice | Node | None:
        """The object validated and parsed, or None (refused alone, logged and counted)."""
        ns, name = key
        served = (name in self.nodes if kind == "Node" else
                  (ns, name) in (self.services if kind == "Service" else self.slices))
        return self.intake.parse(kind, obj, served)

    def _upsert(self, kind: Kind, obj: dict[str, Any], key: ObjKey, touched: ChangedKeys) -> None:
        """Keep ``obj`` (whose ``object_key`` is ``key``) if it is valid and changed."""
        parsed = self._parse(kind, obj, key)
        if isinstance(parsed, Service):
            if self.intake.source not in UNALLOCATED:  # the allocators guarded these
                if self.services.get(parsed.key) != parsed:
                    self.services[parsed.key] = parsed
                    touched.services.add(parsed.key)
            elif self.claims.declared.get(parsed.key) != parsed:
                self._serve(self.claims.update(parsed.key, parsed), touched)
        elif isinstance(parsed, EndpointSlice):
            old = self.slices.get(parsed.key)
            if old is not None and old.service_name != parsed.service_name:
                self._delete("EndpointSlice", parsed.key, touched)
                old = None
            if old is None or (old.ports, old.endpoints) != (parsed.ports, parsed.endpoints):
                self.slices[parsed.key] = parsed
                svc = (parsed.namespace, parsed.service_name)
                self.slices_of.setdefault(svc, set()).add(parsed.key)
                touched.services.add(svc)
        elif isinstance(parsed, Node):
            if self.nodes.get(parsed.name) != parsed:
                self.nodes[parsed.name] = parsed
                touched.nodes.add(parsed.name)

    def _serve(self, services: dict[ObjKey, Service | None], touched: ChangedKeys) -> None:
        """Serve each Service as the claims leave it (None: not at all)."""
        for key, svc in services.items():
            if svc is None:
                if self.services.pop(key, None) is not None:
                    touched.services.add(key)
            elif self.services.get(key) != svc:
                self.services[key] = svc
                touched.services.add(key)

    def _delete(self, kind: Kind, key: ObjKey, touched: ChangedKeys) -> None:
        if kind == "Service":
            if key in self.claims.declared:
                self._serve(self.claims.update(key, None), touched)
            elif self.services.pop(key, None) is not None:
                touched.services.add(key)
        elif kind == "EndpointSlice":
            old = self.slices.pop(key, None)
            if old is not None:
                svc = (old.namespace, old.service_name)
                names = self.slices_of.get(svc, set())
                names.discard(key)
                if not names:
                    self.slices_of.pop(svc, None)
                touched.services.add(svc)
        elif self.nodes.pop(key[1], None) is not None:
            touched.nodes.add(key[1])

    def _replace(self, ev: Replace, touched: ChangedKeys) -> None:
        """One part of a listing: its objects now, the deletions at its last part."""
        kind = ev.kind
        if ev.first or kind not in self._listing:
            self._listing[kind] = set()
        listed = self._listing[kind]
        for item in ev.objs:
            obj = self.intake.decode(item) if type(item) is RawObject else item
            key = obj.key if type(obj) in (EndpointSlice, Service) else object_key(kind, obj)
            listed.add(key)
            self._upsert(kind, obj, key, touched)
        if not ev.last:
            return
        del self._listing[kind]
        stores: dict[str, dict[Any, Any]] = {
            "Service": self.services, "EndpointSlice": self.slices, "Node": self.nodes}
        store = stores[kind]
        for key in list(store):
            full = ("", key) if kind == "Node" else key
            if full not in listed:
                self._delete(kind, full, touched)
        self.listed.add(kind)

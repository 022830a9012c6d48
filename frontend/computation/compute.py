"""Pure per-node computation: (service, its endpoint slices, node) → the node's records.

``service_ports`` does the node-independent work once per service change
(port records, merged endpoints); ``node_records`` adds what depends on the
node. ``NodeClassCache`` lets nodes whose result cannot differ share one result:
a node that hosts none of a service's endpoints and is named in no hint sees
exactly what every other such node in its zone sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from svcproxy.frontend.computation.selection import categorize_by_family
from svcproxy.frontend.store.objects import EndpointSlice, Service, SvcPort
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServicePortState


@dataclass(frozen=True, slots=True)
class PortBase:
    """A service port with its merged endpoints, before any node is considered."""

    service: ServicePort
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True, slots=True)
class ServiceBase:
    ports: tuple[PortBase, ...]
    endpoint_nodes: frozenset[str]
    hinted_nodes: frozenset[str]
    uses_zones: bool


EMPTY_BASE = ServiceBase((), frozenset(), frozenset(), False)


def is_proxied(svc: Service, proxy_name: str) -> bool:
    """Whether svcproxy programs this service (not headless, ExternalName or another proxy's)."""
    if svc.proxyable_type is None:
        return False
    return svc.proxy_name is None or svc.proxy_name == proxy_name


def _service_port(svc: Service, port: SvcPort, has: bool, trigger: float) -> ServicePort:
    stype = svc.proxyable_type
    assert stype is not None
    return ServicePort(
        key=ServicePortKey(svc.namespace, svc.name, port.name, port.protocol),
        type=stype, cluster_ips=svc.cluster_ips, port=port.port, node_port=port.node_port,
        external_ips=svc.external_ips, load_balancer_ingress=svc.load_balancer_ingress,
        load_balancer_source_ranges=svc.load_balancer_source_ranges,
        session_affinity=svc.session_affinity,
        session_affinity_timeout=svc.session_affinity_timeout,
        internal_traffic_policy=svc.internal_traffic_policy,
        external_traffic_policy=svc.external_traffic_policy,
        health_check_node_port=svc.health_check_node_port,
        traffic_distribution=svc.traffic_distribution, has_endpoints=has,
        options=svc.options, trigger_time=trigger)


def _better(new: Endpoint, old: Endpoint) -> bool:
    """For a duplicate address: prefer the non-terminating copy, then the ready one."""
    return (not new.terminating, new.ready) > (not old.terminating, old.ready)


# Merged endpoints are built through the slots' descriptors: the same objects as the
# keyword __init__ makes (it checks nothing), at under half the cost.
_new = object.__new__
(_SET_IP, _SET_PORT, _SET_READY, _SET_SERVING, _SET_TERMINATING, _SET_IS_LOCAL, _SET_NODE,
 _SET_ZONE, _SET_HINT_ZONES, _SET_HINT_NODES, _SET_INTERNAL, _SET_EXTERNAL, _SET_CLUSTER,
 _SET_LOCAL) = (Endpoint.__dict__[name].__set__ for name in (
     "ip", "port", "ready", "serving", "terminating", "is_local", "node_name", "zone",
     "hint_zones", "hint_nodes", "internal", "external", "cluster", "local"))


def merge_endpoints(port: SvcPort, slices: Iterable[EndpointSlice]) -> tuple[Endpoint, ...]:
    """All endpoints of one service port across slices, by IP, target port resolved by name."""
    merged: dict[str, Endpoint] = {}
    for sl in slices:
        target = next((p.port for p in sl.ports
                       if p.name == port.name and p.protocol == port.protocol), None)
        if target is None:
            continue
        for ep in sl.endpoints:
            if not ep.addresses:
                continue
            new = _new(Endpoint)
            _SET_IP(new, ep.addresses[0])
            _SET_PORT(new, target)
            _SET_READY(new, ep.ready)
            _SET_SERVING(new, ep.serving)
            _SET_TERMINATING(new, ep.terminating)
            _SET_IS_LOCAL(new, False)
            _SET_NODE(new, ep.node_name)
            _SET_ZONE(new, ep.zone)
            _SET_HINT_ZONES(new, ep.hint_zones)
            _SET_HINT_NODES(new, ep.hint_nodes)
            _SET_INTERNAL(new, False)
            _SET_EXTERNAL(new, False)
            _SET_CLUSTER(new, False)
            _SET_LOCAL(new, False)
            old = merged.get(new.ip)
            if old is None or _better(new, old):
                merged[new.ip] = new
    return tuple(merged[ip] for ip in sorted(merged))


def service_base(svc: Service | None, slices: Iterable[EndpointSlice],
                 proxy_name: str = "") -> ServiceBase:
    """The node-independent part of a service's records."""
    if svc is None or not is_proxied(svc, proxy_name):
        return EMPTY_BASE
    # By name: where two slices hold one address with equal conditions, the same copy
    # wins on every frontend, whatever order the slices arrived in.
    slices = sorted((s for s in slices if s.address_type != "FQDN"), key=lambda s: s.name)
    trigger = max((s.trigger_time for s in slices), default=0.0)
    ports = []
    for port in svc.ports:
        eps = merge_endpoints(port, slices)
        has = any(e.ready or (e.serving and e.terminating) for e in eps)
        ports.append(PortBase(_service_port(svc, port, has, trigger), eps))
    all_eps = [e for p in ports for e in p.endpoints]
    return ServiceBase(
        tuple(ports),
        frozenset(e.node_name for e in all_eps if e.node_name),
        frozenset(n for e in all_eps for n in e.hint_nodes),
        any(e.hint_zones for e in all_eps))


def node_class(base: ServiceBase, node_name: str, zone: str) -> tuple[str, str, str]:
    """Nodes with the same class get the same records for this service (a node's zone
    is part of its class: a node moved to another zone selects anew)."""
    zone = zone if base.uses_zones else ""
    if node_name in base.endpoint_nodes or node_name in base.hinted_nodes:
        return ("node", node_name, zone)
    return ("zone", "", zone)


def _marked(ep: Endpoint, is_local: bool, internal: bool = False, external: bool = False,
            cluster: bool = False, local: bool = False) -> Endpoint:
    return Endpoint(ep.ip, ep.port, ep.ready, ep.serving, ep.terminating, is_local,
                    ep.node_name, ep.zone, ep.hint_zones, ep.hint_nodes, internal, external,
                    cluster, local)


EndpointVariants = dict[tuple[ServicePortKey, str, bool, bool, bool, bool, bool], Endpoint]


def node_records(base: ServiceBase, node_name: str, zone: str,
                 variants: EndpointVariants | None = None,
                 with_local: dict[ServicePortKey, ServicePort] | None = None
                 ) -> dict[ServicePortKey, ServicePortState]:
    """The records one node gets for one service.

    ``variants`` shares identical endpoint objects between the node classes of one
    service version, ``with_local`` their service ports with local endpoints.
    """
    variants = {} if variants is None else variants
    with_local = {} if with_local is None else with_local
    out: dict[ServicePortKey, ServicePortState] = {}
    for port in base.ports:
        key = port.service.key
        mine = [e if not (node_name and e.node_name == node_name) else _marked(e, True)
                for e in port.endpoints]
        sel = categorize_by_family(port.service, mine, node_name, zone)
        eps = {}
        for e in mine:
            vkey = (key, e.ip, e.is_local, e.ip in sel.internal, e.ip in sel.external,
                    e.ip in sel.cluster, e.ip in sel.local)
            marked = variants.get(vkey)
            if marked is None:
                marked = variants[vkey] = _marked(e, *vkey[2:])
            eps[e.ip] = marked
        # Only a node hosting endpoints has a local set: its class is its own.
        svc = port.service
        if sel.has_local:
            svc = with_local.get(key) or with_local.setdefault(
                key, replace(svc, has_local_endpoints=True))
        out[key] = ServicePortState(svc, eps)
    return out


class NodeClassCache:
    """Memoises ``node_records`` per node class for one version of a service."""

    def __init__(self, base: ServiceBase) -> None:
        self.base = base
        self._by_class: dict[tuple[str, str, str],
                             Mapping[ServicePortKey, ServicePortState]] = {}
        self._variants: EndpointVariants = {}
        self._with_local: dict[ServicePortKey, ServicePort] = {}

    def records(self, node_name: str, zone: str) -> Mapping[ServicePortKey, ServicePortState]:
        cls = node_class(self.base, node_name, zone)
        found = self._by_class.get(cls)
        if found is None:
            found = node_records(self.base, node_name, zone, self._variants,
                                 self._with_local)
            self._by_class[cls] = found
        return found

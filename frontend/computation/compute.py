"""Pure per-node computation: (service, its endpoint slices, node) → the node's records.

``service_ports`` does the node-independent work once per service change
(port records, merged endpoints); ``node_records`` adds what depends on the
node. ``NodeClassCache`` lets nodes whose result cannot differ share one result:
a node that hosts none of a service's endpoints and is named in no hint sees
exactly what every other such node in its zone sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from svcproxy.frontend.computation.selection import categorize_by_family
from svcproxy.frontend.edge.objects import EndpointSlice, Service, SliceEndpoint, SvcPort
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServicePortState, ServiceType

Winners = dict[str, tuple[SliceEndpoint, int]]


class PortBase:
    """A service port with its merged endpoints, before any node is considered (each
    endpoint carries the selection of a node that hosts none of them, with no topology).
    Built from the slices' winning endpoints when first read: the sync needs none."""

    __slots__ = ("service", "_endpoints", "_winners")

    def __init__(self, service: ServicePort, endpoints: tuple[Endpoint, ...] | None = None,
                 winners: Winners | None = None) -> None:
        self.service = service
        self._endpoints = endpoints
        self._winners = winners

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        eps = self._endpoints
        if eps is None:
            svc = self.service
            eps = self._endpoints = _built(self._winners or {}, svc.internal_policy_local,
                                           svc.external_policy_local)
            self._winners = None
        return eps


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


# Endpoints and service ports are built through their slots' descriptors: the same
# objects as the keyword __init__ makes (it checks nothing), at under half the cost.
_new = object.__new__
(_SET_IP, _SET_PORT, _SET_READY, _SET_SERVING, _SET_TERMINATING, _SET_IS_LOCAL, _SET_NODE,
 _SET_ZONE, _SET_HINT_ZONES, _SET_HINT_NODES, _SET_INTERNAL, _SET_EXTERNAL, _SET_CLUSTER,
 _SET_LOCAL) = (Endpoint.__dict__[name].__set__ for name in Endpoint.__slots__)
_SERVICE_SETTERS = [ServicePort.__dict__[name].__set__ for name in ServicePort.__slots__]
(_SET_KEY, _SET_TYPE, _SET_CLUSTER_IPS, _SET_SVC_PORT, _SET_NODE_PORT, _SET_EXTERNAL_IPS,
 _SET_LB_INGRESS, _SET_LB_RANGES, _SET_AFFINITY, _SET_AFFINITY_TIMEOUT, _SET_INTERNAL_POLICY,
 _SET_EXTERNAL_POLICY, _SET_HEALTH_PORT, _SET_DISTRIBUTION, _SET_HAS_ENDPOINTS, _SET_OPTIONS,
 _SET_TRIGGER, _SET_HAS_LOCAL) = _SERVICE_SETTERS
_SERVICE_FIELDS = attrgetter(*ServicePort.__slots__)
# An endpoint's fields but is_local and the four marks.
_CONDITIONS = attrgetter("ip", "port", "ready", "serving", "terminating")
_PLACE = attrgetter("node_name", "zone", "hint_zones", "hint_nodes")
# A slice endpoint's fields, read in C over a port's winners.
_READY, _NODE_NAME, _HINT_NODES, _HINT_ZONES = map(attrgetter, (
    "ready", "node_name", "hint_nodes", "hint_zones"))


def _service_port(svc: Service, stype: ServiceType, port: SvcPort, trigger: float
                  ) -> ServicePort:
    """The port's ``ServicePort`` (``has_endpoints`` unset: false)."""
    new = _new(ServicePort)
    _SET_KEY(new, ServicePortKey(svc.namespace, svc.name, port.name, port.protocol))
    _SET_TYPE(new, stype)
    _SET_CLUSTER_IPS(new, svc.cluster_ips)
    _SET_SVC_PORT(new, port.port)
    _SET_NODE_PORT(new, port.node_port)
    _SET_EXTERNAL_IPS(new, svc.external_ips)
    _SET_LB_INGRESS(new, svc.load_balancer_ingress)
    _SET_LB_RANGES(new, svc.load_balancer_source_ranges)
    _SET_AFFINITY(new, svc.session_affinity)
    _SET_AFFINITY_TIMEOUT(new, svc.session_affinity_timeout)
    _SET_INTERNAL_POLICY(new, svc.internal_traffic_policy)
    _SET_EXTERNAL_POLICY(new, svc.external_traffic_policy)
    _SET_HEALTH_PORT(new, svc.health_check_node_port)
    _SET_DISTRIBUTION(new, svc.traffic_distribution)
    _SET_HAS_ENDPOINTS(new, False)
    _SET_OPTIONS(new, svc.options)
    _SET_TRIGGER(new, trigger)
    _SET_HAS_LOCAL(new, False)
    return new


def _with_local(svc: ServicePort) -> ServicePort:
    """``svc`` with ``has_local_endpoints`` set."""
    new = _new(ServicePort)
    for set_field, value in zip(_SERVICE_SETTERS, _SERVICE_FIELDS(svc), strict=True):
        set_field(new, value)
    _SET_HAS_LOCAL(new, True)
    return new


def _marked(ep: Endpoint, is_local: bool, internal: bool = False, external: bool = False,
            cluster: bool = False, local: bool = False) -> Endpoint:
    """``ep`` on one node: ``is_local`` and its selection set."""
    new = _new(Endpoint)
    ip, port, ready, serving, terminating = _CONDITIONS(ep)
    node_name, zone, hint_zones, hint_nodes = _PLACE(ep)
    _SET_IP(new, ip)
    _SET_PORT(new, port)
    _SET_READY(new, ready)
    _SET_SERVING(new, serving)
    _SET_TERMINATING(new, terminating)
    _SET_IS_LOCAL(new, is_local)
    _SET_NODE(new, node_name)
    _SET_ZONE(new, zone)
    _SET_HINT_ZONES(new, hint_zones)
    _SET_HINT_NODES(new, hint_nodes)
    _SET_INTERNAL(new, internal)
    _SET_EXTERNAL(new, external)
    _SET_CLUSTER(new, cluster)
    _SET_LOCAL(new, local)
    return new


def merge_endpoints(port: SvcPort, slices: Iterable[EndpointSlice], internal_local: bool = False,
                    external_local: bool = False) -> tuple[Endpoint, ...]:
    """All endpoints of one service port across slices, by IP, target port resolved by name
    (for a duplicate address: the non-terminating copy, then the ready one, then the first),
    each marked with the selection of a node that hosts none of them, with no topology
    (``categorize(service, endpoints, "", "")`` for a port whose traffic policies are Local
    as given): most nodes' records then share these very objects."""
    return _built(_winners(port, slices), internal_local, external_local)


def _winners(port: SvcPort, slices: Iterable[EndpointSlice]) -> Winners:
    """``merge_endpoints``' choice: IP -> the slice endpoint kept and its target port."""
    merged: Winners = {}
    for sl in slices:
        target = next((p.port for p in sl.ports
                       if p.name == port.name and p.protocol == port.protocol), None)
        if target is None:
            continue
        eps = sl.endpoints
        if not merged:
            # The first slice, when its endpoints' first addresses are all there and
            # unique (nearly always): every endpoint wins.
            first = {ep.addresses[0]: (ep, target) for ep in eps if ep.addresses}
            if len(first) == len(eps):
                merged = first
                continue
        for ep in eps:
            if not ep.addresses:
                continue
            ip = ep.addresses[0]
            old = merged.get(ip)
            if old is None or (not ep.terminating, ep.ready) > (not old[0].terminating,
                                                                 old[0].ready):
                merged[ip] = (ep, target)
    return merged


def _built(merged: Winners, internal_local: bool, external_local: bool
           ) -> tuple[Endpoint, ...]:
    """``merge_endpoints``' endpoints from its winners, by IP."""
    # Per family: the ready endpoints if any, else the serving-and-terminating ones.
    ready_v4 = ready_v6 = False
    for ip, (ep, _) in merged.items():
        if ep.ready:
            if ":" in ip:
                ready_v6 = True
            else:
                ready_v4 = True
    out = []
    for ip in sorted(merged):
        ep, target = merged[ip]
        ready = ep.ready
        chosen = ready if (ready_v6 if ":" in ip else ready_v4) else \
            ep.serving and ep.terminating
        new = _new(Endpoint)
        _SET_IP(new, ip)
        _SET_PORT(new, target)
        _SET_READY(new, ready)
        _SET_SERVING(new, ep.serving)
        _SET_TERMINATING(new, ep.terminating)
        _SET_IS_LOCAL(new, False)
        _SET_NODE(new, ep.node_name)
        _SET_ZONE(new, ep.zone)
        _SET_HINT_ZONES(new, ep.hint_zones)
        _SET_HINT_NODES(new, ep.hint_nodes)
        _SET_INTERNAL(new, chosen and not internal_local)
        _SET_EXTERNAL(new, chosen and not external_local)
        _SET_CLUSTER(new, chosen)
        _SET_LOCAL(new, False)
        out.append(new)
    return tuple(out)


def service_base(svc: Service | None, slices: Iterable[EndpointSlice],
                 proxy_name: str = "") -> ServiceBase:
    """The node-independent part of a service's records."""
    if svc is None or not is_proxied(svc, proxy_name):
        return EMPTY_BASE
    stype = svc.proxyable_type
    assert stype is not None
    # By name: where two slices hold one address with equal conditions, the same copy
    # wins on every frontend, whatever order the slices arrived in.
    slices = sorted((s for s in slices if s.address_type != "FQDN"), key=lambda s: s.name)
    trigger = max([s.trigger_time for s in slices], default=0.0)
    ports = []
    nodes: set[str] = set()
    hinted: set[str] = set()
    uses_zones = False
    for port in svc.ports:
        service = _service_port(svc, stype, port, trigger)
        merged = _winners(port, slices)
        eps = [ep for ep, _ in merged.values()]
        if any(map(_READY, eps)) or any(ep.serving and ep.terminating for ep in eps):
            _SET_HAS_ENDPOINTS(service, True)
        nodes.update(map(_NODE_NAME, eps))
        for names in filter(None, map(_HINT_NODES, eps)):
            hinted.update(names)
        uses_zones = uses_zones or any(map(_HINT_ZONES, eps))
        ports.append(PortBase(service, winners=merged))
    nodes.discard("")
    return ServiceBase(tuple(ports), frozenset(nodes), frozenset(hinted), uses_zones)


def node_class(base: ServiceBase, node_name: str, zone: str) -> tuple[str, str, str]:
    """Nodes with the same class get the same records for this service (a node's zone
    is part of its class: a node moved to another zone selects anew)."""
    zone = zone if base.uses_zones else ""
    if node_name in base.endpoint_nodes or node_name in base.hinted_nodes:
        return ("node", node_name, zone)
    return ("zone", "", zone)


class SharedParts:
    """What the node classes of one service version share, by port index: the record of
    a node that gets the merged endpoints as they are, the sets they are marked in, where
    they run, the endpoints marked otherwise (by port index, IP and marks) and the ports
    with local endpoints."""

    def __init__(self) -> None:
        self.plain: dict[int, ServicePortState] = {}
        self.marks: dict[int, tuple[frozenset[str], ...] | None] = {}
        self.hosts: dict[int, dict[str, list[int]]] = {}
        self.variants: dict[tuple[int, str, tuple[bool, ...]], Endpoint] = {}
        self.with_local: dict[int, ServicePort] = {}

    def plain_record(self, index: int, port: PortBase) -> ServicePortState:
        found = self.plain.get(index)
        if found is None:
            found = self.plain[index] = ServicePortState(
                port.service, {e.ip: e for e in port.endpoints})
        return found

    def plain_marks(self, index: int, port: PortBase) -> tuple[frozenset[str], ...] | None:
        """The IPs the merged endpoints are marked internal, external and cluster in (None
        when one is marked local or local: then none is taken as it is without a look)."""
        if index in self.marks:
            return self.marks[index]
        eps = port.endpoints
        found = None if any(e.is_local or e.local for e in eps) else (
            frozenset([e.ip for e in eps if e.internal]),
            frozenset([e.ip for e in eps if e.external]),
            frozenset([e.ip for e in eps if e.cluster]))
        self.marks[index] = found
        return found

    def hosted(self, index: int, port: PortBase) -> dict[str, list[int]]:
        """Node name -> the positions of the port's endpoints running there."""
        found = self.hosts.get(index)
        if found is None:
            found = self.hosts[index] = {}
            for position, e in enumerate(port.endpoints):
                if e.node_name:
                    found.setdefault(e.node_name, []).append(position)
        return found


def node_records(base: ServiceBase, node_name: str, zone: str,
                 shared: SharedParts | None = None) -> dict[ServicePortKey, ServicePortState]:
    """The records one node gets for one service (``shared`` between the node classes of
    one service version)."""
    shared = SharedParts() if shared is None else shared
    out: dict[ServicePortKey, ServicePortState] = {}
    # A node that hosts no endpoint and is named in no hint, with no zone hints to follow,
    # selects as the merged endpoints are marked.
    plain = not ((node_name and (node_name in base.endpoint_nodes
                                 or node_name in base.hinted_nodes))
                 or (zone and base.uses_zones))
    for index, port in enumerate(base.ports):
        key = port.service.key
        out[key] = (shared.plain_record(index, port) if plain
                    else _port_record(index, port, node_name, zone, shared))
    return out


def _port_record(index: int, port: PortBase, node_name: str, zone: str,
                 shared: SharedParts) -> ServicePortState:
    """One port's record on one node: its endpoints marked with the node's selection."""
    eps: tuple[Endpoint, ...] | list[Endpoint] = port.endpoints
    here = shared.hosted(index, port).get(node_name, ()) if node_name else ()
    if here:
        eps = list(eps)
        for position in here:
            eps[position] = _marked(eps[position], True)
    svc = port.service
    sel = categorize_by_family(svc, eps, node_name, zone)
    internal, external, cluster, local = sel.internal, sel.external, sel.cluster, sel.local
    todo: Sequence[Endpoint] = eps
    chosen: dict[str, Endpoint]
    if (internal, external, cluster) == shared.plain_marks(index, port):
        # Every endpoint not running here is marked as merged: only this node's change.
        chosen = dict(shared.plain_record(index, port).endpoints)
        todo = [eps[position] for position in here]
    else:
        chosen = {}
    variants = shared.variants
    as_merged = True
    for e in todo:
        ip = e.ip
        marks = (e.is_local, ip in internal, ip in external, ip in cluster, ip in local)
        if marks == (False, e.internal, e.external, e.cluster, e.local):
            chosen[ip] = e
            continue
        as_merged = False
        vkey = (index, ip, marks)
        marked = variants.get(vkey)
        if marked is None:
            if e.is_local and e.node_name == node_name and here:
                # Made above for this node, seen by nothing else yet: marked in place.
                _SET_INTERNAL(e, marks[1])
                _SET_EXTERNAL(e, marks[2])
                _SET_CLUSTER(e, marks[3])
                _SET_LOCAL(e, marks[4])
                marked = e
            else:
                marked = _marked(e, *marks)
            variants[vkey] = marked
        chosen[ip] = marked
    if as_merged:
        return shared.plain_record(index, port)
    # Only a node hosting endpoints has a local set: its class is its own.
    if local:
        found = shared.with_local.get(index)
        svc = found if found is not None else shared.with_local.setdefault(
            index, _with_local(svc))
    return ServicePortState(svc, chosen)


class NodeClassCache:
    """Memoises ``node_records`` per node class for one version of a service."""

    def __init__(self, base: ServiceBase) -> None:
        self.base = base
        self._by_class: dict[tuple[str, str, str],
                             Mapping[ServicePortKey, ServicePortState]] = {}
        self._shared = SharedParts()

    def records(self, node_name: str, zone: str) -> Mapping[ServicePortKey, ServicePortState]:
        cls = node_class(self.base, node_name, zone)
        found = self._by_class.get(cls)
        if found is None:
            found = node_records(self.base, node_name, zone, self._shared)
            self._by_class[cls] = found
        return found

"""The computation's cheaper algorithm gives exactly the records of the plain one.

``REFERENCE`` below is the computation as it was before it was made cheaper (merge every
slice endpoint into a new endpoint, then copy each endpoint per node class with its
marks, categorised by set comprehensions): for any service, slices and nodes,
``NodeClassCache`` (shared parts, merged endpoints carrying the plain selection, records
shared between classes) must give every node records equal to the reference's, whatever
order the nodes ask in.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.computation.compute import NodeClassCache, service_base
from svcproxy.frontend.edge.objects import (
    EndpointSlice,
    Service,
    SliceEndpoint,
    SlicePort,
    SvcPort,
)
from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    TrafficPolicy,
)

# ---- the reference: the computation before it was made cheaper ------------------------


def _ref_topology(endpoints: Sequence[Endpoint], node: str, zone: str) -> str:
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return ""
    if node and all(e.hint_nodes for e in ready) and any(node in e.hint_nodes for e in ready):
        return "PreferSameNode"
    if zone and all(e.hint_zones for e in ready) and any(zone in e.hint_zones for e in ready):
        return "PreferSameZone"
    return ""


def _ref_categorize(svc: ServicePort, eps: Sequence[Endpoint], node: str, zone: str
                    ) -> tuple[set[str], set[str], set[str], set[str]]:
    mode = _ref_topology(eps, node, zone)
    cluster = {e.ip for e in eps if e.ready and (
        node in e.hint_nodes if mode == "PreferSameNode" else
        zone in e.hint_zones if mode == "PreferSameZone" else True)}
    if not cluster:
        cluster = {e.ip for e in eps if e.serving and e.terminating}
    local = {e.ip for e in eps if e.is_local and e.ready} or {
        e.ip for e in eps if e.is_local and e.serving and e.terminating}
    return (local if svc.internal_policy_local else cluster,
            local if svc.external_policy_local else cluster, cluster, local)


def _ref_by_family(svc: ServicePort, eps: Sequence[Endpoint], node: str, zone: str
                   ) -> tuple[set[str], set[str], set[str], set[str]]:
    v6 = [e for e in eps if ":" in e.ip]
    if not v6 or len(v6) == len(eps):
        return _ref_categorize(svc, eps, node, zone)
    a = _ref_categorize(svc, [e for e in eps if ":" not in e.ip], node, zone)
    b = _ref_categorize(svc, v6, node, zone)
    return tuple(x | y for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _ref_merge(port: SvcPort, slices: Sequence[EndpointSlice]) -> list[Endpoint]:
    merged: dict[str, Endpoint] = {}
    for sl in slices:
        target = next((p.port for p in sl.ports
                       if p.name == port.name and p.protocol == port.protocol), None)
        if target is None:
            continue
        for ep in sl.endpoints:
            if not ep.addresses:
                continue
            new = Endpoint(ep.addresses[0], target, ep.ready, ep.serving, ep.terminating,
                           False, ep.node_name, ep.zone, ep.hint_zones, ep.hint_nodes)
            old = merged.get(new.ip)
            if old is None or (not new.terminating, new.ready) > (not old.terminating,
                                                                  old.ready):
                merged[new.ip] = new
    return [merged[ip] for ip in sorted(merged)]


def reference(svc: Service, slices: Sequence[EndpointSlice], node: str, zone: str
              ) -> dict[ServicePortKey, ServicePortState]:
    """Every record of ``svc`` for node ``node`` of ``zone``, computed the plain way."""
    stype = svc.proxyable_type
    if stype is None:
        return {}
    slices = sorted((s for s in slices if s.address_type != "FQDN"), key=lambda s: s.name)
    trigger = max((s.trigger_time for s in slices), default=0.0)
    out = {}
    for port in svc.ports:
        eps = _ref_merge(port, slices)
        sp = ServicePort(
            ServicePortKey(svc.namespace, svc.name, port.name, port.protocol), stype,
            svc.cluster_ips, port.port, port.node_port, svc.external_ips,
            svc.load_balancer_ingress, svc.load_balancer_source_ranges,
            svc.session_affinity, svc.session_affinity_timeout,
            svc.internal_traffic_policy, svc.external_traffic_policy,
            svc.health_check_node_port, svc.traffic_distribution,
            any(e.ready or (e.serving and e.terminating) for e in eps), svc.options, trigger)
        mine = [Endpoint(e.ip, e.port, e.ready, e.serving, e.terminating, True, e.node_name,
                         e.zone, e.hint_zones, e.hint_nodes)
                if node and e.node_name == node else e for e in eps]
        internal, external, cluster, local = _ref_by_family(sp, mine, node, zone)
        marked = {e.ip: Endpoint(e.ip, e.port, e.ready, e.serving, e.terminating, e.is_local,
                                 e.node_name, e.zone, e.hint_zones, e.hint_nodes,
                                 e.ip in internal, e.ip in external, e.ip in cluster,
                                 e.ip in local) for e in mine}
        if local:
            sp = ServicePort(**{f: getattr(sp, f) for f in ServicePort.__slots__
                                if f != "has_local_endpoints"}, has_local_endpoints=True)
        out[sp.key] = ServicePortState(sp, marked)
    return out


# ---- generated services, slices and nodes ---------------------------------------------

NODES = ["n1", "n2", "n3"]
ZONES = ["", "a", "b"]
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.10", "fd00::1", "fd00::2"]
PORTS = [SvcPort("http", Protocol.TCP, 80, 30080, "http"),
         SvcPort("dns", Protocol.UDP, 53, 0, "53")]

endpoints = st.builds(
    SliceEndpoint, addresses=st.one_of(st.sampled_from(IPS).map(lambda ip: (ip,)),
                                       st.lists(st.sampled_from(IPS), max_size=2).map(tuple)),
    ready=st.booleans(), serving=st.booleans(), terminating=st.booleans(),
    node_name=st.sampled_from(["", *NODES]), zone=st.sampled_from(ZONES),
    hint_zones=st.sampled_from([(), ("a",), ("b",), ("a", "b")]),
    hint_nodes=st.sampled_from([(), ("n1",), ("n2",), ("n1", "n3")]))
slice_ports = st.lists(st.sampled_from([
    SlicePort("http", Protocol.TCP, 8080), SlicePort("http", Protocol.TCP, 8081),
    SlicePort("dns", Protocol.UDP, 5353)]), max_size=2).map(tuple)
slices = st.lists(st.builds(
    EndpointSlice, namespace=st.just("ns"), name=st.sampled_from(["a", "b", "c"]),
    service_name=st.just("web"), address_type=st.sampled_from(["IPv4", "IPv6", "FQDN"]),
    ports=slice_ports, endpoints=st.lists(endpoints, max_size=5).map(tuple),
    trigger_time=st.sampled_from([0.0, 1.5, 2.0])), max_size=3)
policies = st.sampled_from(list(TrafficPolicy))
services = st.builds(
    Service, namespace=st.just("ns"), name=st.just("web"),
    type=st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]),
    cluster_ips=st.sampled_from([(), ("10.96.0.1",), ("10.96.0.1", "fd00:96::1")]),
    ports=st.lists(st.sampled_from(PORTS), min_size=1, max_size=2, unique=True).map(tuple),
    external_ips=st.sampled_from([(), ("1.2.3.4",)]),
    internal_traffic_policy=policies, external_traffic_policy=policies)
asks = st.lists(st.tuples(st.sampled_from(["", "n4", *NODES]), st.sampled_from(ZONES)),
                min_size=1, max_size=8)


# A node no hint names, in a zone the hints narrow to (its records are not the plain ones).
ZONE_HINTED = (
    Service("ns", "web", "ClusterIP", ("10.96.0.1",), (PORTS[0],)),
    [EndpointSlice("ns", "a", "web", "IPv4", (SlicePort("http", Protocol.TCP, 8080),), (
        SliceEndpoint(("10.0.0.1",), True, True, False, "n1", "a", ("a",), ()),
        SliceEndpoint(("10.0.0.2",), True, True, False, "n2", "b", ("b",), ())), 0.0)],
    [("n4", "a")])
# IPv4 has only a terminating endpoint, IPv6 a ready one: each family falls back alone.
FAMILIES = (
    ZONE_HINTED[0],
    [EndpointSlice("ns", "a", "web", "IPv4", (SlicePort("http", Protocol.TCP, 8080),), (
        SliceEndpoint(("10.0.0.1",), False, True, True, "n1", "", (), ()),
        SliceEndpoint(("fd00::1",), True, True, False, "n2", "", (), ())), 0.0)],
    [("n4", ""), ("n1", "")])


@settings(max_examples=600, deadline=None)
@given(services, slices, asks)
@example(*ZONE_HINTED)
@example(*FAMILIES)
def test_every_node_gets_the_reference_records(svc: Service, sl: list[EndpointSlice],
                                               nodes: list[tuple[str, str]]) -> None:
    cache = NodeClassCache(service_base(svc, sl))
    for node, zone in nodes:
        got = cache.records(node, zone)
        assert got == reference(svc, sl, node, zone), (node, zone)
        for rec in got.values():
            # Equal to the reference field by field, flags included (== on dataclasses).
            assert all(type(e) is Endpoint for e in rec.endpoints.values())

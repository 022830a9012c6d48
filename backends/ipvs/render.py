"""From one service port to the IPVS objects it needs on this node (pure).

A Kubernetes service port becomes N virtual servers (one per ClusterIP,
ExternalIP, LB ingress IP and node address:nodePort), each with one NAT real
server per endpoint of the same IP family, plus the addresses to bind to
kube-ipvs0 and the ipset entries the fixed iptables rules match on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs.genl import DestId, ServiceId, ServiceSpec
from svcproxy.backends.ipvs.names import SCHEDULER_ANNOTATION
from svcproxy.backends.ipvs.options import SCHEDULERS
from svcproxy.sdk import (
    DEFAULT_AFFINITY_TIMEOUT,
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortState,
    ServiceType,
    ip_family,
)


@dataclass(frozen=True, slots=True)
class RenderContext:
    """What the rendering needs from the node and the flags."""

    scheduler: str = "rr"
    node_port_ips: tuple[str, ...] = ()
    node_ips: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VirtualServer:
    spec: ServiceSpec
    dests: frozenset[DestId]


@dataclass(frozen=True, slots=True)
class ShortCircuit:
    """externalTrafficPolicy Local: traffic from pods to the external addresses
    (``targets``, as ipset "ip,proto:port") still reaches every endpoint, through a
    firewall-mark virtual server whose mark the Desired state allocates."""

    family: int
    targets: frozenset[str]
    dests: frozenset[DestId]
    scheduler: str
    persistence: int


@dataclass(frozen=True, slots=True)
class PortPlan:
    """Everything one service port contributes to the node's IPVS programming."""

    servers: tuple[VirtualServer, ...] = ()
    addresses: frozenset[str] = frozenset()
    local_routes: frozenset[str] = frozenset()
    entries: frozenset[tuple[str, str]] = frozenset()
    warnings: tuple[str, ...] = ()
    short_circuits: tuple[ShortCircuit, ...] = ()


def scheduler_for(service: ServicePort, default: str) -> tuple[str, str]:
    """The scheduler (annotation first, then --ipvs-scheduler) and a warning if ignored."""
    wanted = service.option(SCHEDULER_ANNOTATION).strip()
    if not wanted:
        return default, ""
    if wanted in SCHEDULERS:
        return wanted, ""
    return default, (
        f"{service.key}: ignoring annotation {SCHEDULER_ANNOTATION}={wanted!r} (unknown "
        f"scheduler; choose one of {', '.join(SCHEDULERS)}); using {default}"
    )


def _dests(endpoints: Sequence[Endpoint], family: int) -> frozenset[DestId]:
    return frozenset(DestId(e.ip, e.port) for e in endpoints if ip_family(e.ip) == family)


def _ip_port(ip: str, protocol: Protocol, port: int) -> str:
    return f"{ip},{protocol.value.lower()}:{port}"


class _Builder:
    """Collects one port's objects; small helper to keep render_port readable."""

    def __init__(self, state: ServicePortState, ctx: RenderContext) -> None:
        svc = state.service
        self.svc = svc
        self.proto = svc.key.protocol
        self.scheduler, warning = scheduler_for(svc, ctx.scheduler)
        self.warnings = (warning,) if warning else ()
        timeout = svc.session_affinity_timeout or DEFAULT_AFFINITY_TIMEOUT
        self.persistence = timeout if svc.affinity else 0
        self.internal = state.internal_endpoints()
        self.external = state.external_endpoints()
        self.cluster = state.cluster_endpoints()
        self.hairpin = state.hairpin_endpoints()
        self.servers: list[VirtualServer] = []
        self.addresses: set[str] = set()
        self.routes: set[str] = set()
        self.entries: set[tuple[str, str]] = set()

    def server(self, ip: str, port: int, endpoints: Sequence[Endpoint]) -> None:
        spec = ServiceSpec(ServiceId(self.proto.value, ip, port), self.scheduler, self.persistence)
        self.servers.append(VirtualServer(spec, _dests(endpoints, ip_family(ip))))

    def external_targets(self, family: int) -> set[str]:
        """The "ip,proto:port" of every external virtual server of one family."""
        return {
            _ip_port(v.spec.id.address, self.proto, v.spec.id.port) for v in self.servers
            if ip_family(v.spec.id.address) == family
            and v.spec.id.address not in self.svc.cluster_ips
        }

    def short_circuits(self) -> tuple[ShortCircuit, ...]:
        """With externalTrafficPolicy Local: pods and the node keep reaching the cluster
        set, and other external traffic without a local endpoint is dropped (with no
        endpoint anywhere the virtual server without real servers refuses it)."""
        if not self.svc.external_policy_local:
            return ()
        result = []
        for family in (4, 6):
            targets = self.external_targets(family)
            if not targets:
                continue
            if self.svc.has_endpoints and not _dests(self.external, family):
                self.entries.update((N.set_name(N.NO_LOCAL_ENDPOINTS, family), t) for t in targets)
            result.append(ShortCircuit(family, frozenset(targets), _dests(self.cluster, family),
                                       self.scheduler, self.persistence))
        return tuple(result)

    def entry(self, base: str, family: int, value: str) -> None:
        self.entries.add((N.set_name(base, family), value))

    def plan(self) -> PortPlan:
        short = self.short_circuits()
        return PortPlan(tuple(sorted(self.servers, key=lambda v: v.spec.id)),
                        frozenset(self.addresses), frozenset(self.routes),
                        frozenset(self.entries), self.warnings, short)


def render_port(state: ServicePortState, ctx: RenderContext) -> PortPlan:
    """The IPVS objects, bound addresses and ipset entries of one service port."""
    b = _Builder(state, ctx)
    svc = b.svc
    families = sorted({ip_family(ip) for ip in svc.cluster_ips})
    _cluster_ips(b)
    _loop_back(b)
    _external_ips(b)
    _load_balancers(b, ctx)
    if svc.node_port and svc.type is not ServiceType.CLUSTER_IP:
        _node_ports(b, ctx, families)
    if svc.health_check_node_port and svc.external_policy_local:
        for family in families:
            b.entry(N.HEALTH_CHECK_NODE_PORT, family, str(svc.health_check_node_port))
    return b.plan()


def _cluster_ips(b: _Builder) -> None:
    for ip in b.svc.cluster_ips:
        b.server(ip, b.svc.port, b.internal)
        b.addresses.add(ip)
        b.entry(N.CLUSTER_IP, ip_family(ip), _ip_port(ip, b.proto, b.svc.port))
        b.entry(N.IPVS_IPS, ip_family(ip), ip)


def _loop_back(b: _Builder) -> None:
    """Hairpin: a local endpoint reaching itself through the service is masqueraded."""
    for e in b.hairpin:
        b.entry(N.LOOP_BACK, ip_family(e.ip), f"{_ip_port(e.ip, b.proto, e.port)},{e.ip}")


def _external_ips(b: _Builder) -> None:
    base = N.EXTERNAL_IP_LOCAL if b.svc.external_policy_local else N.EXTERNAL_IP
    for ip in b.svc.external_ips:
        b.server(ip, b.svc.port, b.external)
        b.addresses.add(ip)
        b.entry(base, ip_family(ip), _ip_port(ip, b.proto, b.svc.port))
        b.entry(N.IPVS_IPS, ip_family(ip), ip)


def _load_balancers(b: _Builder, ctx: RenderContext) -> None:
    svc = b.svc
    for ip in svc.vip_ingress_ips():
        family = ip_family(ip)
        key = _ip_port(ip, b.proto, svc.port)
        b.server(ip, svc.port, b.external)
        b.routes.add(ip)
        b.entry(N.LOAD_BALANCER, family, key)
        b.entry(N.IPVS_IPS, family, ip)
        if svc.external_policy_local:
            b.entry(N.LOAD_BALANCER_LOCAL, family, key)
        ranges = [r for r in svc.load_balancer_source_ranges if ip_family(r) == family]
        if not ranges:
            continue
        b.entry(N.LOAD_BALANCER_FW, family, key)
        for cidr in ranges:
            b.entry(N.LOAD_BALANCER_SOURCE_CIDR, family, f"{key},{cidr}")
        allowed = {ip} | {n for n in ctx.node_ips if ip_family(n) == family}
        allowed |= {e.ip for e in b.hairpin if e.external and ip_family(e.ip) == family}
        for source in allowed:
            b.entry(N.LOAD_BALANCER_SOURCE_IP, family, f"{key},{source}")


def _node_ports(b: _Builder, ctx: RenderContext, families: Sequence[int]) -> None:
    svc = b.svc
    local = svc.external_policy_local
    for ip in ctx.node_port_ips:
        # kube-proxy's IPVS mode never serves NodePorts on loopback.
        if ip_family(ip) in families and not ipaddress.ip_address(ip).is_loopback:
            b.server(ip, svc.node_port, b.external)
    for family in families:
        if b.proto is Protocol.SCTP:
            base = N.NODE_PORT_LOCAL_SCTP if local else N.NODE_PORT_SCTP
            for ip in ctx.node_port_ips:
                if ip_family(ip) == family and not ipaddress.ip_address(ip).is_loopback:
                    b.entry(base, family, _ip_port(ip, b.proto, svc.node_port))
            continue
        if b.proto is Protocol.TCP:
            base = N.NODE_PORT_LOCAL_TCP if local else N.NODE_PORT_TCP
        else:
            base = N.NODE_PORT_LOCAL_UDP if local else N.NODE_PORT_UDP
        b.entry(base, family, str(svc.node_port))

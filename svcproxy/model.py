"""The typed per-node state shared by the frontend, the API and every backend.

These are plain frozen dataclasses: the frontend computes them, the gRPC layer
converts them to and from protobuf (svcproxy.convert), and the SDK hands them
to backends. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Protocol(StrEnum):
    """A service port's protocol."""

    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class ServiceType(StrEnum):
    """spec.type of a Service (ExternalName services are never proxied)."""

    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class TrafficPolicy(StrEnum):
    """spec.internalTrafficPolicy / spec.externalTrafficPolicy."""

    CLUSTER = "Cluster"
    LOCAL = "Local"


class SessionAffinity(StrEnum):
    """spec.sessionAffinity."""

    NONE = "None"
    CLIENT_IP = "ClientIP"


DEFAULT_AFFINITY_TIMEOUT = 10800


@dataclass(frozen=True, slots=True, order=True)
class ServicePortKey:
    """One port of one Service: the unit every backend programs."""

    namespace: str
    name: str
    port_name: str
    protocol: Protocol

    def __str__(self) -> str:
        port = f":{self.port_name}" if self.port_name else ""
        return f"{self.namespace}/{self.name}{port}/{self.protocol.value.lower()}"

    @property
    def service(self) -> str:
        """The owning Service as namespace/name."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class LoadBalancerIngress:
    """One status.loadBalancer.ingress address; ipMode "Proxy" is not handled by nodes."""

    ip: str
    ip_mode: str = "VIP"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """The service-level part of one service port as one node sees it."""

    key: ServicePortKey
    type: ServiceType = ServiceType.CLUSTER_IP
    cluster_ips: tuple[str, ...] = ()
    port: int = 0
    node_port: int = 0
    external_ips: tuple[str, ...] = ()
    load_balancer_ingress: tuple[LoadBalancerIngress, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity: SessionAffinity = SessionAffinity.NONE
    session_affinity_timeout: int = 0
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int = 0
    traffic_distribution: str = ""
    has_endpoints: bool = False
    options: tuple[tuple[str, str], ...] = ()
    trigger_time: float = 0.0
    has_local_endpoints: bool = False

    @property
    def affinity(self) -> bool:
        return self.session_affinity is SessionAffinity.CLIENT_IP

    @property
    def external_policy_local(self) -> bool:
        """externalTrafficPolicy Local matters only where there is external traffic."""
        return (
            self.external_traffic_policy is TrafficPolicy.LOCAL
            and (self.type is not ServiceType.CLUSTER_IP or bool(self.external_ips))
        )

    @property
    def internal_policy_local(self) -> bool:
        return self.internal_traffic_policy is TrafficPolicy.LOCAL

    def option(self, name: str, default: str = "") -> str:
        return dict(self.options).get(name, default)

    def vip_ingress_ips(self) -> tuple[str, ...]:
        """Load-balancer ingress IPs the node must handle (ipMode VIP)."""
        return tuple(i.ip for i in self.load_balancer_ingress if i.ip_mode != "Proxy")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of a service port as one node sees it.

    ``internal``, ``external``, ``cluster`` and ``local`` are the frontend's decision
    (kube-proxy's CategorizeEndpoints for this node): whether cluster-internal traffic
    (ClusterIP) and external traffic (NodePort, ExternalIP, LoadBalancer) go to this
    endpoint after traffic policies, topology and the terminating fallback, and whether
    it is in the cluster-wide set (what traffic from pods and from the node to an
    externalTrafficPolicy Local service's external addresses uses) and in the node's
    local set. A backend programs them as given and never re-decides from the
    conditions (``ready``, ``serving``, ``terminating``, ``is_local``, hints).
    """

    ip: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    is_local: bool = False
    node_name: str = ""
    zone: str = ""
    hint_zones: tuple[str, ...] = ()
    hint_nodes: tuple[str, ...] = ()
    internal: bool = False
    external: bool = False
    cluster: bool = False
    local: bool = False


@dataclass(frozen=True, slots=True)
class ServicePortState:
    """A service port and its endpoints (by IP), as one node sees them."""

    service: ServicePort
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)

    @property
    def key(self) -> ServicePortKey:
        return self.service.key

    def internal_endpoints(self) -> list[Endpoint]:
        """Endpoints for cluster-internal traffic (ClusterIP), sorted by IP."""
        return [e for _, e in sorted(self.endpoints.items()) if e.internal]

    def external_endpoints(self) -> list[Endpoint]:
        """Endpoints for external traffic (NodePort, ExternalIP, LB), sorted by IP:
        externalTrafficPolicy applied. A service port without any external address (a
        ClusterIP service with no externalIPs: no node port, no ingress) receives no
        external traffic; its external set is then the cluster-wide set (the policy has
        nothing to apply to), and a backend has nothing to program with it."""
        return [e for _, e in sorted(self.endpoints.items()) if e.external]

    def cluster_endpoints(self) -> list[Endpoint]:
        """The cluster-wide set (kube-proxy's clusterEndpoints), sorted by IP: where traffic
        from pods and from the node to an externalTrafficPolicy Local service's external
        addresses is short-circuited."""
        return [e for _, e in sorted(self.endpoints.items()) if e.cluster]

    def local_set(self) -> list[Endpoint]:
        """The node's local set (kube-proxy's localEndpoints), sorted by IP."""
        return [e for _, e in sorted(self.endpoints.items()) if e.local]

    def local_endpoints(self) -> list[Endpoint]:
        """Every endpoint running on this node (used or not), sorted by IP."""
        return [e for _, e in sorted(self.endpoints.items()) if e.is_local]

    def hairpin_endpoints(self) -> list[Endpoint]:
        """Endpoints on this node that some traffic through the service reaches (a pod
        reaching itself through the service is masqueraded), sorted by IP."""
        return [e for _, e in sorted(self.endpoints.items())
                if e.is_local and (e.internal or e.external or e.cluster)]

    def family(self, family: int) -> ServicePortState | None:
        """This record restricted to one IP family (4 or 6), as a per-family proxier sees it;
        None when the service has no cluster IP of that family."""
        svc = self.service
        cluster_ips = tuple(of_family(svc.cluster_ips, family))
        if not cluster_ips:
            return None
        eps = {ip: e for ip, e in self.endpoints.items() if ip_family(ip) == family}
        return ServicePortState(replace(
            svc, cluster_ips=cluster_ips, external_ips=tuple(of_family(svc.external_ips, family)),
            load_balancer_ingress=tuple(i for i in svc.load_balancer_ingress
                                        if ip_family(i.ip) == family),
            load_balancer_source_ranges=tuple(of_family(svc.load_balancer_source_ranges,
                                                        family))), eps)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The node a backend runs on, from its Node object."""

    name: str
    zone: str = ""
    pod_cidrs: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    terminating: bool = False


def ip_family(address: str) -> int:
    """4 or 6 for an IP address or CIDR."""
    return 6 if ":" in address else 4


def of_family(addresses: Iterable[str], family: int) -> list[str]:
    """The addresses (or CIDRs) of one IP family, in their order."""
    return [a for a in addresses if ip_family(a) == family]


# Four dot-separated decimal octets, any number of leading zeros each (Go's dtoi, which
# netutils.ParseIPSloppy keeps: the check that refuses them came in Go 1.17).
_IPV4 = re.compile(r"0*(\d{1,3})\.0*(\d{1,3})\.0*(\d{1,3})\.0*(\d{1,3})", re.ASCII)


def parse_ipv4(text: str) -> int | None:
    """An IPv4 address as an integer, read as Kubernetes reads one (netutils.ParseIPSloppy):
    ASCII digits only, octets may have leading zeros; None if ``text`` is not one."""
    m = _IPV4.fullmatch(text)
    if m is None:
        return None
    a, b, c, d = map(int, m.groups())
    if a > 255 or b > 255 or c > 255 or d > 255:
        return None
    return a << 24 | b << 16 | c << 8 | d


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP as Kubernetes reads it (netutils.ParseIPSloppy): IPv4 as ``parse_ipv4`` reads
    it, IPv6 without a zone index (Python's ipaddress reads one), no whitespace around
    either; None if invalid. The one reader of an IP's text: every other goes through it."""
    if ":" not in text:
        v4 = parse_ipv4(text)
        return None if v4 is None else ipaddress.IPv4Address(v4)
    if "%" in text:
        return None
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def normalize_ip(text: str) -> str | None:
    """Canonical form of an IP read by ``parse_ip``, whitespace around it dropped (as around
    a flag's or list's item); None if invalid."""
    text = text.strip()
    if ":" not in text:
        v4 = parse_ipv4(text)
        return None if v4 is None else _ipv4_text(v4)
    ip = parse_ip(text)
    return None if ip is None else str(ip)


def normalize_cidr(text: str) -> str | None:
    """Canonical form of a CIDR (host bits cleared); None if invalid. Read as Kubernetes
    reads one (netutils.ParseCIDRSloppy): ADDRESS/LENGTH, the address as ``parse_ip`` reads
    it, the length is decimal (no netmask), may have leading zeros; whitespace around it is
    dropped, as around a list item (the apiserver allows it in loadBalancerSourceRanges).
    IPv4 in integer arithmetic: a tenth of ``ipaddress.ip_network``'s cost (a Service may
    list 100,000 source ranges)."""
    addr, slash, length = text.strip().partition("/")
    if not slash or not (length.isascii() and length.isdigit()):
        return None
    length = length.lstrip("0") or "0"  # a 5,000-digit int() raises
    if len(length) > 3:
        return None
    if ":" not in addr:
        v4 = parse_ipv4(addr)
        bits = int(length)
        if v4 is None or bits > 32:
            return None
        return f"{_ipv4_text(v4 & (0xFFFFFFFF << (32 - bits)))}/{bits}"
    ip = parse_ip(addr)
    if ip is None:
        return None
    try:
        return str(ipaddress.ip_network(f"{ip}/{length}", strict=False))
    except ValueError:
        return None


def _ipv4_text(value: int) -> str:
    """An IPv4 address's canonical text from its integer."""
    return f"{value >> 24}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"

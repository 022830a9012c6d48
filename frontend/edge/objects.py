"""The cluster objects the frontend uses (Service, EndpointSlice, Node: only the fields
svcproxy needs) and the readings of checked values every kind's reader shares.

Each kind's module (service.py, endpointslice.py, node.py) makes these objects from
Kubernetes JSON in one pass, its rules giving the values checked; the readings here take
a value already checked (an address, a timestamp) to the form served.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import msgspec

from svcproxy.frontend.edge import rfc3339
from svcproxy.frontend.edge.addresses import CANONICAL_IPV4
from svcproxy.model import (
    LoadBalancerIngress,
    Protocol,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
    normalize_ip,
)
from svcproxy.wirevalues import LATEST

_PROXIED_TYPES = {"NodePort": ServiceType.NODE_PORT, "LoadBalancer": ServiceType.LOAD_BALANCER}


class _Object(msgspec.Struct, frozen=True, gc=False):
    """Immutable, compared and hashed by value as a frozen dataclass is, built in C (a
    frozen dataclass's ``__init__`` sets each field from Python: 7 us for a Service,
    2.5 us for an endpoint, against 0.3-0.5 us); no reference cycles, so untracked.
    Subclasses inherit ``frozen`` and say it again for type checkers."""


class SvcPort(_Object, frozen=True):
    name: str
    protocol: Protocol
    port: int
    node_port: int
    target_port: str


class Service(_Object, frozen=True):
    namespace: str
    name: str
    type: str
    cluster_ips: tuple[str, ...]
    ports: tuple[SvcPort, ...]
    external_ips: tuple[str, ...] = ()
    load_balancer_ingress: tuple[LoadBalancerIngress, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity: SessionAffinity = SessionAffinity.NONE
    session_affinity_timeout: int = 0
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int = 0
    traffic_distribution: str = ""
    topology_mode: str = ""
    proxy_name: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    created: float = 0.0  # metadata.creationTimestamp (0: unknown): orders claims.py

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def proxyable_type(self) -> ServiceType | None:
        """The type as svcproxy programs it; None for ExternalName and headless."""
        if self.type == "ExternalName" or not self.cluster_ips:
            return None
        return _PROXIED_TYPES.get(self.type, ServiceType.CLUSTER_IP)


class SliceEndpoint(_Object, frozen=True):
    addresses: tuple[str, ...]
    ready: bool
    serving: bool
    terminating: bool
    node_name: str
    zone: str
    hint_zones: tuple[str, ...]
    hint_nodes: tuple[str, ...]


class SlicePort(_Object, frozen=True):
    name: str
    protocol: Protocol
    port: int


class EndpointSlice(_Object, frozen=True):
    namespace: str
    name: str
    service_name: str
    address_type: str
    ports: tuple[SlicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]
    trigger_time: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


class Node(_Object, frozen=True):
    name: str
    zone: str
    labels: tuple[tuple[str, str], ...]
    pod_cidrs: tuple[str, ...]
    addresses: tuple[str, ...]
    terminating: bool


def canonical_ip(text: str) -> str | None:
    """``normalize_ip``, with IPv4 already in canonical form (nearly every address) taken
    as it is."""
    if CANONICAL_IPV4.fullmatch(text):
        return text
    return normalize_ip(text)


def kube_ip(text: str) -> str:
    """A checked address (``Checker.ip``) as it is served: in canonical form, an
    IPv4-mapped one as its IPv4 address (Go's To4(), which Kubernetes validates and
    kube-proxy programs it as)."""
    if CANONICAL_IPV4.fullmatch(text):
        return text
    ip = normalize_ip(text) or text
    if ip.startswith("::ffff:"):
        mapped = ipaddress.IPv6Address(ip).ipv4_mapped
        return str(mapped) if mapped is not None else ip
    return ip


def kube_ips(values: list[str]) -> tuple[str, ...]:
    """Checked addresses as they are served (``kube_ip``), without repeats."""
    if len(values) == 1 and CANONICAL_IPV4.fullmatch(values[0]):
        return (values[0],)
    return tuple(dict.fromkeys(map(kube_ip, values)))


def parse_time(text: Any) -> float:
    """Unix seconds of an RFC 3339 timestamp as kube-proxy reads one (rfc3339.parse);
    0.0 when absent, not one, before 1970 or past what the wire carries."""
    parsed = rfc3339.parse(text) if text else None
    if parsed is None or parsed[0] < 0:
        return 0.0
    return min(parsed[0] + parsed[1] / 1e9, LATEST)

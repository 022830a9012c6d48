"""Listed Services of the common shape, decoded from their JSON straight into the store's
objects (msgspec's typed decoding, in C) instead of dicts then validation.py and parse,
as endpointslice.py does for EndpointSlices. Only what those would accept as it is:
anything else, or any doubt (a field not listed here, ExternalName, IPv6 or dual-stack,
source ranges, limits below the defaults), is None, and the caller takes the general
path, which says why and gives the same object.
"""

from __future__ import annotations

import msgspec

from svcproxy.frontend.edge.addresses import CANONICAL_IPV4, FORBIDDEN_IPV4
from svcproxy.frontend.edge.checker import PROTOCOLS
from svcproxy.frontend.edge.limits import ObjectLimits
from svcproxy.frontend.edge.metadata import Meta, decoded, metadata_ok
from svcproxy.frontend.edge.names import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    is_app_protocol,
    is_port_name,
    matches,
)
from svcproxy.frontend.edge.objects import Service, SvcPort, parse_time
from svcproxy.frontend.edge.service import (
    IP_FAMILY_POLICIES,
    SOURCE_RANGES_ANNOTATION,
    TRAFFIC_DISTRIBUTIONS,
)
from svcproxy.frontend.edge.wellknown import (
    OPTION_PREFIX,
    SERVICE_PROXY_NAME_LABEL,
    TOPOLOGY_ANNOTATIONS,
)
from svcproxy.model import (
    DEFAULT_AFFINITY_TIMEOUT,
    LoadBalancerIngress,
    Protocol,
    SessionAffinity,
    TrafficPolicy,
)


class _Port(msgspec.Struct, forbid_unknown_fields=True):
    name: str | None = None
    protocol: str | None = None
    port: int | None = None
    # Absent is the port itself, null is "None" to the general path: null is not typed.
    targetPort: int | str | msgspec.UnsetType = msgspec.UNSET
    nodePort: int | None = None
    appProtocol: str | None = None


class _ClientIP(msgspec.Struct, forbid_unknown_fields=True):
    timeoutSeconds: int | msgspec.UnsetType = msgspec.UNSET  # null: the general path


class _AffinityConfig(msgspec.Struct, forbid_unknown_fields=True):
    clientIP: _ClientIP | None = None


class _Spec(msgspec.Struct, forbid_unknown_fields=True):
    ports: list[_Port] | None = None
    selector: dict[str, str] | None = None
    clusterIP: str | None = None
    clusterIPs: list[str] | None = None
    type: str | None = None
    externalIPs: list[str] | None = None
    sessionAffinity: str | None = None
    sessionAffinityConfig: _AffinityConfig | None = None
    loadBalancerIP: str | None = None
    loadBalancerSourceRanges: list[str] | None = None
    loadBalancerClass: str | None = None
    allocateLoadBalancerNodePorts: bool | None = None
    externalName: str | None = None
    externalTrafficPolicy: str | None = None
    internalTrafficPolicy: str | None = None
    healthCheckNodePort: int | None = None
    publishNotReadyAddresses: bool | None = None
    ipFamilies: list[str] | None = None
    ipFamilyPolicy: str | None = None
    trafficDistribution: str | None = None


class _Ingress(msgspec.Struct, forbid_unknown_fields=True):
    ip: str | None = None
    hostname: str | None = None
    ipMode: str | None = None


class _LoadBalancer(msgspec.Struct, forbid_unknown_fields=True):
    ingress: list[_Ingress] | None = None


class _Status(msgspec.Struct, forbid_unknown_fields=True):
    loadBalancer: _LoadBalancer | None = None


class _Service(msgspec.Struct, forbid_unknown_fields=True):
    metadata: Meta
    spec: _Spec | None = None
    status: _Status | None = None
    kind: str | None = None
    apiVersion: str | None = None


_DECODER = msgspec.json.Decoder(_Service)
_DEPTH = 3  # these structs are at most 3 levels deep; an ingress entry is at 4
_EMPTY_SPEC = _Spec()
_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
_POLICIES = {None: TrafficPolicy.CLUSTER, "": TrafficPolicy.CLUSTER,
             "Cluster": TrafficPolicy.CLUSTER, "Local": TrafficPolicy.LOCAL}
_AFFINITIES = (None, "", "None", "ClientIP")
_DISTRIBUTIONS = (None, *TRAFFIC_DISTRIBUTIONS)  # "" is set: refused
_IP_MODES = (None, "VIP", "Proxy")
_FAMILY_POLICIES = (None, *IP_FAMILY_POLICIES)
_FAMILIES = ["IPv4"]  # the family of the one cluster IP this path takes
# What no service CIDR holds beyond the endpoint rules, as prefixes of canonical IPv4
# addresses: multicast (224.0.0.0/4) and the broadcast address.
_FORBIDDEN_CLUSTER_IPV4 = (*FORBIDDEN_IPV4, *(f"{n}." for n in range(224, 240)),
                           "255.255.255.255")


def decode_service(data: bytes | msgspec.Raw, limits: ObjectLimits) -> Service | None:
    """The Service the general path would make of ``data`` (an item's JSON), or None when
    not of the common shape (then take the general path)."""
    obj = decoded(_DECODER, data, limits, _DEPTH)
    if obj is None:
        return None
    meta = obj.metadata
    spec = obj.spec or _EMPTY_SPEC
    stype = spec.type or "ClusterIP"
    if stype not in _TYPES or not metadata_ok(meta, DNS1035_LABEL, 63, limits) or \
            spec.loadBalancerSourceRanges or spec.sessionAffinity not in _AFFINITIES or \
            spec.internalTrafficPolicy not in _POLICIES or spec.internalTrafficPolicy == "" or \
            spec.externalTrafficPolicy not in _POLICIES or \
            spec.trafficDistribution not in _DISTRIBUTIONS or \
            spec.ipFamilies and spec.ipFamilies != _FAMILIES or \
            spec.ipFamilyPolicy not in _FAMILY_POLICIES or \
            spec.healthCheckNodePort is not None and not 0 <= spec.healthCheckNodePort <= 65535:
        return None
    if _cross_field(spec, stype, meta.annotations):  # the general path says why
        return None
    cluster_ips = _cluster_ips(spec, stype)
    if cluster_ips is None:
        return None
    ports = _ports(spec.ports or [], stype, cluster_ips == ("None",))
    external_ips = _ips(spec.externalIPs or [], FORBIDDEN_IPV4)
    ingress = _ingress(obj.status, limits)
    timeout = _timeout(spec)
    if ports is None or external_ips is None or ingress is None or timeout is None:
        return None
    labels = meta.labels or {}
    annotations = meta.annotations or {}
    return Service(
        namespace=meta.namespace or "default", name=meta.name, type=stype,
        cluster_ips=() if cluster_ips == ("None",) else cluster_ips, ports=ports,
        external_ips=external_ips, load_balancer_ingress=ingress,
        session_affinity=SessionAffinity.CLIENT_IP if timeout else SessionAffinity.NONE,
        session_affinity_timeout=timeout,
        internal_traffic_policy=_POLICIES[spec.internalTrafficPolicy],
        external_traffic_policy=_POLICIES[spec.externalTrafficPolicy],
        health_check_node_port=spec.healthCheckNodePort or 0,
        traffic_distribution=spec.trafficDistribution or "",
        topology_mode=next((annotations[a] for a in TOPOLOGY_ANNOTATIONS if a in annotations),
                           ""),
        proxy_name=labels.get(SERVICE_PROXY_NAME_LABEL),
        options=tuple(sorted((k, v) for k, v in annotations.items()
                             if k.startswith(OPTION_PREFIX))) if annotations else (),
        created=parse_time(meta.creationTimestamp))


def _cross_field(spec: _Spec, stype: str, annotations: dict[str, str] | None) -> bool:
    """Whether one of ValidateService's cross-field rules (service.py) may refuse it:
    externalTrafficPolicy where not reachable from outside, healthCheckNodePort without
    LoadBalancer and Local, clusterIPs without clusterIP, the two topology annotations
    disagreeing, the source ranges annotation (checked there)."""
    external = stype != "ClusterIP" or bool(spec.externalIPs)
    notes = annotations or {}
    return bool(spec.externalTrafficPolicy and not external
                or spec.healthCheckNodePort and not (
                    stype == "LoadBalancer" and spec.externalTrafficPolicy == "Local")
                or spec.clusterIPs and not spec.clusterIP
                or len({notes[a] for a in TOPOLOGY_ANNOTATIONS if a in notes}) > 1
                or SOURCE_RANGES_ANNOTATION in notes)


def _cluster_ips(spec: _Spec, stype: str) -> tuple[str, ...] | None:
    """("None",) for a headless service, () for none, (ip,) for one IPv4 cluster IP."""
    single = spec.clusterIP or ""
    ips = spec.clusterIPs or ()
    if len(ips) > 1 or ips and single and ips[0] != single:
        return None
    value = ips[0] if ips else single
    if value == "None":
        return ("None",) if stype == "ClusterIP" else None
    if not value:  # clusterIPs [""]: valid to the rules, refused by parse
        return None if ips else ()
    return _ips((value,), _FORBIDDEN_CLUSTER_IPV4)


def _ips(values: list[str] | tuple[str, ...], forbidden: tuple[str, ...]
         ) -> tuple[str, ...] | None:
    """Canonical IPv4 addresses none of which starts with ``forbidden``, without repeats."""
    for value in values:
        if not CANONICAL_IPV4.fullmatch(value) or value.startswith(forbidden):
            return None
    return tuple(dict.fromkeys(values))


def _ports(ports: list[_Port], stype: str, headless: bool) -> tuple[SvcPort, ...] | None:
    if not ports and not headless:
        return None
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    node_ports: set[tuple[int, str]] = set()
    out = []
    for p in ports:
        name, port, protocol = p.name or "", p.port, p.protocol or "TCP"
        if not name and len(ports) > 1 or name and (
                len(name) > 63 or not matches(DNS1123_LABEL, name) or name in names):
            return None
        names.add(name)
        if port is None or not 1 <= port <= 65535 or protocol not in PROTOCOLS or \
                (port, protocol) in seen:
            return None
        seen.add((port, protocol))
        if p.appProtocol is not None and not is_app_protocol(p.appProtocol):
            return None
        target = p.targetPort
        if target is msgspec.UNSET:
            target = port
        elif type(target) is int:
            if target and not 1 <= target <= 65535:
                return None
        elif target and not is_port_name(target):
            return None
        node_port = p.nodePort or 0
        if node_port:
            if not 0 < node_port <= 65535 or stype == "ClusterIP" or \
                    (node_port, protocol) in node_ports:
                return None
            node_ports.add((node_port, protocol))
        out.append(SvcPort(name, Protocol(protocol), port, node_port, str(target)))
    return tuple(out)


def _timeout(spec: _Spec) -> int | None:
    """The ClientIP affinity's timeout (0 without that affinity), None when invalid (a
    sessionAffinityConfig without ClientIP affinity too)."""
    if spec.sessionAffinity != "ClientIP":
        return 0 if spec.sessionAffinityConfig is None else None
    cfg = spec.sessionAffinityConfig
    client = cfg.clientIP if cfg is not None else None
    timeout = client.timeoutSeconds if client is not None else msgspec.UNSET
    if timeout is msgspec.UNSET:
        return DEFAULT_AFFINITY_TIMEOUT
    return timeout if 0 < timeout <= 86400 else None


def _ingress(status: _Status | None, limits: ObjectLimits
             ) -> tuple[LoadBalancerIngress, ...] | None:
    """The load balancer's addresses (an entry without one is skipped)."""
    lb = status.loadBalancer if status is not None else None
    entries = lb.ingress if lb is not None else None
    if not entries:
        return ()
    if limits.max_depth < _DEPTH + 1:
        return None
    out = []
    for entry in entries:
        if not entry.ip:
            if entry.ipMode is not None:  # an ipMode needs an IP
                return None
            continue
        if not CANONICAL_IPV4.fullmatch(entry.ip) or entry.ipMode not in _IP_MODES:
            return None
        out.append(LoadBalancerIngress(entry.ip, entry.ipMode or "VIP"))
    return tuple(out)

"""The Service kind, whole: the apiserver's rules for the fields svcproxy reads
(pkg/apis/core/validation) with their messages, each rule giving the value it checked to
the ``objects.Service`` it builds (``read_service``), and the typed decode of a listed
Service's JSON (``decode_service``), an optimisation of the same reading.

One reader. ``read_service`` reads each field once: the rule checks it (the problem, if
any, goes into the verdict with Kubernetes' message) and returns the value read, and a
Service is built of those values when the verdict accepts it. ``validate_service`` is that
pass's verdict. A new field goes in one place: the rule that reads it, here.

The fast path, optionally. The msgspec structs below name the fields a listed Service of
the common shape has; msgspec decodes its JSON straight into them, in C, and
``decode_service`` checks them without messages. A field the structs do not name (so a
new one, until it is added here too), ExternalName, IPv6 or dual-stack, source ranges, a
null targetPort or timeoutSeconds, limits below the defaults, or any doubt gives None and
the caller takes ``read_service``, which says why or reads it. Property tests in
tests/frontend/edge/ hold the two to one object.
"""

from __future__ import annotations

from typing import Any

import msgspec

from svcproxy.frontend.edge.addresses import (
    CANONICAL_IPV4,
    FORBIDDEN_IPV4,
    cidr_family,
    kube_cidr,
)
from svcproxy.frontend.edge.checker import (
    PROTOCOLS,
    Checker,
    check_app_protocol,
    check_cidrs,
    check_object,
)
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.metadata import Meta, decoded, metadata_ok
from svcproxy.frontend.edge.names import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    is_app_protocol,
    is_port_name,
    matches,
)
from svcproxy.frontend.edge.objects import (
    Service,
    SvcPort,
    kube_ip,
    kube_ips,
    parse_time,
)
from svcproxy.frontend.edge.verdict import Verdict, shown
from svcproxy.frontend.edge.wellknown import (
    OPTION_PREFIX,
    SERVICE_PROXY_NAME_LABEL,
    SOURCE_RANGES_ANNOTATION,
    TOPOLOGY_ANNOTATIONS,
    TOPOLOGY_HINTS_ANNOTATION,
    TOPOLOGY_MODE_ANNOTATION,
)
from svcproxy.model import (
    DEFAULT_AFFINITY_TIMEOUT,
    LoadBalancerIngress,
    Protocol,
    SessionAffinity,
    TrafficPolicy,
)

SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
POLICIES = ("Cluster", "Local")
AFFINITIES = ("None", "ClientIP")
TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")
IP_MODES = ("VIP", "Proxy")
IP_FAMILIES = ("IPv4", "IPv6")
IP_FAMILY_POLICIES = ("SingleStack", "PreferDualStack", "RequireDualStack")


# The schema: the fields of a listed Service the typed decode reads, one struct per level.
# Absent and null are alike (None) unless a field says otherwise.
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
_HEADLESS = ("None",)  # what _cluster_ips reads of a headless service
# What no service CIDR holds beyond the endpoint rules, as prefixes of canonical IPv4
# addresses: multicast (224.0.0.0/4) and the broadcast address.
_FORBIDDEN_CLUSTER_IPV4 = (*FORBIDDEN_IPV4, *(f"{n}." for n in range(224, 240)),
                           "255.255.255.255")


def read_service(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS
                 ) -> tuple[Service | None, Verdict]:
    """A Service read in one pass: each field svcproxy reads checked once as the apiserver
    validates it (its problems, with their messages, in the verdict) and taken as the
    value the Service is made of; the Service is None when the verdict refuses it."""
    c = Checker(limits)
    if not check_object(c, obj, limits):
        return None, c.v
    # ValidateObjectMeta with ValidateServiceName (NameIsDNS1035Label).
    labels, annotations = c.metadata(obj, lambda v, w: c.name(
        v, w, DNS1035_LABEL, 63, "DNS-1035 label (lowercase letters, digits and '-', "
        "starting with a letter)"), namespaced=True)
    spec = c.mapping(obj.get("spec"), "spec")
    stype = c.enum(spec.get("type"), "spec.type", SERVICE_TYPES) or "ClusterIP"  # supported
    cluster_ips = _cluster_ips(c, spec, stype)
    ports = _service_ports(c, spec, stype, cluster_ips == _HEADLESS)
    external_ips = kube_ips([ip for i, ip in enumerate(c.items(
        spec.get("externalIPs"), "spec.externalIPs"))  # IsValidIP, ValidateNonSpecialIP
        if c.ip(ip, f"spec.externalIPs[{i}]", "endpoint")])
    affinity, timeout = _affinity(c, spec)
    # validateServiceInternalTrafficFieldsValue, validateServiceTrafficDistribution
    # (PreferClose v1.30; PreferSame* v1.33): both *string, so "" is refused.
    internal = _set_enum(c, spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy",
                         POLICIES)
    distribution = _set_enum(c, spec.get("trafficDistribution"), "spec.trafficDistribution",
                             TRAFFIC_DISTRIBUTIONS)
    external, hc_port = _external_traffic(c, spec, stype)
    ranges = _source_ranges(c, spec, stype, annotations)
    topology = _topology_annotations(c, annotations)
    if stype == "ExternalName":  # ValidateDNS1123Subdomain of the name less a trailing dot
        name = spec.get("externalName")
        if isinstance(name, str) and name.endswith("."):
            name = name[:-1]  # a CNAME: a trailing dot marks it fully qualified
        c.subdomain(name, "spec.externalName")
    ingress = _lb_status(c, obj.get("status"))
    if not c.v.ok:
        return None, c.v
    meta = obj["metadata"]
    return Service(
        namespace=meta.get("namespace") or "default", name=meta["name"], type=stype,
        cluster_ips=() if cluster_ips == _HEADLESS else cluster_ips, ports=ports,
        external_ips=external_ips, load_balancer_ingress=ingress,
        load_balancer_source_ranges=ranges, session_affinity=affinity,
        session_affinity_timeout=timeout, internal_traffic_policy=_POLICIES[internal],
        external_traffic_policy=_POLICIES[external], health_check_node_port=hc_port,
        traffic_distribution=distribution, topology_mode=topology,
        proxy_name=labels.get(SERVICE_PROXY_NAME_LABEL),
        options=tuple(sorted((k, v) for k, v in annotations.items()
                             if k.startswith(OPTION_PREFIX))),
        created=parse_time(meta.get("creationTimestamp"))), c.v


def validate_service(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Service as the apiserver validates the fields svcproxy reads (``read_service``'s
    verdict)."""
    return read_service(obj, limits)[1]


def _cluster_ips(c: Checker, spec: dict[str, Any], stype: str) -> tuple[str, ...]:
    """Checks clusterIP/clusterIPs as validateServiceClusterIPsRelatedFields does (None
    alone and not for NodePort/LoadBalancer, IsValidIP, at most two of two families,
    clusterIPs[0] = clusterIP); the cluster IPs read, ``_HEADLESS`` for a headless
    service. The addresses no service CIDR can hold (``cluster_ip_problem``) are refused
    as the allocator would refuse them (ipallocator: ErrNotInRange): with manifests no
    range is known."""
    if stype == "ExternalName":
        _external_name_ips(c, spec)
        return ()
    single = c.string(spec.get("clusterIP"), "spec.clusterIP")
    single_family = c.ip(single, "spec.clusterIP", "cluster") \
        if single and single != "None" else 0
    ips = c.items(spec.get("clusterIPs"), "spec.clusterIPs", limit=2)
    values = ips or ([single] if single else [])
    if ips and not single:
        c.err("spec.clusterIPs", "invalid_value", "must be empty when spec.clusterIP is not "
              "specified (set both, clusterIPs[0] equal to clusterIP)")
    if values and values[0] == "None":
        if len(values) > 1:
            c.err("spec.clusterIPs", "invalid_value", "'None' must be the only value")
        if stype in ("NodePort", "LoadBalancer"):
            c.err("spec.clusterIP", "invalid_value", f"may not be 'None' for {stype} services")
        _ip_families(c, spec, [], len(values))
        return _HEADLESS
    families = [c.ip(ip, f"spec.clusterIPs[{i}]", "cluster") if ip != single
                else single_family for i, ip in enumerate(ips)]
    if len(families) == 2 and families[0] and families[0] == families[1]:
        c.err("spec.clusterIPs", "ip_family", "two cluster IPs must be of different families")
    if single and ips and ips[0] != single:
        c.err("spec.clusterIPs[0]", "invalid_value", f"{shown(ips[0])} must be the same as "
              f"spec.clusterIP {shown(single)}")
    _ip_families(c, spec, families or [single_family], len(values))
    return kube_ips(values) if c.v.ok else ()


def _external_name_ips(c: Checker, spec: dict[str, Any]) -> None:
    """ValidateService's ExternalName case: no clusterIP(s) (normalizeClusterIPs copies
    clusterIP into clusterIPs first), no ipFamilies, no ipFamilyPolicy."""
    c.string(spec.get("clusterIP"), "spec.clusterIP")
    if spec.get("clusterIP") or c.items(spec.get("clusterIPs"), "spec.clusterIPs"):
        c.err("spec.clusterIPs", "forbidden", "may not be set for ExternalName services")
    if c.items(spec.get("ipFamilies"), "spec.ipFamilies"):
        c.err("spec.ipFamilies", "forbidden", "may not be set for ExternalName services")
    if spec.get("ipFamilyPolicy") is not None:
        c.err("spec.ipFamilyPolicy", "forbidden", "may not be set for ExternalName services")


def _ip_families(c: Checker, spec: dict[str, Any], families: list[int], ips: int) -> None:
    """ipFamilies (IPv4, IPv6, no repeat), each the family of the cluster IP at its index
    in ``families`` (0: none to match), and ipFamilyPolicy (svcproxy reads neither: a
    cluster IP's family is its own), SingleStack holding one of ``ips`` cluster IPs and
    one family (registry/core/service/storage/alloc.go, initIPFamilyFields)."""
    seen: set[str] = set()
    names = c.items(spec.get("ipFamilies"), "spec.ipFamilies")
    for i, name in enumerate(names):
        where = f"spec.ipFamilies[{i}]"
        if name not in IP_FAMILIES:
            c.err(where, "invalid_value", f"{shown(name)} is not one of IPv4, IPv6")
            continue
        if name in seen:
            c.err(where, "duplicate", f"{name} is listed twice")
        elif i < len(families) and families[i] and f"IPv{families[i]}" != name:
            c.err(f"spec.clusterIPs[{i}]", "ip_family", f"is not an {name} address as "
                  f"spec.ipFamilies[{i}] says")
        seen.add(name)
    policy = _set_enum(c, spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy",
                       IP_FAMILY_POLICIES)
    if policy == "SingleStack" and (ips == 2 or len(names) == 2):
        c.err("spec.ipFamilyPolicy", "invalid_value", "must be RequireDualStack or "
              "PreferDualStack when two cluster IPs or IP families are given")




def _service_ports(c: Checker, spec: dict[str, Any], stype: str, headless: bool
                   ) -> tuple[SvcPort, ...]:
    """validateServicePort for each (name a DNS-1123 label, required with several and
    unique; IsValidPortNum; a supported protocol, "" defaulting to TCP; targetPort
    ValidatePortNumOrName; appProtocol ValidateQualifiedName), then ValidateService's
    cross-port rules: ports required but for headless and ExternalName, (port, protocol)
    and (nodePort, protocol) unique, no nodePort on a ClusterIP service. The ports read
    (unset targetPort: the port)."""
    ports = c.items(spec.get("ports"), "spec.ports")
    if not ports and not headless and stype != "ExternalName":
        c.err("spec.ports", "malformed", "is required (a service needs at least one port)")
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    node_ports: set[tuple[int, str]] = set()
    read: list[tuple[str, str, int, int, str]] = []
    for i, raw in enumerate(ports):
        where = f"spec.ports[{i}]"
        p = c.mapping(raw, where)
        name = c.string(p.get("name"), f"{where}.name")
        if len(ports) > 1 and not name:
            c.err(f"{where}.name", "malformed", "is required when a service has several ports")
        elif name:
            c.label(name, f"{where}.name")
            if name in names:
                c.err(f"{where}.name", "duplicate", f"{shown(name)} is used by another port")
            names.add(name)
        port = c.port(p.get("port"), f"{where}.port")
        proto = c.protocol(p.get("protocol"), f"{where}.protocol")
        if (port, proto) in seen and port:
            c.err(where, "duplicate", f"port {port}/{proto} is used by another port")
        seen.add((port, proto))
        _target_port(c, p.get("targetPort"), f"{where}.targetPort")
        if "appProtocol" in p:
            check_app_protocol(c, p["appProtocol"], f"{where}.appProtocol")
        node_port = c.port(p.get("nodePort"), f"{where}.nodePort", allow_zero=True)
        if node_port and stype == "ClusterIP":
            c.err(f"{where}.nodePort", "invalid_value", "may not be used when type is ClusterIP")
        if node_port and (node_port, proto) in node_ports:
            c.err(f"{where}.nodePort", "duplicate", f"{node_port}/{proto} is used twice")
        node_ports.add((node_port, proto))
        read.append((name, proto, port, node_port, str(p.get("targetPort", port))))
    if not c.v.ok:
        return ()
    return tuple(SvcPort(name, Protocol(proto), port, node_port, target)
                 for name, proto, port, node_port, target in read)


def _target_port(c: Checker, value: Any, where: str) -> None:
    """ValidatePortNumOrName; 0 and "" are defaulted to the port (SetDefaults_ServicePort)."""
    if value is None or value == 0 or value == "":
        return
    if isinstance(value, str):
        if not is_port_name(value):
            c.err(where, "invalid_port", f"{shown(value)} is neither a port number nor a "
                  "port name (IANA_SVC_NAME: at most 15 lowercase letters, digits and '-', "
                  "with a letter)")
        return
    c.port(value, where)


def _set_enum(c: Checker, value: Any, where: str, allowed: tuple[str, ...]) -> str:
    """A field Go holds as a pointer to an enum (``*string``): unset (null) is none, and
    once set, "" included, it must be one of ``allowed`` (field.NotSupported)."""
    if value == "":
        c.err(where, "invalid_value", f"'' is not one of {', '.join(allowed)} (leave it "
              "unset instead)")
        return ""
    return c.enum(value, where, allowed)


def _affinity(c: Checker, spec: dict[str, Any]) -> tuple[SessionAffinity, int]:
    """supportedSessionAffinityType and validateClientIPAffinityConfig (1-86400 s; unset
    or null is defaulted to 10800 by SetDefaults_Service); ValidateService forbids a
    sessionAffinityConfig (not null) when the affinity is None ("" and unset are None,
    SetDefaults_Service). The affinity read and its timeout (0 without one)."""
    affinity = c.enum(spec.get("sessionAffinity"), "spec.sessionAffinity", AFFINITIES)
    if affinity != "ClientIP" and spec.get("sessionAffinityConfig") is not None and \
            spec.get("sessionAffinity") in (None, "", "None"):
        c.err("spec.sessionAffinityConfig", "forbidden", "must not be set when "
              "sessionAffinity is None (set sessionAffinity: ClientIP, or remove it)")
        return SessionAffinity.NONE, 0
    cfg = c.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client = c.mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = client.get("timeoutSeconds")
    if affinity != "ClientIP":
        return SessionAffinity.NONE, 0
    if timeout is None:
        return SessionAffinity.CLIENT_IP, DEFAULT_AFFINITY_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 < timeout <= 86400:
        c.err("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "invalid_value",
              f"{shown(timeout)} must be between 1 and 86400")
    return SessionAffinity.CLIENT_IP, timeout


def _lb_status(c: Checker, status: Any) -> tuple[LoadBalancerIngress, ...]:
    """ValidateLoadBalancerStatus: an ingress IP IsValidIP; its ipMode (a *string) VIP or
    Proxy when set, "" included, and only with an IP (unset with one: VIP, as
    SetDefaults_Service sets it). The ingress addresses read (an entry without one, a
    hostname, is left out)."""
    lb = c.mapping(c.mapping(status, "status").get("loadBalancer"), "status.loadBalancer")
    out = []
    for i, raw in enumerate(c.items(lb.get("ingress"), "status.loadBalancer.ingress")):
        where = f"status.loadBalancer.ingress[{i}]"
        ing = c.mapping(raw, where)
        ip = ing.get("ip")
        if ip not in (None, ""):
            family = c.ip(ip, f"{where}.ip")
            mode = _set_enum(c, ing.get("ipMode"), f"{where}.ipMode", IP_MODES)
            if family:
                out.append(LoadBalancerIngress(kube_ip(ip), mode or "VIP"))
        elif ing.get("ipMode") is not None:
            c.err(f"{where}.ipMode", "forbidden", "may not be specified when ip is not set")
    return tuple(out)


def _external_traffic(c: Checker, spec: dict[str, Any], stype: str) -> tuple[str, int]:
    """validateServiceExternalTrafficPolicy: externalTrafficPolicy only on a service
    reachable from outside (apiservice.ExternallyAccessible: NodePort, LoadBalancer, or
    ClusterIP with externalIPs; unset there is Cluster, SetDefaults_Service), and
    healthCheckNodePort (IsValidPortNum; 0 none) only with type LoadBalancer and policy
    Local (apiservice.NeedsHealthCheck); unset there the allocator picks one. The policy
    read ("" unset) and the health check port (0 none)."""
    policy = c.enum(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy", POLICIES)
    external = stype in ("NodePort", "LoadBalancer") or (
        stype == "ClusterIP" and bool(spec.get("externalIPs")))
    if spec.get("externalTrafficPolicy") not in (None, "") and not external:
        c.err("spec.externalTrafficPolicy", "invalid_value", "may only be set for "
              "externally-accessible services (NodePort, LoadBalancer, externalIPs)")
    hc = c.port(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", allow_zero=True)
    if hc and not (stype == "LoadBalancer" and policy == "Local"):
        c.err("spec.healthCheckNodePort", "invalid_value", "may only be set when type is "
              "LoadBalancer and externalTrafficPolicy is Local")
    return policy, hc


def _source_ranges(c: Checker, spec: dict[str, Any], stype: str,
                   annotations: dict[str, Any]) -> tuple[str, ...]:
    """ValidateService: loadBalancerSourceRanges only with type LoadBalancer, each entry
    one CIDR once spaces are trimmed (service.GetLoadBalancerSourceRanges: ParseIPNets,
    ParseCIDRSloppy; a comma is no CIDR). Without the field, the annotation of the same
    name (present, even empty) only with type LoadBalancer, and once trimmed empty or
    CIDRs separated by commas, each trimmed (GetLoadBalancerSourceRanges splits it). The
    field's ranges read, as Go reads them (``kube_cidr``), without repeats; the
    annotation is checked, not read: kube-proxy reads the field alone."""
    ranges = c.items(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if ranges:
        if stype != "LoadBalancer":
            c.err("spec.loadBalancerSourceRanges", "forbidden", "may only be used when type "
                  "is LoadBalancer")
        out = []
        for i, value in enumerate(ranges):
            cidr = kube_cidr(value) if check_cidrs(
                c, value, f"spec.loadBalancerSourceRanges[{i}]", trimmed=True) else None
            if cidr:
                out.append(cidr)
        return tuple(dict.fromkeys(out))
    if SOURCE_RANGES_ANNOTATION not in annotations:
        return ()
    where = f"metadata.annotations.{SOURCE_RANGES_ANNOTATION}"
    if stype != "LoadBalancer":
        c.err(where, "forbidden", "may only be used when type is LoadBalancer")
    value = annotations[SOURCE_RANGES_ANNOTATION]
    text = value.strip() if isinstance(value, str) else ""
    for part in text.split(",") if text else ():
        if not cidr_family(part.strip()):
            c.err(where, "invalid_ip", f"{shown(part.strip())} is not a CIDR (a list of "
                  "CIDRs separated by commas, e.g. 10.0.0.0/8,192.168.0.0/16)")
    return ()


def _topology_annotations(c: Checker, annotations: dict[str, Any]) -> str:
    """ValidateService: service.kubernetes.io/topology-mode must equal the deprecated
    topology-aware-hints annotation when both are set. The topology mode read ("" none)."""
    mode = annotations.get(TOPOLOGY_MODE_ANNOTATION)
    hints = annotations.get(TOPOLOGY_HINTS_ANNOTATION)
    if mode is not None and hints is not None and mode != hints:
        c.err(f"metadata.annotations.{TOPOLOGY_MODE_ANNOTATION}", "invalid_value",
              f"{shown(mode)} must match annotations[{TOPOLOGY_HINTS_ANNOTATION}] when both "
              "are set")
    return next((annotations[a] for a in TOPOLOGY_ANNOTATIONS if a in annotations), "")


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
    if _decoded_cross_field(spec, stype, meta.annotations):  # the general path says why
        return None
    cluster_ips = _decoded_cluster_ips(spec, stype)
    if cluster_ips is None:
        return None
    ports = _decoded_ports(spec.ports or [], stype, cluster_ips == ("None",))
    external_ips = _decoded_ips(spec.externalIPs or [], FORBIDDEN_IPV4)
    ingress = _decoded_ingress(obj.status, limits)
    timeout = _decoded_timeout(spec)
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


def _decoded_cross_field(spec: _Spec, stype: str, annotations: dict[str, str] | None) -> bool:
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


def _decoded_cluster_ips(spec: _Spec, stype: str) -> tuple[str, ...] | None:
    """("None",) for a headless service, () for none, (ip,) for one IPv4 cluster IP."""
    single = spec.clusterIP or ""
    ips = spec.clusterIPs or ()
    if len(ips) > 1 or ips and single and ips[0] != single:
        return None
    value = ips[0] if ips else single
    if value == "None":
        return ("None",) if stype == "ClusterIP" else None
    if not value:  # clusterIPs [""]: refused by the rules (clusterIP unset)
        return None if ips else ()
    return _decoded_ips((value,), _FORBIDDEN_CLUSTER_IPV4)


def _decoded_ips(values: list[str] | tuple[str, ...], forbidden: tuple[str, ...]
         ) -> tuple[str, ...] | None:
    """Canonical IPv4 addresses none of which starts with ``forbidden``, without repeats."""
    for value in values:
        if not CANONICAL_IPV4.fullmatch(value) or value.startswith(forbidden):
            return None
    return tuple(dict.fromkeys(values))


def _decoded_ports(ports: list[_Port], stype: str, headless: bool) -> tuple[SvcPort, ...] | None:
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


def _decoded_timeout(spec: _Spec) -> int | None:
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


def _decoded_ingress(status: _Status | None, limits: ObjectLimits
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

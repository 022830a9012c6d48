"""A Service as the apiserver validates the fields svcproxy reads
(pkg/apis/core/validation)."""

from __future__ import annotations

from typing import Any

from svcproxy.frontend.edge.addresses import cidr_family
from svcproxy.frontend.edge.checker import (
    Checker,
    check_app_protocol,
    check_cidrs,
    check_object,
)
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.names import DNS1035_LABEL, is_port_name
from svcproxy.frontend.edge.verdict import Verdict, shown

SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
POLICIES = ("Cluster", "Local")
AFFINITIES = ("None", "ClientIP")
TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")
IP_MODES = ("VIP", "Proxy")
IP_FAMILIES = ("IPv4", "IPv6")
IP_FAMILY_POLICIES = ("SingleStack", "PreferDualStack", "RequireDualStack")
TOPOLOGY_MODE = "service.kubernetes.io/topology-mode"
TOPOLOGY_HINTS = "service.kubernetes.io/topology-aware-hints"
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"


def validate_service(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Service as the apiserver validates the fields svcproxy reads."""
    c = Checker(limits)
    if not check_object(c, obj, limits):
        return c.v
    # ValidateObjectMeta with ValidateServiceName (NameIsDNS1035Label).
    _, annotations = c.metadata(obj, lambda v, w: c.name(
        v, w, DNS1035_LABEL, 63, "DNS-1035 label (lowercase letters, digits and '-', "
        "starting with a letter)"), namespaced=True)
    spec = c.mapping(obj.get("spec"), "spec")
    stype = c.enum(spec.get("type"), "spec.type", SERVICE_TYPES) or "ClusterIP"  # supported
    headless = _cluster_ips(c, spec, stype)
    _service_ports(c, spec, stype, headless)
    for i, ip in enumerate(c.items(spec.get("externalIPs"), "spec.externalIPs")):
        c.ip(ip, f"spec.externalIPs[{i}]", "endpoint")  # IsValidIP, ValidateNonSpecialIP
    _affinity(c, spec)
    # validateServiceInternalTrafficFieldsValue, validateServiceTrafficDistribution
    # (PreferClose v1.30; PreferSame* v1.33): both *string, so "" is refused.
    _set_enum(c, spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy", POLICIES)
    _set_enum(c, spec.get("trafficDistribution"), "spec.trafficDistribution",
              TRAFFIC_DISTRIBUTIONS)
    _external_traffic(c, spec, stype)
    _source_ranges(c, spec, stype, annotations)
    _topology_annotations(c, obj)
    if stype == "ExternalName":  # ValidateDNS1123Subdomain of the name less a trailing dot
        name = spec.get("externalName")
        if isinstance(name, str) and name.endswith("."):
            name = name[:-1]  # a CNAME: a trailing dot marks it fully qualified
        c.subdomain(name, "spec.externalName")
    _lb_status(c, obj.get("status"))
    return c.v


def _cluster_ips(c: Checker, spec: dict[str, Any], stype: str) -> bool:
    """Checks clusterIP/clusterIPs as validateServiceClusterIPsRelatedFields does (None
    alone and not for NodePort/LoadBalancer, IsValidIP, at most two of two families,
    clusterIPs[0] = clusterIP); True for a headless service. The addresses no service
    CIDR can hold (``cluster_ip_problem``) are refused as the allocator would refuse
    them (ipallocator: ErrNotInRange): with manifests no range is known."""
    if stype == "ExternalName":
        _external_name_ips(c, spec)
        return False
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
        return True
    families = [c.ip(ip, f"spec.clusterIPs[{i}]", "cluster") if ip != single
                else single_family for i, ip in enumerate(ips)]
    if len(families) == 2 and families[0] and families[0] == families[1]:
        c.err("spec.clusterIPs", "ip_family", "two cluster IPs must be of different families")
    if single and ips and ips[0] != single:
        c.err("spec.clusterIPs[0]", "invalid_value", f"{shown(ips[0])} must be the same as "
              f"spec.clusterIP {shown(single)}")
    _ip_families(c, spec, families or [single_family], len(values))
    return False


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


def _service_ports(c: Checker, spec: dict[str, Any], stype: str, headless: bool) -> None:
    """validateServicePort for each (name a DNS-1123 label, required with several and
    unique; IsValidPortNum; a supported protocol, "" defaulting to TCP; targetPort
    ValidatePortNumOrName; appProtocol ValidateQualifiedName), then ValidateService's
    cross-port rules: ports required but for headless and ExternalName, (port, protocol)
    and (nodePort, protocol) unique, no nodePort on a ClusterIP service."""
    ports = c.items(spec.get("ports"), "spec.ports")
    if not ports and not headless and stype != "ExternalName":
        c.err("spec.ports", "malformed", "is required (a service needs at least one port)")
    names: set[str] = set()
    seen: set[tuple[int, str]] = set()
    node_ports: set[tuple[int, str]] = set()
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


def _affinity(c: Checker, spec: dict[str, Any]) -> None:
    """supportedSessionAffinityType and validateClientIPAffinityConfig (1-86400 s; unset
    or null is defaulted to 10800 by SetDefaults_Service); ValidateService forbids a
    sessionAffinityConfig (not null) when the affinity is None ("" and unset are None,
    SetDefaults_Service)."""
    affinity = c.enum(spec.get("sessionAffinity"), "spec.sessionAffinity", AFFINITIES)
    if affinity != "ClientIP" and spec.get("sessionAffinityConfig") is not None and \
            spec.get("sessionAffinity") in (None, "", "None"):
        c.err("spec.sessionAffinityConfig", "forbidden", "must not be set when "
              "sessionAffinity is None (set sessionAffinity: ClientIP, or remove it)")
        return
    cfg = c.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client = c.mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = client.get("timeoutSeconds")
    if affinity == "ClientIP" and timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int)
            or not 0 < timeout <= 86400):
        c.err("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "invalid_value",
              f"{shown(timeout)} must be between 1 and 86400")


def _lb_status(c: Checker, status: Any) -> None:
    """ValidateLoadBalancerStatus: an ingress IP IsValidIP; its ipMode (a *string) VIP or
    Proxy when set, "" included, and only with an IP (unset with one: VIP, as
    SetDefaults_Service sets it)."""
    lb = c.mapping(c.mapping(status, "status").get("loadBalancer"), "status.loadBalancer")
    for i, raw in enumerate(c.items(lb.get("ingress"), "status.loadBalancer.ingress")):
        where = f"status.loadBalancer.ingress[{i}]"
        ing = c.mapping(raw, where)
        if ing.get("ip") not in (None, ""):
            c.ip(ing.get("ip"), f"{where}.ip")
            _set_enum(c, ing.get("ipMode"), f"{where}.ipMode", IP_MODES)
        elif ing.get("ipMode") is not None:
            c.err(f"{where}.ipMode", "forbidden", "may not be specified when ip is not set")


def _external_traffic(c: Checker, spec: dict[str, Any], stype: str) -> None:
    """validateServiceExternalTrafficPolicy: externalTrafficPolicy only on a service
    reachable from outside (apiservice.ExternallyAccessible: NodePort, LoadBalancer, or
    ClusterIP with externalIPs; unset there is Cluster, SetDefaults_Service), and
    healthCheckNodePort (IsValidPortNum; 0 none) only with type LoadBalancer and policy
    Local (apiservice.NeedsHealthCheck); unset there the allocator picks one."""
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


def _source_ranges(c: Checker, spec: dict[str, Any], stype: str,
                   annotations: dict[str, Any]) -> None:
    """ValidateService: loadBalancerSourceRanges only with type LoadBalancer, each entry
    one CIDR once spaces are trimmed (service.GetLoadBalancerSourceRanges: ParseIPNets,
    ParseCIDRSloppy; a comma is no CIDR). Without the field, the annotation of the same
    name (present, even empty) only with type LoadBalancer, and once trimmed empty or
    CIDRs separated by commas, each trimmed (GetLoadBalancerSourceRanges splits it). The
    annotation is checked, not read: kube-proxy reads the field alone."""
    ranges = c.items(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    if ranges:
        if stype != "LoadBalancer":
            c.err("spec.loadBalancerSourceRanges", "forbidden", "may only be used when type "
                  "is LoadBalancer")
        for i, cidr in enumerate(ranges):
            check_cidrs(c, cidr, f"spec.loadBalancerSourceRanges[{i}]", trimmed=True)
        return
    if SOURCE_RANGES_ANNOTATION not in annotations:
        return
    where = f"metadata.annotations.{SOURCE_RANGES_ANNOTATION}"
    if stype != "LoadBalancer":
        c.err(where, "forbidden", "may only be used when type is LoadBalancer")
    value = annotations[SOURCE_RANGES_ANNOTATION]
    text = value.strip() if isinstance(value, str) else ""
    for part in text.split(",") if text else ():
        if not cidr_family(part.strip()):
            c.err(where, "invalid_ip", f"{shown(part.strip())} is not a CIDR (a list of "
                  "CIDRs separated by commas, e.g. 10.0.0.0/8,192.168.0.0/16)")


def _topology_annotations(c: Checker, obj: dict[str, Any]) -> None:
    """ValidateService: service.kubernetes.io/topology-mode must equal the deprecated
    topology-aware-hints annotation when both are set."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict):
        return
    mode = annotations.get(TOPOLOGY_MODE)
    hints = annotations.get(TOPOLOGY_HINTS)
    if mode is not None and hints is not None and mode != hints:
        c.err(f"metadata.annotations.{TOPOLOGY_MODE}", "invalid_value",
              f"{shown(mode)} must match annotations[{TOPOLOGY_HINTS}] when both are set")

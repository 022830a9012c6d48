"""A model of kube-apiserver's validation of the fields svcproxy reads (v1.28, and the
later fields svcproxy reads with their rules: ipMode v1.29+, trafficDistribution v1.30+),
for the stand-in apiserver (tests/support/fakeapiserver.py) to answer 422 Invalid as the
real one does. A manifest's status is checked as a status update would be.

Written from Kubernetes' Go source (pkg/apis/core/validation, pkg/apis/discovery/
validation, apimachinery's util/validation, k8s.io/utils/net's sloppy parsers) and kept
apart from svcproxy's own validator on purpose: the differential tests compare the two.
Each check names the Go function it models. Decoding comes first, as in the apiserver: a
value of the wrong JSON type (or an int32 out of range) is a 400, modelled as a cause
too. ``causes(kind, obj)`` is the list of (field, message), empty when stored.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

Causes = list[tuple[str, str]]
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUALIFIED_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
IPV4_SLOPPY = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})", re.ASCII)
PROTOCOLS = ("TCP", "UDP", "SCTP")
INT32 = (-(2**31), 2**31 - 1)


# ---- apimachinery/pkg/util/validation ---------------------------------------------
def is_dns1123_label(v: str) -> bool:
    return len(v) <= 63 and LABEL.fullmatch(v) is not None


def is_dns1035_label(v: str) -> bool:
    return len(v) <= 63 and DNS1035.fullmatch(v) is not None


def is_dns1123_subdomain(v: str) -> bool:
    return len(v) <= 253 and SUBDOMAIN.fullmatch(v) is not None


def is_valid_label_value(v: str) -> bool:
    return len(v) <= 63 and (v == "" or QUALIFIED_PART.fullmatch(v) is not None)


def is_qualified_name(v: str) -> bool:
    parts = v.split("/")
    if len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns1123_subdomain(prefix):
            return False
    elif len(parts) == 1:
        name = parts[0]
    else:
        return False
    return 0 < len(name) <= 63 and QUALIFIED_PART.fullmatch(name) is not None


def is_valid_port_num(v: int) -> bool:
    return 1 <= v <= 65535


def is_valid_port_name(v: str) -> bool:  # IsValidPortName (IANA_SVC_NAME)
    return (0 < len(v) <= 15 and re.fullmatch(r"[-a-z0-9]+", v) is not None
            and re.search(r"[a-z]", v) is not None and "--" not in v
            and not v.startswith("-") and not v.endswith("-"))


# ---- k8s.io/utils/net (ParseIPSloppy, ParseCIDRSloppy) ------------------------------
def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Go's net.ParseIP with leading zeros allowed in IPv4; no zone, no spaces."""
    m = IPV4_SLOPPY.fullmatch(text)
    if m:
        octets = [int(g) for g in m.groups()]
        return ipaddress.IPv4Address(bytes(octets)) if max(octets) <= 255 else None
    if ":" not in text or "%" in text or text != text.strip():
        return None
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def is_v4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Go's ip.To4() != nil: IPv4, or IPv4-mapped IPv6."""
    return ip.version == 4 or ip.ipv4_mapped is not None  # type: ignore[union-attr]


def as_v4(ip: Any) -> Any:
    return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped is not None else ip


def parse_cidr(text: str) -> int:
    """The family of a CIDR as Go reads it, 0 when not one."""
    addr, slash, bits = text.partition("/")
    ip = parse_ip(addr)
    if ip is None or not slash or not bits.isascii() or not bits.isdigit() or len(bits) > 4:
        return 0
    n = int(bits)
    if ip.version == 4:
        return 4 if n <= 32 else 0
    if n > 128:
        return 0
    return 4 if ip.ipv4_mapped is not None and n >= 96 else 6


def non_special_ip(ip: Any) -> str | None:
    """ValidateNonSpecialIP / ValidateEndpointIP."""
    ip = as_v4(ip)
    if ip.is_unspecified:
        return "may not be unspecified"
    if ip.is_loopback:
        return "may not be in the loopback range"
    if ip.is_link_local:
        return "may not be in the link-local range"
    if ip.version == 4 and int(ip) >> 8 == 0xE00000 or ip.version == 6 and \
            ip.packed[0] == 0xFF and ip.packed[1] & 0x0F == 2:
        return "may not be in the link-local multicast range"
    return None


# ---- decoding --------------------------------------------------------------------
class _Causes:
    def __init__(self) -> None:
        self.list: Causes = []

    def add(self, where: str, message: str) -> None:
        self.list.append((where, message))

    def string(self, value: Any, where: str) -> str | None:
        if value is None:
            return None
        if type(value) is not str:
            self.add(where, "must be a string (decoding)")
            return None
        return value

    def int32(self, value: Any, where: str) -> int | None:
        if value is None:
            return None
        if type(value) is not int or not INT32[0] <= value <= INT32[1]:
            self.add(where, "must be an int32 (decoding)")
            return None
        return value

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if value is None:
            return {}
        if type(value) is not dict:
            self.add(where, "must be an object (decoding)")
            return {}
        return value

    def array(self, value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        if type(value) is not list:
            self.add(where, "must be an array (decoding)")
            return []
        return value

    def labels(self, value: Any, where: str, values: bool = True) -> dict[str, Any]:
        """ValidateLabels (values) or ValidateAnnotations' keys."""
        out = self.obj(value, where)
        for k, v in out.items():
            if not is_qualified_name(k if values else k.lower()):
                self.add(f"{where}.{k}", "key is not a qualified name")
            text = self.string(v, f"{where}.{k}")
            if values and text is not None and not is_valid_label_value(text):
                self.add(f"{where}.{k}", "not a valid label value")
        return out


def _meta(c: _Causes, obj: dict[str, Any], name_ok: Any, namespaced: bool) -> dict[str, Any]:
    """ValidateObjectMeta: the name by the kind's rule, the namespace a DNS-1123 label,
    labels and annotations."""
    meta = c.obj(obj.get("metadata"), "metadata")
    name = c.string(meta.get("name"), "metadata.name")
    if not name or not name_ok(name):
        c.add("metadata.name", "invalid name")
    ns = c.string(meta.get("namespace"), "metadata.namespace")
    if namespaced and ns and not is_dns1123_label(ns):
        c.add("metadata.namespace", "invalid namespace")
    c.labels(meta.get("labels"), "metadata.labels")
    c.labels(meta.get("annotations"), "metadata.annotations", values=False)
    return meta


# ---- Service: ValidateService ------------------------------------------------------
def service_causes(obj: dict[str, Any]) -> Causes:
    c = _Causes()
    _meta(c, obj, is_dns1035_label, True)
    spec = c.obj(obj.get("spec"), "spec")
    stype = c.string(spec.get("type"), "spec.type") or "ClusterIP"
    if stype not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        c.add("spec.type", "not supported")
    cluster_ip = c.string(spec.get("clusterIP"), "spec.clusterIP") or ""
    ips = [c.string(v, f"spec.clusterIPs[{i}]") or ""
           for i, v in enumerate(c.array(spec.get("clusterIPs"), "spec.clusterIPs"))]
    if ips and cluster_ip and ips[0] != cluster_ip:
        c.add("spec.clusterIPs[0]", "must match clusterIP")
    if ips and not cluster_ip and stype != "ExternalName":
        c.add("spec.clusterIPs", "must be empty when clusterIP is not specified")
    ips = ips or ([cluster_ip] if cluster_ip else [])  # strategy's normalizeClusterIPs
    families_given = c.array(spec.get("ipFamilies"), "spec.ipFamilies")
    policy = c.string(spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy")
    if stype == "ExternalName":
        for key, given in (("clusterIPs", ips), ("ipFamilies", families_given),
                           ("ipFamilyPolicy", policy is not None)):
            if given:
                c.add(f"spec.{key}", "may not be set for ExternalName services")
        ips = []
    elif policy == "SingleStack" and (len(ips) == 2 or len(families_given) == 2):
        c.add("spec.ipFamilyPolicy", "must be dual-stack for two IPs or families (alloc.go)")
    headless = bool(ips) and ips[0] == "None"
    if len(ips) > 2:
        c.add("spec.clusterIPs", "at most two")
    families = []
    for i, text in enumerate(ips):
        if text == "None":
            if i or len(ips) > 1:
                c.add(f"spec.clusterIPs[{i}]", "None must be alone")
            continue
        ip = parse_ip(text)
        if ip is None:
            c.add(f"spec.clusterIPs[{i}]", "must be a valid IP")
        else:
            families.append(4 if is_v4(ip) else 6)
    if len(families) == 2 and families[0] == families[1]:
        c.add("spec.clusterIPs", "one of each family")
    if headless and stype in ("NodePort", "LoadBalancer"):
        c.add("spec.clusterIP", "may not be None")
    ports = c.array(spec.get("ports"), "spec.ports")
    if not ports and not headless and stype != "ExternalName":
        c.add("spec.ports", "required")
    names: set[str] = set()
    pairs: set[tuple[int, str]] = set()
    node_ports: set[tuple[int, str]] = set()
    for i, raw in enumerate(ports):
        where = f"spec.ports[{i}]"
        p = c.obj(raw, where)
        name = c.string(p.get("name"), f"{where}.name") or ""
        if len(ports) > 1 and not name:
            c.add(f"{where}.name", "required")
        elif name:
            if not is_dns1123_label(name):
                c.add(f"{where}.name", "not a DNS-1123 label")
            if name in names:
                c.add(f"{where}.name", "duplicate")
            names.add(name)
        port = c.int32(p.get("port"), f"{where}.port")
        if port is None or not is_valid_port_num(port):
            c.add(f"{where}.port", "not a port number")
        protocol = c.string(p.get("protocol"), f"{where}.protocol") or "TCP"
        if protocol not in PROTOCOLS:
            c.add(f"{where}.protocol", "not supported")
        if (port, protocol) in pairs:
            c.add(where, "duplicate port")
        pairs.add((port or 0, protocol))
        target = p.get("targetPort")
        if type(target) is str:
            if target and not is_valid_port_name(target):
                c.add(f"{where}.targetPort", "not a port name")
        elif target is not None:
            value = c.int32(target, f"{where}.targetPort")
            if value and not is_valid_port_num(value):
                c.add(f"{where}.targetPort", "not a port number")
        app = c.string(p.get("appProtocol"), f"{where}.appProtocol")
        if app is not None and not is_qualified_name(app):
            c.add(f"{where}.appProtocol", "not a qualified name")
        node_port = c.int32(p.get("nodePort"), f"{where}.nodePort") or 0
        if node_port:
            if not is_valid_port_num(node_port):
                c.add(f"{where}.nodePort", "not a port number")
            if stype == "ClusterIP":
                c.add(f"{where}.nodePort", "forbidden for ClusterIP")
            if (node_port, protocol) in node_ports:
                c.add(f"{where}.nodePort", "duplicate")
            node_ports.add((node_port, protocol))
    for i, raw in enumerate(c.array(spec.get("externalIPs"), "spec.externalIPs")):
        ip = parse_ip(c.string(raw, f"spec.externalIPs[{i}]") or "")
        if ip is None or non_special_ip(ip):
            c.add(f"spec.externalIPs[{i}]", "invalid external IP")
    affinity = c.string(spec.get("sessionAffinity"), "spec.sessionAffinity") or "None"
    if affinity not in ("None", "ClientIP"):
        c.add("spec.sessionAffinity", "not supported")
    if affinity == "None" and spec.get("sessionAffinityConfig") is not None:
        c.add("spec.sessionAffinityConfig", "must not be set when session affinity is None")
    cfg = c.obj(c.obj(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
                .get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = c.int32(cfg.get("timeoutSeconds"), "timeoutSeconds")
    if affinity == "ClientIP" and timeout is not None and not 0 < timeout <= 86400:
        c.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "1-86400")
    # externalTrafficPolicy is a string ("" is defaulted), the others *string: set, ""
    # included, each must be supported (validateServiceInternalTrafficFieldsValue,
    # validateServiceTrafficDistribution, the ipFamilyPolicy check).
    etp_value = c.string(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy")
    if etp_value and etp_value not in ("Cluster", "Local"):
        c.add("spec.externalTrafficPolicy", "not supported")
    for key, allowed in (("internalTrafficPolicy", ("Cluster", "Local")),
                         ("trafficDistribution", ("PreferClose", "PreferSameZone",
                                                  "PreferSameNode")),
                         ("ipFamilyPolicy", ("SingleStack", "PreferDualStack",
                                             "RequireDualStack"))):
        value = c.string(spec.get(key), f"spec.{key}")
        if value is not None and value not in allowed:
            c.add(f"spec.{key}", "not supported")
    # validateServiceExternalTrafficPolicy, after SetDefaults_Service (Cluster where
    # ExternallyAccessible) and the allocator (a health check port where needed).
    etp = c.string(spec.get("externalTrafficPolicy"), "etp") or ""
    reachable = stype in ("NodePort", "LoadBalancer") or (
        stype == "ClusterIP" and bool(spec.get("externalIPs")))
    if etp and not reachable:
        c.add("spec.externalTrafficPolicy", "may only be set for externally-accessible services")
    hc = c.int32(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort") or 0
    if hc and not (stype == "LoadBalancer" and etp == "Local"):
        c.add("spec.healthCheckNodePort", "only for LoadBalancer with Local")
    elif hc and not is_valid_port_num(hc):
        c.add("spec.healthCheckNodePort", "not a port number")
    notes = c.obj(c.obj(obj.get("metadata"), "metadata").get("annotations"), "annotations")
    _source_ranges(c, spec, stype, notes)
    mode = notes.get("service.kubernetes.io/topology-mode")
    hints = notes.get("service.kubernetes.io/topology-aware-hints")
    if mode is not None and hints is not None and mode != hints:
        c.add("metadata.annotations", "topology-mode must match topology-aware-hints")
    _ip_families(c, spec, stype, ips)
    _lb_status(c, c.obj(obj.get("status"), "status"))
    return c.list


def _source_ranges(c: _Causes, spec: dict[str, Any], stype: str,
                   notes: dict[str, Any]) -> None:
    """ValidateService's source ranges: the field's entries (GetLoadBalancerSourceRanges:
    ParseIPNets trims each and parses it as one CIDR), or without it the annotation
    (present: split on commas once trimmed, "" is the default); either only with type
    LoadBalancer."""
    ranges = c.array(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges")
    key = "service.beta.kubernetes.io/load-balancer-source-ranges"
    if not ranges and key not in notes:
        return
    if stype != "LoadBalancer":
        c.add("spec.loadBalancerSourceRanges", "may only be used when type is LoadBalancer")
    if ranges:
        parts = [c.string(raw, f"spec.loadBalancerSourceRanges[{i}]") or ""
                 for i, raw in enumerate(ranges)]
    else:
        text = (c.string(notes[key], "annotations") or "").strip()
        parts = text.split(",") if text else []
    for part in parts:
        if not parse_cidr(part.strip()):
            c.add("spec.loadBalancerSourceRanges", "must be a list of IP ranges")


def _ip_families(c: _Causes, spec: dict[str, Any], stype: str, ips: list[str]) -> None:
    """ValidateServiceClusterIPsRelatedFields' ipFamilies: IPv4 or IPv6, no repeat, each
    the family of the cluster IP at its index (not for a headless service)."""
    if stype == "ExternalName":
        return
    seen: set[Any] = set()
    for i, family in enumerate(c.array(spec.get("ipFamilies"), "spec.ipFamilies")):
        if family not in ("IPv4", "IPv6") or family in seen:
            c.add(f"spec.ipFamilies[{i}]", "not supported, or a duplicate")
            continue
        seen.add(family)
        ip = parse_ip(ips[i]) if i < len(ips) and ips[0] != "None" else None
        if ip is not None and (family == "IPv4") != is_v4(ip):
            c.add(f"spec.clusterIPs[{i}]", f"expected an {family} value")


def _lb_status(c: _Causes, status: dict[str, Any]) -> None:
    """ValidateLoadBalancerStatus (a manifest's status, as a status update would be
    checked): an ingress IP valid when set; ipMode (a *string) VIP or Proxy, only with an
    IP."""
    lb = c.obj(status.get("loadBalancer"), "status.loadBalancer")
    for i, raw in enumerate(c.array(lb.get("ingress"), "status.loadBalancer.ingress")):
        where = f"status.loadBalancer.ingress[{i}]"
        ingress = c.obj(raw, where)
        ip = c.string(ingress.get("ip"), f"{where}.ip") or ""
        mode = c.string(ingress.get("ipMode"), f"{where}.ipMode")
        if ip and parse_ip(ip) is None:
            c.add(f"{where}.ip", "must be a valid IP address")
        if mode is not None and not ip:
            c.add(f"{where}.ipMode", "may not be specified when `ip` is not set")
        elif mode is not None and mode not in ("VIP", "Proxy"):
            c.add(f"{where}.ipMode", "not supported")


# ---- EndpointSlice: ValidateEndpointSlice ------------------------------------------
def slice_causes(obj: dict[str, Any]) -> Causes:
    c = _Causes()
    _meta(c, obj, is_dns1123_subdomain, True)
    address_type = c.string(obj.get("addressType"), "addressType")
    if address_type not in ("IPv4", "IPv6", "FQDN"):
        c.add("addressType", "required / not supported")
    endpoints = c.array(obj.get("endpoints"), "endpoints")
    if len(endpoints) > 1000:
        c.add("endpoints", "too many")
    for i, raw in enumerate(endpoints):
        where = f"endpoints[{i}]"
        ep = c.obj(raw, where)
        addresses = c.array(ep.get("addresses"), f"{where}.addresses")
        if not addresses or len(addresses) > 100:
            c.add(f"{where}.addresses", "1-100 addresses")
        for j, raw_address in enumerate(addresses):
            text = c.string(raw_address, f"{where}.addresses[{j}]") or ""
            ip = parse_ip(text)
            if address_type == "IPv4" and (ip is None or not is_v4(ip) or non_special_ip(ip)):
                c.add(f"{where}.addresses[{j}]", "not a valid IPv4 endpoint")
            elif address_type == "IPv6" and (ip is None or is_v4(ip) or non_special_ip(ip)):
                c.add(f"{where}.addresses[{j}]", "not a valid IPv6 endpoint")
            elif address_type == "FQDN" and not _fqdn(text):
                c.add(f"{where}.addresses[{j}]", "not a FQDN")
        cond = c.obj(ep.get("conditions"), f"{where}.conditions")
        for key in ("ready", "serving", "terminating"):
            if cond.get(key) is not None and type(cond.get(key)) is not bool:
                c.add(f"{where}.conditions.{key}", "must be a boolean (decoding)")
        node = c.string(ep.get("nodeName"), f"{where}.nodeName")
        if node is not None and not is_dns1123_subdomain(node):  # ValidateNodeName
            c.add(f"{where}.nodeName", "invalid node name")
        hostname = c.string(ep.get("hostname"), f"{where}.hostname")
        if hostname is not None and not is_dns1123_label(hostname):
            c.add(f"{where}.hostname", "not a DNS-1123 label")
        c.string(ep.get("zone"), f"{where}.zone")  # no rule but its type
        topology = c.labels(ep.get("deprecatedTopology"), f"{where}.deprecatedTopology")
        if len(topology) > 16 or "topology.kubernetes.io/zone" in topology:
            c.add(f"{where}.deprecatedTopology", "too many, or the zone key")
        hints = c.obj(ep.get("hints"), f"{where}.hints")
        zones = c.array(hints.get("forZones"), f"{where}.hints.forZones")
        if len(zones) > 8:
            c.add(f"{where}.hints.forZones", "too many")
        seen: set[str] = set()
        for k, hint in enumerate(zones[:9]):
            name = c.string(c.obj(hint, "hint").get("name"), f"{where}.hints") or ""
            if name in seen or not is_valid_label_value(name):
                c.add(f"{where}.hints.forZones[{k}].name", "duplicate or invalid")
            seen.add(name)
    ports = c.array(obj.get("ports"), "ports")
    if len(ports) > 20000:
        c.add("ports", "too many")
    names: set[str] = set()
    for i, raw in enumerate(ports):
        where = f"ports[{i}]"
        p = c.obj(raw, where)
        name = c.string(p.get("name"), f"{where}.name") or ""
        if name and not is_dns1123_label(name):
            c.add(f"{where}.name", "not a DNS-1123 label")
        if name in names:
            c.add(f"{where}.name", "duplicate")
        names.add(name)
        protocol = c.string(p.get("protocol"), f"{where}.protocol")
        if protocol is not None and protocol not in PROTOCOLS:
            c.add(f"{where}.protocol", "not supported")
        c.int32(p.get("port"), f"{where}.port")  # no rule but its type
        app = c.string(p.get("appProtocol"), f"{where}.appProtocol")
        if app is not None and not is_qualified_name(app):
            c.add(f"{where}.appProtocol", "not a qualified name")
    return c.list


def _fqdn(text: str) -> bool:  # IsFullyQualifiedDomainName
    name = text[:-1] if text.endswith(".") else text
    return bool(name) and is_dns1123_subdomain(name) and len(name.split(".")) >= 2 and \
        all(is_dns1123_label(label) for label in name.split("."))


# ---- Node: ValidateNode ----------------------------------------------------------
def node_causes(obj: dict[str, Any]) -> Causes:
    c = _Causes()
    _meta(c, obj, is_dns1123_subdomain, False)
    spec = c.obj(obj.get("spec"), "spec")
    cidrs = [c.string(v, f"spec.podCIDRs[{i}]") or ""
             for i, v in enumerate(c.array(spec.get("podCIDRs"), "spec.podCIDRs"))]
    families = [parse_cidr(v) for v in cidrs]
    if 0 in families:
        c.add("spec.podCIDRs", "must be valid CIDRs")
    elif len(cidrs) > 2 or len(cidrs) == 2 and families[0] == families[1]:
        c.add("spec.podCIDRs", "one per family")
    taints = c.array(spec.get("taints"), "spec.taints")
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(taints):
        taint = c.obj(raw, f"spec.taints[{i}]")
        key = c.string(taint.get("key"), "key") or ""
        value = c.string(taint.get("value"), "value") or ""
        effect = c.string(taint.get("effect"), "effect") or ""
        if not is_qualified_name(key) or not is_valid_label_value(value) or \
                effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or \
                (key, effect) in seen:
            c.add(f"metadata.taints[{i}]", "invalid taint")  # sic: ValidateNode's path
        seen.add((key, effect))
    status = c.obj(obj.get("status"), "status")
    for i, raw in enumerate(c.array(status.get("addresses"), "status.addresses")):
        addr = c.obj(raw, f"status.addresses[{i}]")
        c.string(addr.get("type"), "type")
        c.string(addr.get("address"), "address")  # no status is validated
    return c.list


CAUSES = {"Service": service_causes, "EndpointSlice": slice_causes, "Node": node_causes}


def causes(kind: str, obj: Any) -> Causes:
    """Why the apiserver would refuse ``obj`` (400 or 422), empty when it stores it."""
    if type(obj) is not dict:
        return [("", "not an object")]
    return CAUSES[kind](obj)

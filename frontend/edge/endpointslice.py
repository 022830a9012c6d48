"""An EndpointSlice as the apiserver validates it (pkg/apis/discovery/validation), plus
the service-name label; the common shape of an IPv4 endpoint checked in one pass."""

from __future__ import annotations

from typing import Any

from svcproxy.frontend.edge import rfc3339
from svcproxy.frontend.edge.addresses import ALLOWED_IPV4
from svcproxy.frontend.edge.checker import (
    PROTOCOLS,
    Checker,
    check_app_protocol,
    check_object,
)
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.names import DNS1123_SUBDOMAIN, QUALIFIED, is_fqdn, matches
from svcproxy.frontend.edge.verdict import Problem, Verdict, shown

MAX_SLICE_ENDPOINTS = 1000
MAX_SLICE_PORTS = 20000
MAX_ENDPOINT_ADDRESSES = 100
MAX_ZONE_HINTS = 8
MAX_TOPOLOGY_LABELS = 16
ZONE_KEY = "topology.kubernetes.io/zone"
INT32 = (-(2**31), 2**31 - 1)  # an int32 field: the apiserver's decoding refuses more
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")

# Bound once: Python 3.11 compiles a method call on an imported name as an attribute load,
# which makes a bound method at each call (this one is made for every endpoint address).
_allowed_ipv4 = ALLOWED_IPV4.fullmatch


def trigger_time_problem(value: Any) -> str | None:
    """Why a last-change-trigger-time annotation is unusable (then it is ignored)."""
    if not isinstance(value, str):
        return f"{shown(value)} is not an RFC 3339 time"
    parsed = rfc3339.parse(value)  # what kube-proxy's time.Parse(RFC3339Nano) takes
    if parsed is None:
        return f"{shown(value)} is not a usable RFC 3339 time (years 1-9999 in UTC)"
    return None if parsed > (0, 0) else f"{shown(value)} is not after 1970"


def validate_endpoint_slice(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """An EndpointSlice as the apiserver validates it, plus the service-name label."""
    c = Checker(limits)
    plain = _plain_endpoints(obj, limits)
    if not check_object(c, obj, limits, None if plain is None else ("endpoints", plain)):
        return c.v
    # ValidateObjectMeta with ValidateEndpointSliceName (NameIsDNSSubdomain).
    labels, annotations = c.metadata(obj, c.subdomain, namespaced=True)
    if not labels.get(SERVICE_NAME_LABEL):  # no Kubernetes rule: kube-proxy skips such an
        c.err(f"metadata.labels.{SERVICE_NAME_LABEL}", "malformed",  # update, keeping the last
              "is missing: the slice belongs to no service")  # version (so does refusing it)
    if TRIGGER_TIME_ANNOTATION in annotations:
        why = trigger_time_problem(annotations[TRIGGER_TIME_ANNOTATION])
        if why:
            c.v.warnings.append(Problem(f"metadata.annotations.{TRIGGER_TIME_ANNOTATION}",
                                        "ignored_value", f"{why}; ignored"))
    address_type = obj.get("addressType")
    if address_type not in ADDRESS_TYPES:  # validateAddressType
        c.err("addressType", "invalid_value", f"{shown(address_type)} is not IPv4, IPv6 or FQDN")
    _ports(c, obj.get("ports"))
    if plain is not None:
        return c.v
    kind = address_type if address_type in ADDRESS_TYPES else ""
    node_limit = min(253, limits.max_name_length)
    for i, raw in enumerate(c.items(obj.get("endpoints"), "endpoints", MAX_SLICE_ENDPOINTS)):
        if kind != "IPv4" or not _plain_ipv4_endpoint(raw, node_limit):
            _endpoint(c, c.mapping(raw, f"endpoints[{i}]"), f"endpoints[{i}]", kind)
    return c.v


def _ports(c: Checker, value: Any) -> None:
    """validatePorts: at most 20,000; a name unique (unset is "") and a DNS-1123 label
    when set; a protocol (unset defaults to TCP, "" is not supported); appProtocol a
    qualified name. The port number has no rule but its type (int32): one svcproxy
    cannot use (0, negative, over 65535) degrades that port alone."""
    names: set[str] = set()
    for i, raw in enumerate(c.items(value, "ports", MAX_SLICE_PORTS)):
        where = f"ports[{i}]"
        p = c.mapping(raw, where)
        name = c.string(p.get("name"), f"{where}.name")
        if name:
            c.label(name, f"{where}.name")
        if name in names:
            c.err(f"{where}.name", "duplicate", f"{shown(name)} is used by another port")
        names.add(name)
        protocol = p.get("protocol")  # SetDefaults_EndpointPort: unset (null) is TCP
        if protocol is not None and protocol not in PROTOCOLS:
            c.err(f"{where}.protocol", "invalid_protocol", f"{shown(protocol)} is not TCP, "
                  "UDP or SCTP")
        port = p.get("port")
        if port is not None and (type(port) is not int or not INT32[0] <= port <= INT32[1]):
            c.err(f"{where}.port", "invalid_port", f"{shown(port)} is not a 32-bit integer")
        elif port is not None and not 1 <= port <= 65535:
            c.v.warnings.append(Problem(f"{where}.port", "degraded", f"{port} is not a port "
                                        "svcproxy can program (1-65535); this port is left out"))
        check_app_protocol(c, p.get("appProtocol"), f"{where}.appProtocol")


def _plain_endpoints(obj: Any, limits: ObjectLimits) -> int | None:
    """A bound on ``check_size``'s count of an IPv4 slice's endpoints when every one has
    the plain shape (so is valid); None otherwise (then each is checked and walked)."""
    if type(obj) is not dict or obj.get("addressType") != "IPv4":
        return None
    endpoints = obj.get("endpoints")
    if type(endpoints) is not list or len(endpoints) > MAX_SLICE_ENDPOINTS:
        return None
    node_limit = min(253, limits.max_name_length)
    size = 2
    for ep in endpoints:
        one = _plain_ipv4_endpoint(ep, node_limit)
        if not one:
            return None
        size += one
    return size


# The fields of an endpoint the plain shape may have, each bounded as checked there (a
# canonical IPv4 address is at most 15 characters, a node name at most 253, a zone 63).
_PLAIN_KEYS = frozenset(("addresses", "conditions", "nodeName", "zone", "hostname", "hints",
                         "targetRef"))
_CONDITION_KEYS = frozenset(("ready", "serving", "terminating"))
_PLAIN_BOUND = (2 + sum(len(k) + 3 for k in _PLAIN_KEYS) + 2  # the keys; addresses' list
                + 2 + sum(len(k) + 3 + 8 for k in _CONDITION_KEYS)  # conditions
                + 255 + 65 + 8 + 8 + 8)  # nodeName, zone, hostname, hints, targetRef
_ADDRESS_BOUND = 15 + 2


def _plain_ipv4_endpoint(ep: Any, node_limit: int) -> int:
    """For the common shape of a valid IPv4 endpoint, checked without building field
    paths: a bound on its size as ``check_size`` counts it. 0 for anything else (or any
    doubt), which goes through ``_endpoint`` (that says why) and the walk."""
    if type(ep) is not dict or not ep.keys() <= _PLAIN_KEYS or ep.get("hints") is not None \
            or ep.get("hostname") is not None:
        return 0
    addresses = ep.get("addresses")
    if type(addresses) is not list or not 0 < len(addresses) <= MAX_ENDPOINT_ADDRESSES:
        return 0
    for address in addresses:
        if type(address) is not str or not _allowed_ipv4(address):
            return 0
    cond = ep.get("conditions")
    if cond is not None:
        if type(cond) is not dict or not cond.keys() <= _CONDITION_KEYS:
            return 0
        for value in cond.values():
            if value is not None and value is not True and value is not False:
                return 0
    node = ep.get("nodeName")
    if node is not None and not (type(node) is str and len(node) <= node_limit
                                 and matches(DNS1123_SUBDOMAIN, node)):
        return 0
    zone = ep.get("zone")
    if zone is not None and not (type(zone) is str and len(zone) <= 63 and zone.isascii()):
        return 0
    size = _PLAIN_BOUND + _ADDRESS_BOUND * len(addresses)
    ref = ep.get("targetRef")
    if ref is not None:
        flat = _flat_size(ref) if type(ref) is dict else 0
        if not flat:
            return 0
        size += flat
    return size


def _flat_size(value: dict[Any, Any]) -> int:
    """``check_size``'s count of a mapping of text keys and scalars (0 for any other)."""
    try:
        size = 2 + sum(map(len, value)) + 3 * len(value)
    except TypeError:
        return 0
    for key, child in value.items():
        if type(key) is not str:
            return 0
        if type(child) is str:
            size += len(child) + 2
        elif isinstance(child, dict | list | bytes):
            return 0
        else:
            size += 8
    return size


def _endpoint(c: Checker, ep: dict[str, Any], where: str, address_type: str) -> None:
    """validateEndpoints' rules for one endpoint (the count of endpoints is checked by
    the caller): 1-100 addresses, each IsValidIPv4Address / IsValidIPv6Address and
    ValidateEndpointIP, or IsFullyQualifiedDomainName; nodeName ValidateNodeName and
    hostname ValidateDNS1123Label when set (even to ""); deprecatedTopology labels;
    hints. The zone has no rule."""
    addresses = c.items(ep.get("addresses"), f"{where}.addresses", MAX_ENDPOINT_ADDRESSES)
    if not addresses and isinstance(ep.get("addresses"), list | None):
        c.err(f"{where}.addresses", "malformed", "must hold at least one address")
    for j, address in enumerate(addresses):
        if address_type in ("IPv4", "IPv6"):
            c.ip(address, f"{where}.addresses[{j}]", "endpoint", int(address_type[-1]))
        elif address_type == "FQDN" and not is_fqdn(address):
            c.err(f"{where}.addresses[{j}]", "invalid_name", f"{shown(address)} is not a "
                  "fully qualified domain name (two or more DNS-1123 labels, at most 253 "
                  "characters, a trailing dot allowed)")
    cond = c.mapping(ep.get("conditions"), f"{where}.conditions")
    for key in ("ready", "serving", "terminating"):
        c.boolean(cond.get(key), f"{where}.conditions.{key}")
    if ep.get("nodeName") is not None:
        c.subdomain(ep.get("nodeName"), f"{where}.nodeName")
    if ep.get("hostname") is not None:
        c.label(ep.get("hostname"), f"{where}.hostname")
    zone = c.string(ep.get("zone"), f"{where}.zone")
    if zone and not _is_text(zone):
        c.v.warnings.append(Problem(f"{where}.zone", "degraded", "is not valid UTF-8 text "
                                    "(it cannot be sent); the endpoint is served without it"))
    _topology(c, ep.get("deprecatedTopology"), f"{where}.deprecatedTopology")
    if ep.get("hints") is not None:
        _hints(c, c.mapping(ep.get("hints"), f"{where}.hints"), f"{where}.hints")


def _topology(c: Checker, value: Any, where: str) -> None:
    """deprecatedTopology: at most 16 labels (ValidateLabels), not the zone's key (its
    v1beta1 conversion moves that one to zone; validateEndpoints refuses it in v1)."""
    if value is None:
        return
    labels = c.meta_map(value, where, QUALIFIED)
    if len(labels) > MAX_TOPOLOGY_LABELS:
        c.err(where, "too_many", f"has {len(labels)} labels, at most {MAX_TOPOLOGY_LABELS}")
    if ZONE_KEY in labels:
        c.err(f"{where}.{ZONE_KEY}", "invalid_value", "is reserved: set zone instead")


def _hints(c: Checker, hints: dict[str, Any], where: str) -> None:
    """validateHints: at most 8 forZones, each name unique and IsValidLabelValue (which
    allows ""); forNodes (Kubernetes 1.33) at most 8, each unique and ValidateNodeName."""
    for key, check in (("forZones", _hint_zone), ("forNodes", _hint_node)):
        seen: set[str] = set()
        for k, hint in enumerate(c.items(hints.get(key), f"{where}.{key}", MAX_ZONE_HINTS)):
            spot = f"{where}.{key}[{k}].name"
            name = check(c, c.mapping(hint, spot).get("name"), spot)
            if name in seen:
                c.err(spot, "duplicate", f"{shown(name)} is listed twice")
            seen.add(name)


def _hint_zone(c: Checker, value: Any, where: str) -> str:
    name = c.string(value, where)
    if len(name) > 63 or name and not matches(QUALIFIED, name):
        c.err(where, "invalid_value", f"{shown(name)} is not a valid label value")
    return name


def _hint_node(c: Checker, value: Any, where: str) -> str:
    return c.subdomain(value, where)


def _is_text(text: str) -> bool:
    """Whether ``text`` can be encoded (YAML escapes can make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

"""The EndpointSlice kind, whole: the apiserver's rules for the fields svcproxy reads
(pkg/apis/discovery/validation) with their messages, each rule giving the value it checked
to the ``objects.EndpointSlice`` it builds (``read_endpoint_slice``), and the typed decode
of a listed slice's JSON (``decode_slice``), an optimisation of the same reading.

One reader. ``read_endpoint_slice`` reads each field once: the rule checks it (the
problem, if any, goes into the verdict with Kubernetes' message) and returns the value
read, and a slice is built of those values when the verdict accepts it.
``validate_endpoint_slice`` is that pass's verdict. A new field goes in one place: the
rule that reads it, here.

The fast paths, optionally. The msgspec structs below name the fields of the common
shape. msgspec decodes a listed slice's JSON straight into them, in C, and
``decode_slice`` checks them without messages; an endpoint of that shape in a dict is
checked without building field paths (``_plain_ipv4_endpoint``: the keys the struct
names, each with the bound on its value's size, so a field added to the struct without
its bound fails at import). A field the structs do not name (so a new one, until it is
added here too), hints, an IPv6 or FQDN slice, limits below the defaults, or any doubt
takes the rules' full path, which says why or reads it. Property tests in
tests/frontend/edge/ hold the paths to one object.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from svcproxy.frontend.edge import rfc3339
from svcproxy.frontend.edge.addresses import ALLOWED_IPV4
from svcproxy.frontend.edge.checker import (
    PROTOCOLS,
    Checker,
    check_app_protocol,
    check_object,
)
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.metadata import NAME, Meta, decoded, metadata_ok
from svcproxy.frontend.edge.names import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    QUALIFIED,
    is_app_protocol,
    is_fqdn,
    matches,
)
from svcproxy.frontend.edge.objects import (
    EndpointSlice,
    SliceEndpoint,
    SlicePort,
    kube_ips,
    parse_time,
)
from svcproxy.frontend.edge.verdict import Problem, Verdict, shown
from svcproxy.frontend.edge.wellknown import (
    SERVICE_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    ZONE_LABEL,
)
from svcproxy.model import Protocol

MAX_SLICE_ENDPOINTS = 1000
MAX_SLICE_PORTS = 20000
MAX_ENDPOINT_ADDRESSES = 100
MAX_ZONE_HINTS = 8
MAX_TOPOLOGY_LABELS = 16
INT32 = (-(2**31), 2**31 - 1)  # an int32 field: the apiserver's decoding refuses more
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
Scalar = str | int | float | bool | None


# The schema. Absent and null are alike to every field here (the general path reads both
# as unset), so each is optional with None for both.
class _Conditions(msgspec.Struct, forbid_unknown_fields=True):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class _Endpoint(msgspec.Struct, forbid_unknown_fields=True):
    addresses: tuple[str, ...]
    conditions: _Conditions | None = None
    nodeName: str | None = None
    zone: str | None = None
    hostname: str | None = None  # set: the general path checks it (a DNS-1123 label)
    hints: None = None  # set: the general path reads the hints
    targetRef: dict[str, Scalar] | None = None


class _Port(msgspec.Struct, forbid_unknown_fields=True):
    name: str | None = None
    protocol: str | None = None
    port: int | None = None
    appProtocol: str | None = None


class _Slice(msgspec.Struct, forbid_unknown_fields=True):
    metadata: Meta
    addressType: str
    endpoints: list[_Endpoint] | None = None
    ports: list[_Port] | None = None
    kind: str | None = None
    apiVersion: str | None = None


CONDITIONS = _Conditions.__struct_fields__
_DECODER = msgspec.json.Decoder(_Slice)
_DEPTH = 3  # these structs are at most 3 levels deep

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


def read_endpoint_slice(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS,
                        seen_at: float | None = None) -> tuple[EndpointSlice | None, Verdict]:
    """An EndpointSlice read in one pass: each field svcproxy reads checked once as the
    apiserver validates it, plus the service-name label (its problems, with their
    messages, in the verdict), and taken as the value the slice is made of; the slice is
    None when the verdict refuses it. Its trigger time, without a usable annotation, is
    ``seen_at`` (default now)."""
    c = Checker(limits)
    plain = _plain_endpoints(obj, limits)
    if not check_object(c, obj, limits, None if plain is None else ("endpoints", plain)):
        return None, c.v
    # ValidateObjectMeta with ValidateEndpointSliceName (NameIsDNSSubdomain).
    labels, annotations = c.metadata(obj, c.subdomain, namespaced=True)
    service = labels.get(SERVICE_NAME_LABEL)
    if not service:  # no Kubernetes rule: kube-proxy skips such an update, keeping the last
        c.err(f"metadata.labels.{SERVICE_NAME_LABEL}", "malformed",  # version (so does
              "is missing: the slice belongs to no service")  # refusing it)
    trigger = annotations.get(TRIGGER_TIME_ANNOTATION)
    if TRIGGER_TIME_ANNOTATION in annotations:
        why = trigger_time_problem(trigger)
        if why:
            c.v.warnings.append(Problem(f"metadata.annotations.{TRIGGER_TIME_ANNOTATION}",
                                        "ignored_value", f"{why}; ignored"))
    address_type = obj.get("addressType")
    if address_type not in ADDRESS_TYPES:  # validateAddressType
        c.err("addressType", "invalid_value", f"{shown(address_type)} is not IPv4, IPv6 or FQDN")
    ports = _ports(c, obj.get("ports"))
    endpoints = _endpoints(c, obj.get("endpoints"), address_type, plain is not None)
    if not c.v.ok:
        return None, c.v
    meta = obj["metadata"]
    return EndpointSlice(
        meta.get("namespace") or "default", meta["name"], service, address_type, ports,
        () if address_type == "FQDN" else endpoints,
        parse_time(trigger) or (seen_at if seen_at is not None else time.time())), c.v


def validate_endpoint_slice(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """An EndpointSlice as the apiserver validates it, plus the service-name label
    (``read_endpoint_slice``'s verdict)."""
    return read_endpoint_slice(obj, limits)[1]


def _ports(c: Checker, value: Any) -> tuple[SlicePort, ...]:
    """validatePorts: at most 20,000; a name unique (unset is "") and a DNS-1123 label
    when set; a protocol (unset defaults to TCP, "" is not supported); appProtocol a
    qualified name. The port number has no rule but its type (int32): one svcproxy
    cannot use (0, negative, over 65535) degrades that port alone. The ports read (one
    without a number, "all ports", or degraded is left out)."""
    names: set[str] = set()
    read: list[tuple[str, str, int]] = []
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
        elif port is not None:
            read.append((name, protocol or "TCP", port))
        check_app_protocol(c, p.get("appProtocol"), f"{where}.appProtocol")
    if not c.v.ok:
        return ()
    return tuple(SlicePort(name, Protocol(protocol), port) for name, protocol, port in read)


def _endpoints(c: Checker, value: Any, address_type: Any, plain: bool
               ) -> tuple[SliceEndpoint, ...]:
    """validateEndpoints: at most 1,000, each checked by ``_endpoint`` but for one of the
    plain IPv4 shape (``plain``: every one is, see ``_plain_endpoints``), valid as it is;
    the endpoints read."""
    if plain:
        return tuple(_plain_endpoint(ep) for ep in value)
    kind = address_type if address_type in ADDRESS_TYPES else ""
    node_limit = min(253, c.limits.max_name_length)
    out = []
    for i, raw in enumerate(c.items(value, "endpoints", MAX_SLICE_ENDPOINTS)):
        if kind == "IPv4" and _plain_ipv4_endpoint(raw, node_limit):
            out.append(_plain_endpoint(raw))
        else:
            out.append(_endpoint(c, c.mapping(raw, f"endpoints[{i}]"), f"endpoints[{i}]", kind))
    return tuple(out)


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


# The plain shape's fields are the schema's, each with a bound on its value's size as
# ``check_size`` counts it (a node name is at most 253 characters, a zone 63; the
# addresses' list and the targetRef are counted apart): a field added to the schema
# needs its bound here, or this module fails to import.
_VALUE_BOUNDS = {"addresses": 2, "conditions": 2 + sum(len(k) + 3 + 8 for k in CONDITIONS),
                 "nodeName": 253 + 2, "zone": 63 + 2, "hostname": 8, "hints": 8,
                 "targetRef": 8}
_PLAIN_KEYS = frozenset(_Endpoint.__struct_fields__)
_CONDITION_KEYS = frozenset(CONDITIONS)
_PLAIN_BOUND = 2 + sum(len(k) + 3 + _VALUE_BOUNDS[k] for k in _PLAIN_KEYS)
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


def _endpoint(c: Checker, ep: dict[str, Any], where: str, address_type: str
              ) -> SliceEndpoint:
    """validateEndpoints' rules for one endpoint (the count of endpoints is checked by
    the caller): 1-100 addresses, each IsValidIPv4Address / IsValidIPv6Address and
    ValidateEndpointIP, or IsFullyQualifiedDomainName; nodeName ValidateNodeName and
    hostname ValidateDNS1123Label when set (even to ""); deprecatedTopology labels;
    hints. The zone has no rule. The endpoint read (an FQDN one's addresses are not)."""
    addresses = c.items(ep.get("addresses"), f"{where}.addresses", MAX_ENDPOINT_ADDRESSES)
    if not addresses and isinstance(ep.get("addresses"), list | None):
        c.err(f"{where}.addresses", "malformed", "must hold at least one address")
    ips = []
    for j, address in enumerate(addresses):
        if address_type in ("IPv4", "IPv6"):
            if c.ip(address, f"{where}.addresses[{j}]", "endpoint", int(address_type[-1])):
                ips.append(address)
        elif address_type == "FQDN" and not is_fqdn(address):
            c.err(f"{where}.addresses[{j}]", "invalid_name", f"{shown(address)} is not a "
                  "fully qualified domain name (two or more DNS-1123 labels, at most 253 "
                  "characters, a trailing dot allowed)")
    cond = c.mapping(ep.get("conditions"), f"{where}.conditions")
    for key in CONDITIONS:
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
    zones, nodes = _hints(c, c.mapping(ep.get("hints"), f"{where}.hints"), f"{where}.hints") \
        if ep.get("hints") is not None else ((), ())
    return _endpoint_read(ep, cond, kube_ips(ips), zones, nodes)


def _plain_endpoint(ep: dict[str, Any]) -> SliceEndpoint:
    """An endpoint of the plain IPv4 shape (``_plain_ipv4_endpoint``) read: valid as it
    is, its addresses canonical."""
    addresses = ep["addresses"]
    return _endpoint_read(ep, ep.get("conditions") or {}, (addresses[0],) if len(
        addresses) == 1 else tuple(dict.fromkeys(addresses)), (), ())


def _endpoint_read(ep: dict[str, Any], cond: dict[str, Any], addresses: tuple[str, ...],
                   zones: tuple[str, ...], nodes: tuple[str, ...]) -> SliceEndpoint:
    """A checked endpoint as svcproxy serves it: unset ready is true, unset serving is
    ready (the conditions' API defaults), a zone that cannot be sent is none."""
    ready = cond.get("ready")
    ready = True if ready is None else bool(ready)
    serving = cond.get("serving")
    return SliceEndpoint(addresses, ready, ready if serving is None else bool(serving),
                         bool(cond.get("terminating") or False), str(ep.get("nodeName") or ""),
                         _zone(ep.get("zone")), zones, nodes)


def _topology(c: Checker, value: Any, where: str) -> None:
    """deprecatedTopology: at most 16 labels (ValidateLabels), not the zone's key (its
    v1beta1 conversion moves that one to zone; validateEndpoints refuses it in v1)."""
    if value is None:
        return
    labels = c.meta_map(value, where, QUALIFIED)
    if len(labels) > MAX_TOPOLOGY_LABELS:
        c.err(where, "too_many", f"has {len(labels)} labels, at most {MAX_TOPOLOGY_LABELS}")
    if ZONE_LABEL in labels:
        c.err(f"{where}.{ZONE_LABEL}", "invalid_value", "is reserved: set zone instead")


def _hints(c: Checker, hints: dict[str, Any], where: str
           ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """validateHints: at most 8 forZones, each name unique and IsValidLabelValue (which
    allows ""); forNodes (Kubernetes 1.33) at most 8, each unique and ValidateNodeName.
    The zones' and nodes' names read."""
    read = []
    for key, check in (("forZones", _hint_zone), ("forNodes", _hint_node)):
        seen: set[str] = set()
        names = []
        for k, hint in enumerate(c.items(hints.get(key), f"{where}.{key}", MAX_ZONE_HINTS)):
            spot = f"{where}.{key}[{k}].name"
            entry = c.mapping(hint, spot)
            name = check(c, entry.get("name"), spot)
            if name in seen:
                c.err(spot, "duplicate", f"{shown(name)} is listed twice")
            seen.add(name)
            names.append(name)
        read.append(tuple(names))
    return read[0], read[1]


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


def _zone(value: Any) -> str:
    """An endpoint's zone (any text: Kubernetes has no rule), "" when it cannot be sent
    (not valid UTF-8: the validator warned of it)."""
    text = str(value or "")
    if text.isascii():
        return text
    return text if _is_text(text) else ""


def decode_slice(data: bytes | msgspec.Raw, limits: ObjectLimits,
                 seen_at: float | None = None) -> EndpointSlice | None:
    """The EndpointSlice the general path would make of ``data`` (an item's JSON), or
    None when not of the common shape (then take the general path)."""
    obj = decoded(_DECODER, data, limits, _DEPTH)
    if obj is None:
        return None
    meta = obj.metadata
    if obj.addressType != "IPv4" or not metadata_ok(meta, DNS1123_SUBDOMAIN, NAME, limits):
        return None
    service = (meta.labels or {}).get(SERVICE_NAME_LABEL)
    annotations = meta.annotations or {}
    trigger_text = annotations.get(TRIGGER_TIME_ANNOTATION)
    if not service or trigger_text is not None and trigger_time_problem(trigger_text):
        return None
    ports = _decoded_ports(obj.ports or [])
    endpoints = _decoded_endpoints(obj.endpoints or [])
    if ports is None or endpoints is None:
        return None
    trigger = parse_time(trigger_text)
    return EndpointSlice(meta.namespace or "default", meta.name, service, "IPv4", ports,
                         endpoints, trigger or (seen_at if seen_at is not None else time.time()))


def _decoded_ports(ports: list[_Port]) -> tuple[SlicePort, ...] | None:
    """``_ports``' rules, on the decoded ports; None when one would be refused or
    degraded."""
    if len(ports) > MAX_SLICE_PORTS:
        return None
    names: set[str] = set()
    out = []
    for p in ports:
        name = p.name or ""
        if name and (len(name) > 63 or not matches(DNS1123_LABEL, name)) or name in names:
            return None
        names.add(name)
        protocol = "TCP" if p.protocol is None else p.protocol
        if protocol not in PROTOCOLS or \
                p.appProtocol is not None and not is_app_protocol(p.appProtocol):
            return None
        if p.port is None:
            continue
        if not 1 <= p.port <= 65535:  # degraded (or refused): the general path says so
            return None
        out.append(SlicePort(name, Protocol(protocol), p.port))
    return tuple(out)


# Node name and zone pairs found valid (a cluster has a few hundred): one look-up each.
_PLACES: set[tuple[str | None, str]] = set()


def _place_ok(node: str | None, zone: str) -> bool:
    """A node name valid when set (ValidateNodeName, "" is not), a zone (no rule) of at
    most 63 ASCII characters (others: the general path, which reads any)."""
    if (node, zone) in _PLACES:
        return True
    if node is not None and (len(node) > NAME or not DNS1123_SUBDOMAIN.fullmatch(node)) or \
            len(zone) > 63 or not zone.isascii():
        return False
    if len(_PLACES) > 10_000:
        _PLACES.clear()
    _PLACES.add((node, zone))
    return True


def _decoded_endpoints(endpoints: list[_Endpoint]) -> tuple[SliceEndpoint, ...] | None:
    """``_endpoint``'s rules and reading, on the decoded endpoints of an IPv4 slice;
    None when one is not of the plain shape."""
    if len(endpoints) > MAX_SLICE_ENDPOINTS:
        return None
    out: list[SliceEndpoint] = []
    append = out.append
    allowed = _allowed_ipv4
    places = _PLACES
    for ep in endpoints:
        addresses = ep.addresses
        if len(addresses) == 1 and ep.hostname is None:
            if not allowed(addresses[0]):
                return None
        else:
            if not 0 < len(addresses) <= MAX_ENDPOINT_ADDRESSES or ep.hostname is not None:
                return None
            for address in addresses:
                if not allowed(address):
                    return None
            addresses = tuple(dict.fromkeys(addresses))
        node, zone = ep.nodeName, ep.zone or ""
        if (node, zone) not in places and not _place_ok(node, zone):
            return None
        node = node or ""
        cond = ep.conditions
        if cond is None:
            append(SliceEndpoint(addresses, True, True, False, node, zone, (), ()))
            continue
        ready = True if cond.ready is None else cond.ready
        append(SliceEndpoint(addresses, ready, ready if cond.serving is None else cond.serving,
                             cond.terminating is True, node, zone, (), ()))
    return tuple(out)

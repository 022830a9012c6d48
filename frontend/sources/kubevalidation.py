"""Kubernetes' own validation rules for the objects the frontend reads.

One pure function per kind (``validate_service``, ``validate_endpoint_slice``,
``validate_node``) checks the fields svcproxy uses the way the apiserver does
(pkg/apis/core/validation, pkg/apis/discovery/validation): names, port names,
port ranges, protocols, enums, IP syntax and family, the addresses Kubernetes
forbids, duplicates and list limits. ``check_size`` bounds any object (size,
nesting) first. Nothing here raises on any input: a problem is returned as data,
so every source (apiserver, manifests, upstream) gets the same verdict.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

MAX_SLICE_ENDPOINTS = 1000
MAX_SLICE_PORTS = 20000
MAX_ENDPOINT_ADDRESSES = 100
MAX_ZONE_HINTS = 8
MAX_ANNOTATIONS_BYTES = 256 * 1024
MAX_PROBLEMS = 5

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
POLICIES = ("Cluster", "Local")
AFFINITIES = ("None", "ClientIP")
TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
IP_MODES = ("VIP", "Proxy")
IP_FAMILIES = ("IPv4", "IPv6")
IP_FAMILY_POLICIES = ("SingleStack", "PreferDualStack", "RequireDualStack")
NODE_ADDRESS_TYPES = ("Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
IANA_SVC_NAME = re.compile(r"[-a-z0-9]+")


@dataclass(frozen=True, slots=True)
class ObjectLimits:
    """Bounds on what one object may cost; each has a ``svcproxy frontend`` flag."""

    max_object_bytes: int = 1_572_864  # etcd's default request limit (1.5 MiB)
    max_depth: int = 64
    max_name_length: int = 253  # the longest name Kubernetes allows


DEFAULT_LIMITS = ObjectLimits()


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason to refuse (or a value to ignore): the field, a metric reason, a message."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(slots=True)
class Verdict:
    """Errors refuse the object; warnings are values ignored (logged) as kube-proxy does."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, where: str, reason: str, message: str) -> None:
        self.errors.append(Problem(where, reason, message))

    def summary(self) -> str:
        shown = "; ".join(str(p) for p in self.errors[:MAX_PROBLEMS])
        more = len(self.errors) - MAX_PROBLEMS
        return shown + (f" (and {more} more)" if more > 0 else "")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---- size ---------------------------------------------------------------------------
class _TooBig(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def check_size(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS,
               sized: tuple[str, int] | None = None) -> Problem | None:
    """Why ``obj`` is too large or deep (expanded, as YAML aliases would be), or None.

    Each visit of a container spends its own size from one budget, so a value shared
    many times (YAML aliases) is paid for each time and the walk stops within the budget.
    ``sized``: a key of ``obj`` and a bound on its value's size (at most 3 levels deep)
    the caller found as it checked it; the walk then leaves that value out, and when the
    bound does not fit (or anything else is amiss) the whole walk says why.
    """
    try:
        if sized is not None and type(obj) is dict and limits.max_depth >= 3:
            key, size = sized
            budget = [limits.max_object_bytes - size - len(key) - 3]
            try:
                _walk({k: v for k, v in obj.items() if k != key}, 0, budget, limits)
                return None
            except (_TooBig, RecursionError):
                pass
        if isinstance(obj, dict | list):
            _walk(obj, 0, [limits.max_object_bytes], limits)
    except _TooBig as big:
        return big.problem
    except RecursionError:
        return _DEEP(limits.max_depth)
    return None


def _walk(value: dict[Any, Any] | list[Any], depth: int, budget: list[int],
          limits: ObjectLimits) -> None:
    """``check_size``'s visit of one container (a module function: a nested recursive
    one is a reference cycle, left for the cyclic collector once per object checked)."""
    if depth > limits.max_depth:
        raise _TooBig(_DEEP(limits.max_depth))
    spent = 2
    if type(value) is dict:
        try:
            spent += sum(map(len, value)) + 3 * len(value)
        except TypeError:  # a key that is not text (YAML allows numbers...)
            spent += sum(len(k) + 3 if type(k) is str else 8 for k in value)
        children: Any = value.values()
    else:
        children = value
    for child in children:
        kind = type(child)
        if kind is str:
            spent += len(child) + 2
        elif kind is dict or kind is list or isinstance(child, dict | list):
            _walk(child, depth + 1, budget, limits)
        else:
            spent += len(child) if isinstance(child, bytes) else 8
    budget[0] -= spent
    if budget[0] < 0:
        raise _TooBig(Problem("", "too_large", f"larger than {limits.max_object_bytes} "
                              "bytes once expanded (--max-object-bytes; YAML aliases "
                              "count each time they are used)"))


def _DEEP(max_depth: int) -> Problem:  # noqa: N802 - reads as the constant problem it is
    return Problem("", "too_deep", f"nested deeper than {max_depth} levels "
                   "(--max-object-depth)")


# ---- primitive checks ---------------------------------------------------------------
class _Checker:
    """Accumulates problems while reading an object's fields with their types checked."""

    def __init__(self, limits: ObjectLimits) -> None:
        self.limits = limits
        self.v = Verdict()

    def err(self, where: str, reason: str, message: str) -> None:
        self.v.error(where, reason, message)

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.err(where, "malformed", f"must be a mapping, not {type(value).__name__}")
            return {}
        return value

    def items(self, value: Any, where: str, limit: int | None = None) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.err(where, "malformed", f"must be a list, not {type(value).__name__}")
            return []
        if limit is not None and len(value) > limit:
            self.err(where, "too_many", f"has {len(value)} items, at most {limit} allowed")
            return []
        return value

    def string(self, value: Any, where: str, required: bool = False) -> str:
        if value is None or value == "":
            if required:
                self.err(where, "malformed", "is required")
            return ""
        if not isinstance(value, str):
            self.err(where, "malformed", f"must be a string, not {_shown(value)}")
            return ""
        return value

    def boolean(self, value: Any, where: str) -> None:
        if value is not None and not isinstance(value, bool):
            self.err(where, "malformed", f"must be true or false, not {_shown(value)}")

    def name(self, value: Any, where: str, pattern: re.Pattern[str], limit: int,
             what: str) -> str:
        text = self.string(value, where, required=True)
        if not text:
            return ""
        limit = min(limit, self.limits.max_name_length)
        if len(text) > limit:
            self.err(where, "invalid_name", f"{_shown(text)} is longer than {limit} characters")
        elif not _matches(pattern, text):
            self.err(where, "invalid_name", f"{_shown(text)} is not a {what}")
        return text

    def label(self, value: Any, where: str) -> str:
        return self.name(value, where, DNS1123_LABEL, 63, "DNS-1123 label (lowercase "
                         "letters, digits and '-', starting and ending with a letter or digit)")

    def subdomain(self, value: Any, where: str) -> str:
        return self.name(value, where, DNS1123_SUBDOMAIN, 253, "DNS-1123 subdomain "
                         "(lowercase letters, digits, '-' and '.')")

    def port(self, value: Any, where: str, allow_zero: bool = False) -> int:
        if value is None and allow_zero:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(where, "invalid_port", f"{_shown(value)} is not a port number")
            return 0
        if not (0 if allow_zero else 1) <= value <= 65535:
            self.err(where, "invalid_port", f"{value} must be between "
                     f"{0 if allow_zero else 1} and 65535")
            return 0
        return value

    def protocol(self, value: Any, where: str) -> str:
        if value is None or value == "":
            return "TCP"
        if value not in PROTOCOLS:
            self.err(where, "invalid_protocol", f"{_shown(value)} is not TCP, UDP or SCTP")
            return ""
        return str(value)

    def enum(self, value: Any, where: str, allowed: tuple[str, ...]) -> str:
        if value is None or value == "":
            return ""
        if not isinstance(value, str) or value not in allowed:
            self.err(where, "invalid_value", f"{_shown(value)} is not one of "
                     f"{', '.join(allowed)}")
            return ""
        return value

    def ip(self, value: Any, where: str, forbid: str = "", family: int = 0) -> int:
        """The family of a valid IP (0 when refused); ``forbid``: "endpoint" refuses what
        Kubernetes refuses for endpoints and external IPs, "cluster" also what no service
        CIDR holds."""
        text = self.string(value, where, required=True)
        if not text:
            return 0
        v4 = _ipv4(text) if ":" not in text else None
        if v4 is not None:
            version = 4
            why = (_ipv4_problem(v4) or (_ipv4_cluster_problem(v4) if forbid == "cluster"
                                         else None)) if forbid else None
        else:
            addr = parse_ip(text)
            if addr is None:
                self.err(where, "invalid_ip", f"{_shown(text)} is not an IP address")
                return 0
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                self.err(where, "invalid_ip", f"{text} is an IPv4-mapped IPv6 address; write "
                         "the IPv4 address")
                return 0
            version = addr.version
            why = ({"endpoint": endpoint_ip_problem, "cluster": cluster_ip_problem}[forbid](addr)
                   if forbid else None)
        if family and version != family:
            self.err(where, "ip_family", f"{text} is not an IPv{family} address")
            return 0
        if why:
            self.err(where, "forbidden_ip", f"{text} {why}")
            return 0
        return version

    def meta_map(self, value: Any, where: str, values: re.Pattern[str] | None) -> dict[str, str]:
        """Labels (``values`` set) or annotations: qualified-name keys (an annotation's in
        any case), string values; annotations at most 256 KiB of UTF-8."""
        raw = self.mapping(value, where)
        size = 0
        for k, val in raw.items():
            if not isinstance(k, str) or not is_qualified_name(
                    k if values is not None else k.lower()):
                self.err(where, "invalid_name", f"key {_shown(k)} is not a qualified name")
                continue
            if not isinstance(val, str):
                self.err(f"{where}.{k}", "malformed", f"must be a string, not {_shown(val)}")
                continue
            size += _utf8_size(k) if values is None else 0
            if val.isascii():
                size += len(val)
            elif not _is_utf8(val):
                self.err(f"{where}.{k}", "malformed", "is not valid UTF-8 text")
                continue
            else:
                size += _utf8_size(val)
            if values is not None and (len(val) > 63 or not (val == "" or values.fullmatch(val))):
                self.err(f"{where}.{k}", "invalid_value", f"{_shown(val)} is not a valid "
                         "label value (at most 63 letters, digits, '-', '_' or '.')")
        if values is None and size > MAX_ANNOTATIONS_BYTES:
            self.err(where, "too_large", f"total size {size} exceeds {MAX_ANNOTATIONS_BYTES}")
        return raw

    def metadata(self, obj: dict[str, Any], name_check: Callable[[Any, str], str],
                 namespaced: bool) -> tuple[dict[str, str], dict[str, str]]:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            self.err("metadata", "malformed", "must be a mapping with a name"
                     if meta is not None else "is required")
            return {}, {}
        name_check(meta.get("name"), "metadata.name")
        if namespaced and meta.get("namespace") not in (None, ""):
            self.label(meta.get("namespace"), "metadata.namespace")
        labels = self.meta_map(meta.get("labels"), "metadata.labels", _QUALIFIED)
        annotations = self.meta_map(meta.get("annotations"), "metadata.annotations", None)
        return labels, annotations


_MATCHED: dict[tuple[int, str], bool] = {}


def _matches(pattern: re.Pattern[str], text: str) -> bool:
    """``pattern.fullmatch(text)``, remembered: node and port names repeat a lot."""
    key = (id(pattern), text)
    hit = _MATCHED.get(key)
    if hit is None:
        if len(_MATCHED) > 100_000:
            _MATCHED.clear()
        hit = _MATCHED[key] = pattern.fullmatch(text) is not None
    return hit


def _utf8_size(text: str) -> int:
    """The bytes of valid text in UTF-8 (Kubernetes' sizes are of bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_IPV4 = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})", re.ASCII)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# An IPv4 address in canonical form (no leading zeros): nearly every address there is.
CANONICAL_IPV4 = re.compile(rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}", re.ASCII)
# What ``_ipv4_problem`` refuses, as prefixes of canonical addresses (0.0.0.0 is one
# only of itself): loopback, link-local, link-local multicast.
_FORBIDDEN_IPV4 = ("0.0.0.0", "127.", "169.254.", "224.0.0.")
# A canonical IPv4 address Kubernetes allows for an endpoint: both tests in one match.
ALLOWED_IPV4 = re.compile(rf"(?!{'|'.join(map(re.escape, _FORBIDDEN_IPV4))})"
                          + CANONICAL_IPV4.pattern, re.ASCII)


def _ipv4(text: str) -> int | None:
    """An IPv4 address as an integer (octets may have leading zeros, as Kubernetes
    allows); None if ``text`` is not one."""
    m = _IPV4.fullmatch(text)
    if m is None:
        return None
    a, b, c, d = map(int, m.groups())
    if a > 255 or b > 255 or c > 255 or d > 255:
        return None
    return a << 24 | b << 16 | c << 8 | d


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP as Kubernetes parses it (IPv4 octets may have leading zeros, IPv6 has no zone
    index, which Python's ipaddress would read); None if invalid."""
    if ":" not in text:
        v4 = _ipv4(text)
        return None if v4 is None else ipaddress.IPv4Address(v4)
    if "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_qualified_name(text: str) -> bool:
    """A label or annotation key: [DNS-1123 subdomain prefix/]name of at most 63 characters."""
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED.fullmatch(name) is not None


def is_fqdn(value: Any) -> bool:
    """IsFullyQualifiedDomainName: a DNS-1123 subdomain of two labels or more (each at
    most 63 characters), at most 253 characters once a trailing dot is dropped."""
    if not isinstance(value, str):
        return False
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and "." in name and \
        DNS1123_SUBDOMAIN.fullmatch(name) is not None and \
        all(len(label) <= 63 for label in name.split("."))


def is_port_name(text: str) -> bool:
    """IANA_SVC_NAME: 1-15 of [-a-z0-9], a letter, no leading/trailing or double '-'."""
    return (0 < len(text) <= 15 and IANA_SVC_NAME.fullmatch(text) is not None
            and any("a" <= c <= "z" for c in text) and "--" not in text
            and text[0] != "-" and text[-1] != "-")


def endpoint_ip_problem(addr: Any) -> str | None:
    """Why Kubernetes refuses ``addr`` as an endpoint or external IP (ValidateEndpointIP)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.version == 4:
        return _ipv4_problem(int(addr))
    if addr.is_unspecified:
        return "may not be unspecified (0.0.0.0, ::)"
    if addr.is_loopback:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if addr.is_link_local:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    if addr.packed[0] == 0xFF and addr.packed[1] & 0x0F == 0x02:
        return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
    return None


def _ipv4_problem(n: int) -> str | None:
    if n == 0:
        return "may not be unspecified (0.0.0.0, ::)"
    if n >> 24 == 127:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if n >> 16 == 0xA9FE:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    if n >> 8 == 0xE00000:
        return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
    return None


def _ipv4_cluster_problem(n: int) -> str | None:
    if n >> 28 == 0xE:
        return "may not be a multicast address"
    if n == 0xFFFFFFFF:
        return "may not be the broadcast address"
    return None


def cluster_ip_problem(addr: Any) -> str | None:
    """Why an address can be in no service CIDR: the endpoint rules, multicast, broadcast."""
    why = endpoint_ip_problem(addr)
    if why:
        return why
    if addr.version == 4:
        return _ipv4_cluster_problem(int(addr))
    return "may not be a multicast address" if addr.is_multicast else None


def trigger_time_problem(value: Any) -> str | None:
    """Why a last-change-trigger-time annotation is unusable (then it is ignored)."""
    if not isinstance(value, str):
        return f"{_shown(value)} is not an RFC 3339 time"
    try:
        seconds = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return f"{_shown(value)} is not a usable RFC 3339 time"
    return None if seconds > 0 else f"{_shown(value)} is before 1970"


# ---- Service ------------------------------------------------------------------------
def validate_service(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Service as the apiserver validates the fields svcproxy reads."""
    c = _Checker(limits)
    if not _object(c, obj, limits):
        return c.v
    c.metadata(obj, lambda v, w: c.name(v, w, DNS1035_LABEL, 63, "DNS-1035 label (lowercase "
                                        "letters, digits and '-', starting with a letter)"),
               namespaced=True)
    spec = c.mapping(obj.get("spec"), "spec")
    stype = c.enum(spec.get("type"), "spec.type", SERVICE_TYPES) or "ClusterIP"
    headless = _cluster_ips(c, spec, stype)
    _service_ports(c, spec, stype, headless)
    for i, ip in enumerate(c.items(spec.get("externalIPs"), "spec.externalIPs")):
        c.ip(ip, f"spec.externalIPs[{i}]", "endpoint")
    _affinity(c, spec)
    c.enum(spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy", POLICIES)
    c.enum(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy", POLICIES)
    c.enum(spec.get("trafficDistribution"), "spec.trafficDistribution", TRAFFIC_DISTRIBUTIONS)
    c.port(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", allow_zero=True)
    for i, cidr in enumerate(c.items(spec.get("loadBalancerSourceRanges"),
                                     "spec.loadBalancerSourceRanges")):
        _cidrs(c, cidr, f"spec.loadBalancerSourceRanges[{i}]", allow_commas=True)
    if stype == "ExternalName":
        name = spec.get("externalName")
        if isinstance(name, str) and name.endswith("."):
            name = name[:-1]  # a CNAME: a trailing dot marks it fully qualified
        c.subdomain(name, "spec.externalName")
    _lb_status(c, obj.get("status"))
    return c.v


def _object(c: _Checker, obj: Any, limits: ObjectLimits,
            sized: tuple[str, int] | None = None) -> bool:
    if not isinstance(obj, dict):
        c.err("", "malformed", f"an object must be a mapping, not {type(obj).__name__}")
        return False
    too_big = check_size(obj, limits, sized)
    if too_big is not None:
        c.v.errors.append(too_big)
        return False
    return True


def _cluster_ips(c: _Checker, spec: dict[str, Any], stype: str) -> bool:
    """Checks clusterIP/clusterIPs; True for a headless service."""
    single = c.string(spec.get("clusterIP"), "spec.clusterIP")
    single_family = c.ip(single, "spec.clusterIP", "cluster") \
        if single and single != "None" else 0
    ips = c.items(spec.get("clusterIPs"), "spec.clusterIPs", limit=2)
    values = ips or ([single] if single else [])
    if values and values[0] == "None":
        if len(values) > 1:
            c.err("spec.clusterIPs", "invalid_value", "'None' must be the only value")
        if stype in ("NodePort", "LoadBalancer"):
            c.err("spec.clusterIP", "invalid_value", f"may not be 'None' for {stype} services")
        _ip_families(c, spec, [])
        return True
    families = [c.ip(ip, f"spec.clusterIPs[{i}]", "cluster") if ip != single
                else single_family for i, ip in enumerate(ips)]
    if len(families) == 2 and families[0] and families[0] == families[1]:
        c.err("spec.clusterIPs", "ip_family", "two cluster IPs must be of different families")
    if single and ips and ips[0] != single:
        c.err("spec.clusterIPs[0]", "invalid_value", f"{_shown(ips[0])} must be the same as "
              f"spec.clusterIP {_shown(single)}")
    if stype != "ExternalName":
        _ip_families(c, spec, families or [single_family])
    return False


def _ip_families(c: _Checker, spec: dict[str, Any], families: list[int]) -> None:
    """ipFamilies (IPv4, IPv6, no repeat), each the family of the cluster IP at its index
    in ``families`` (0: none to match), and ipFamilyPolicy (svcproxy reads neither: a
    cluster IP's family is its own)."""
    seen: set[str] = set()
    for i, name in enumerate(c.items(spec.get("ipFamilies"), "spec.ipFamilies")):
        where = f"spec.ipFamilies[{i}]"
        if name not in IP_FAMILIES:
            c.err(where, "invalid_value", f"{_shown(name)} is not one of IPv4, IPv6")
            continue
        if name in seen:
            c.err(where, "duplicate", f"{name} is listed twice")
        elif i < len(families) and families[i] and f"IPv{families[i]}" != name:
            c.err(f"spec.clusterIPs[{i}]", "ip_family", f"is not an {name} address as "
                  f"spec.ipFamilies[{i}] says")
        seen.add(name)
    c.enum(spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy", IP_FAMILY_POLICIES)


def _service_ports(c: _Checker, spec: dict[str, Any], stype: str, headless: bool) -> None:
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
                c.err(f"{where}.name", "duplicate", f"{_shown(name)} is used by another port")
            names.add(name)
        port = c.port(p.get("port"), f"{where}.port")
        proto = c.protocol(p.get("protocol"), f"{where}.protocol")
        if (port, proto) in seen and port:
            c.err(where, "duplicate", f"port {port}/{proto} is used by another port")
        seen.add((port, proto))
        _target_port(c, p.get("targetPort"), f"{where}.targetPort")
        if "appProtocol" in p:
            _app_protocol(c, p["appProtocol"], f"{where}.appProtocol")
        node_port = c.port(p.get("nodePort"), f"{where}.nodePort", allow_zero=True)
        if node_port and stype == "ClusterIP":
            c.err(f"{where}.nodePort", "invalid_value", "may not be used when type is ClusterIP")
        if node_port and (node_port, proto) in node_ports:
            c.err(f"{where}.nodePort", "duplicate", f"{node_port}/{proto} is used twice")
        node_ports.add((node_port, proto))


def _app_protocol(c: _Checker, value: Any, where: str) -> None:
    """A port's appProtocol: a qualified name when set (svcproxy does not read it)."""
    if value is not None and not is_app_protocol(value):
        c.err(where, "invalid_value", f"{_shown(value)} is not a qualified name")


_APP_PROTOCOLS: dict[str, bool] = {}


def is_app_protocol(value: Any) -> bool:
    """An appProtocol Kubernetes allows (a qualified name: http, kubernetes.io/h2c),
    remembered: a cluster uses a few."""
    if type(value) is not str or len(value) > 317:  # a qualified name's longest
        return False
    ok = _APP_PROTOCOLS.get(value)
    if ok is None:
        if len(_APP_PROTOCOLS) >= 1000:
            _APP_PROTOCOLS.clear()
        ok = _APP_PROTOCOLS[value] = is_qualified_name(value)
    return ok


def _target_port(c: _Checker, value: Any, where: str) -> None:
    if value is None or value == 0 or value == "":
        return
    if isinstance(value, str):
        if not is_port_name(value):
            c.err(where, "invalid_port", f"{_shown(value)} is neither a port number nor a "
                  "port name (IANA_SVC_NAME: at most 15 lowercase letters, digits and '-', "
                  "with a letter)")
        return
    c.port(value, where)


def _affinity(c: _Checker, spec: dict[str, Any]) -> None:
    affinity = c.enum(spec.get("sessionAffinity"), "spec.sessionAffinity", AFFINITIES)
    cfg = c.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client = c.mapping(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = client.get("timeoutSeconds")
    if affinity == "ClientIP" and timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int)
            or not 0 < timeout <= 86400):
        c.err("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "invalid_value",
              f"{_shown(timeout)} must be between 1 and 86400")


def _cidrs(c: _Checker, value: Any, where: str, allow_commas: bool = False) -> list[int]:
    """Checks a CIDR (or comma-separated CIDRs); the family of each valid one."""
    text = c.string(value, where, required=True)
    families = []
    for part in text.split(",") if allow_commas else [text]:
        part = part.strip()
        if not part and allow_commas:
            continue
        addr, slash, length = part.partition("/")
        ip = parse_ip(addr)
        bits = length.lstrip("0")  # leading zeros are allowed, a 5,000-digit int() raises
        ok = ip is not None and slash and length.isdigit() and length.isascii() and \
            len(bits) <= 3 and int(bits or "0") <= (32 if ip.version == 4 else 128)
        if ok and isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            c.err(where, "invalid_ip", f"{_shown(part)} is an IPv4-mapped IPv6 CIDR; write "
                  "the IPv4 CIDR")  # Go reads an IPv4 range there, ipaddress an IPv6 one
        elif ok:
            families.append(ip.version)  # type: ignore[union-attr]
        elif text:
            c.err(where, "invalid_ip", f"{_shown(part)} is not a CIDR")
    return families


def _lb_status(c: _Checker, status: Any) -> None:
    lb = c.mapping(c.mapping(status, "status").get("loadBalancer"), "status.loadBalancer")
    for i, raw in enumerate(c.items(lb.get("ingress"), "status.loadBalancer.ingress")):
        where = f"status.loadBalancer.ingress[{i}]"
        ing = c.mapping(raw, where)
        if ing.get("ip") not in (None, ""):
            c.ip(ing.get("ip"), f"{where}.ip")
            c.enum(ing.get("ipMode"), f"{where}.ipMode", IP_MODES)


# ---- EndpointSlice ------------------------------------------------------------------
def validate_endpoint_slice(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """An EndpointSlice as the apiserver validates it, plus the service-name label."""
    c = _Checker(limits)
    plain = _plain_endpoints(obj, limits)
    if not _object(c, obj, limits, None if plain is None else ("endpoints", plain)):
        return c.v
    labels, annotations = c.metadata(obj, c.subdomain, namespaced=True)
    if not labels.get(SERVICE_NAME_LABEL):
        c.err(f"metadata.labels.{SERVICE_NAME_LABEL}", "malformed",
              "is missing: the slice belongs to no service")
    if TRIGGER_TIME_ANNOTATION in annotations:
        why = trigger_time_problem(annotations[TRIGGER_TIME_ANNOTATION])
        if why:
            c.v.warnings.append(Problem(f"metadata.annotations.{TRIGGER_TIME_ANNOTATION}",
                                        "ignored_value", f"{why}; ignored"))
    address_type = obj.get("addressType")
    if address_type not in ADDRESS_TYPES:
        c.err("addressType", "invalid_value", f"{_shown(address_type)} is not IPv4, IPv6 or FQDN")
    names: set[str] = set()
    for i, raw in enumerate(c.items(obj.get("ports"), "ports", MAX_SLICE_PORTS)):
        where = f"ports[{i}]"
        p = c.mapping(raw, where)
        name = c.string(p.get("name"), f"{where}.name")
        if name:
            c.label(name, f"{where}.name")
        if name in names:
            c.err(f"{where}.name", "duplicate", f"{_shown(name)} is used by another port")
        names.add(name)
        c.protocol(p.get("protocol"), f"{where}.protocol")
        if p.get("port") is not None:
            c.port(p.get("port"), f"{where}.port")
        if "appProtocol" in p:
            _app_protocol(c, p["appProtocol"], f"{where}.appProtocol")
    if plain is not None:
        return c.v
    kind = address_type if address_type in ADDRESS_TYPES else ""
    node_limit = min(253, limits.max_name_length)
    for i, raw in enumerate(c.items(obj.get("endpoints"), "endpoints", MAX_SLICE_ENDPOINTS)):
        if kind != "IPv4" or not _plain_ipv4_endpoint(raw, node_limit):
            _endpoint(c, c.mapping(raw, f"endpoints[{i}]"), f"endpoints[{i}]", kind)
    return c.v


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
            or ep.get("hostname") not in (None, ""):
        return 0
    addresses = ep.get("addresses")
    if type(addresses) is not list or not 0 < len(addresses) <= MAX_ENDPOINT_ADDRESSES:
        return 0
    for address in addresses:
        if type(address) is not str or not ALLOWED_IPV4.fullmatch(address):
            return 0
    cond = ep.get("conditions")
    if cond is not None:
        if type(cond) is not dict or not cond.keys() <= _CONDITION_KEYS:
            return 0
        for value in cond.values():
            if value is not None and value is not True and value is not False:
                return 0
    node = ep.get("nodeName")
    if node not in (None, "") and not (type(node) is str and len(node) <= node_limit
                                       and _matches(DNS1123_SUBDOMAIN, node)):
        return 0
    zone = ep.get("zone")
    if zone not in (None, "") and not (type(zone) is str and len(zone) <= 63
                                       and _matches(_QUALIFIED, zone)):
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


def _endpoint(c: _Checker, ep: dict[str, Any], where: str, address_type: str) -> None:
    addresses = c.items(ep.get("addresses"), f"{where}.addresses", MAX_ENDPOINT_ADDRESSES)
    if not addresses and isinstance(ep.get("addresses"), list | None):
        c.err(f"{where}.addresses", "malformed", "must hold at least one address")
    for j, address in enumerate(addresses):
        if address_type in ("IPv4", "IPv6"):
            c.ip(address, f"{where}.addresses[{j}]", "endpoint", int(address_type[-1]))
        elif address_type == "FQDN" and not is_fqdn(address):
            c.err(f"{where}.addresses[{j}]", "invalid_name", f"{_shown(address)} is not a "
                  "fully qualified domain name (two or more DNS-1123 labels, at most 253 "
                  "characters, a trailing dot allowed)")
    cond = c.mapping(ep.get("conditions"), f"{where}.conditions")
    for key in ("ready", "serving", "terminating"):
        c.boolean(cond.get(key), f"{where}.conditions.{key}")
    if ep.get("nodeName") not in (None, ""):
        c.subdomain(ep.get("nodeName"), f"{where}.nodeName")
    if ep.get("hostname") not in (None, ""):
        c.label(ep.get("hostname"), f"{where}.hostname")
    zone = c.string(ep.get("zone"), f"{where}.zone")
    if zone and (len(zone) > 63 or not _matches(_QUALIFIED, zone)):
        c.err(f"{where}.zone", "invalid_value", f"{_shown(zone)} is not a valid label value")
    if ep.get("hints") is None:
        return
    hints = c.mapping(ep.get("hints"), f"{where}.hints")
    for key, check in (("forZones", _hint_zone), ("forNodes", _hint_node)):
        seen: set[str] = set()
        for k, hint in enumerate(c.items(hints.get(key), f"{where}.hints.{key}", MAX_ZONE_HINTS)):
            spot = f"{where}.hints.{key}[{k}].name"
            name = check(c, c.mapping(hint, spot).get("name"), spot)
            if name and name in seen:
                c.err(spot, "duplicate", f"{_shown(name)} is listed twice")
            seen.add(name)


def _hint_zone(c: _Checker, value: Any, where: str) -> str:
    name = c.string(value, where, required=True)
    if name and (len(name) > 63 or not _QUALIFIED.fullmatch(name)):
        c.err(where, "invalid_value", f"{_shown(name)} is not a valid label value")
    return name


def _hint_node(c: _Checker, value: Any, where: str) -> str:
    return c.subdomain(value, where)


# ---- Node ---------------------------------------------------------------------------
def validate_node(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """A Node's fields svcproxy reads, with the apiserver's rules."""
    c = _Checker(limits)
    if not _object(c, obj, limits):
        return c.v
    c.metadata(obj, c.subdomain, namespaced=False)
    spec = c.mapping(obj.get("spec"), "spec")
    cidrs = c.items(spec.get("podCIDRs"), "spec.podCIDRs", limit=2)
    families = [f for i, cidr in enumerate(cidrs) for f in _cidrs(c, cidr, f"spec.podCIDRs[{i}]")]
    if len(families) == 2 and families[0] == families[1]:
        c.err("spec.podCIDRs", "ip_family", "may hold one CIDR of each IP family")
    if spec.get("podCIDR") not in (None, ""):
        _cidrs(c, spec.get("podCIDR"), "spec.podCIDR")
    _taints(c, spec.get("taints"))
    status = c.mapping(obj.get("status"), "status")
    for i, raw in enumerate(c.items(status.get("addresses"), "status.addresses")):
        where = f"status.addresses[{i}]"
        addr = c.mapping(raw, where)
        kind = c.string(addr.get("type"), f"{where}.type")
        text = addr.get("address")
        if not isinstance(text, str):
            c.err(f"{where}.address", "malformed", "must be a string")
        elif kind and kind not in NODE_ADDRESS_TYPES:  # Kubernetes validates no status
            c.v.warnings.append(Problem(f"{where}.type", "ignored_value", f"{_shown(kind)} "
                                        "is not a node address type; ignored"))
        elif kind in ("InternalIP", "ExternalIP") and parse_ip(text) is None:
            c.v.warnings.append(Problem(f"{where}.address", "ignored_value",
                                        f"{_shown(text)} is not an IP address; ignored"))
    return c.v


def _taints(c: _Checker, value: Any) -> None:
    """validateNodeTaints: a qualified-name key, a label value, an effect, each key and
    effect once (svcproxy reads the keys only)."""
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(c.items(value, "spec.taints")):
        where = f"spec.taints[{i}]"
        taint = c.mapping(raw, where)
        key = c.string(taint.get("key"), f"{where}.key", required=True)
        if key and not is_qualified_name(key):
            c.err(f"{where}.key", "invalid_name", f"{_shown(key)} is not a qualified name")
        text = c.string(taint.get("value"), f"{where}.value")
        if text and (len(text) > 63 or not _QUALIFIED.fullmatch(text)):
            c.err(f"{where}.value", "invalid_value", f"{_shown(text)} is not a label value")
        effect = taint.get("effect")
        if effect not in TAINT_EFFECTS:
            c.err(f"{where}.effect", "invalid_value", f"{_shown(effect)} is not one of "
                  f"{', '.join(TAINT_EFFECTS)}")
        elif (key, effect) in seen:
            c.err(where, "duplicate", f"{_shown(key)} {effect} is listed twice")
        else:
            seen.add((key, effect))


VALIDATORS: dict[str, Callable[[Any, ObjectLimits], Verdict]] = {
    "Service": validate_service, "EndpointSlice": validate_endpoint_slice,
    "Node": validate_node,
}


def validate(kind: str, obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """The verdict on one object of a kind svcproxy reads."""
    return VALIDATORS[kind](obj, limits)


def object_key(kind: str, obj: Any) -> tuple[str, str]:
    """(namespace, name) of any object, whatever it holds ("" where absent or not text)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ("", "")
    name = meta.get("name")
    ns = meta.get("namespace")
    if kind == "Node":
        ns = ""
    elif not isinstance(ns, str) or not ns:
        ns = "default"
    return (ns, name if isinstance(name, str) else "")

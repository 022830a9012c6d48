"""Reading an object's fields with their types checked, accumulating the problems
found (a ``Checker`` per object, shared by every kind's validator)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from svcproxy.frontend.edge.addresses import (
    cidr_family,
    cluster_ip_problem,
    endpoint_ip_problem,
    ipv4_cluster_problem,
    ipv4_problem,
)
from svcproxy.frontend.edge.limits import ObjectLimits, check_size
from svcproxy.frontend.edge.names import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    QUALIFIED,
    is_app_protocol,
    is_qualified_name,
    matches,
)
from svcproxy.frontend.edge.verdict import Verdict, shown
from svcproxy.model import parse_ip, parse_ipv4
from svcproxy.wirevalues import REPLACE

MAX_ANNOTATIONS_BYTES = 256 * 1024
PROTOCOLS = ("TCP", "UDP", "SCTP")


class Checker:
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
            self.err(where, "malformed", f"must be a string, not {shown(value)}")
            return ""
        return value

    def boolean(self, value: Any, where: str) -> None:
        if value is not None and not isinstance(value, bool):
            self.err(where, "malformed", f"must be true or false, not {shown(value)}")

    def name(self, value: Any, where: str, pattern: re.Pattern[str], limit: int,
             what: str) -> str:
        text = self.string(value, where, required=True)
        if not text:
            return ""
        limit = min(limit, self.limits.max_name_length)
        if len(text) > limit:
            self.err(where, "invalid_name", f"{shown(text)} is longer than {limit} characters")
        elif not matches(pattern, text):
            self.err(where, "invalid_name", f"{shown(text)} is not a {what}")
        return text

    def label(self, value: Any, where: str) -> str:
        """ValidateDNS1123Label (IsDNS1123Label)."""
        return self.name(value, where, DNS1123_LABEL, 63, "DNS-1123 label (lowercase "
                         "letters, digits and '-', starting and ending with a letter or digit)")

    def subdomain(self, value: Any, where: str) -> str:
        """NameIsDNSSubdomain / ValidateNodeName (IsDNS1123Subdomain)."""
        return self.name(value, where, DNS1123_SUBDOMAIN, 253, "DNS-1123 subdomain "
                         "(lowercase letters, digits, '-' and '.')")

    def port(self, value: Any, where: str, allow_zero: bool = False) -> int:
        """IsValidPortNum (``allow_zero``: 0 means none, as for nodePort)."""
        if value is None and allow_zero:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(where, "invalid_port", f"{shown(value)} is not a port number")
            return 0
        if not (0 if allow_zero else 1) <= value <= 65535:
            self.err(where, "invalid_port", f"{value} must be between "
                     f"{0 if allow_zero else 1} and 65535")
            return 0
        return value

    def protocol(self, value: Any, where: str) -> str:
        """supportedPortProtocols; unset or "" is TCP (SetDefaults_ServicePort)."""
        if value is None or value == "":
            return "TCP"
        if value not in PROTOCOLS:
            self.err(where, "invalid_protocol", f"{shown(value)} is not TCP, UDP or SCTP")
            return ""
        return str(value)

    def enum(self, value: Any, where: str, allowed: tuple[str, ...]) -> str:
        if value is None or value == "":
            return ""
        if not isinstance(value, str) or value not in allowed:
            self.err(where, "invalid_value", f"{shown(value)} is not one of "
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
        v4 = parse_ipv4(text) if ":" not in text else None
        if v4 is not None:
            version = 4
            why = (ipv4_problem(v4) or (ipv4_cluster_problem(v4) if forbid == "cluster"
                                         else None)) if forbid else None
        else:
            addr = parse_ip(text)
            if addr is None:
                self.err(where, "invalid_ip", f"{shown(text)} is not an IP address")
                return 0
            # An IPv4-mapped IPv6 address is an IPv4 one to Go (To4() != nil), so to
            # IsValidIPv4Address and the family checks; it is read as its IPv4 address.
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
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
        """Labels (``values`` set: ValidateLabels) or annotations (ValidateAnnotations):
        qualified-name keys (an annotation's in any case), string values; annotations at
        most 256 KiB (TotalAnnotationSizeLimitB) of UTF-8."""
        raw = self.mapping(value, where)
        size = 0
        for k, val in raw.items():
            if not isinstance(k, str) or not is_qualified_name(
                    k if values is not None else k.lower()):
                self.err(where, "invalid_name", f"key {shown(k)} is not a qualified name")
                continue
            if not isinstance(val, str):
                self.err(f"{where}.{k}", "malformed", f"must be a string, not {shown(val)}")
                continue
            size += _utf8_size(k) if values is None else 0
            if val.isascii():
                size += len(val)
            elif not _is_utf8(val):
                if values is not None:  # its U+FFFD would be no label value either
                    self.err(f"{where}.{k}", "malformed", "is not valid UTF-8 text")
                    continue
                # Go's JSON decoder stores U+FFFD for a lone surrogate: the annotation is
                # kept (counted at that size); the wire writes it the same way.
                size += len(val.encode("utf-8", REPLACE))
            else:
                size += _utf8_size(val)
            if values is not None and (len(val) > 63 or not (val == "" or values.fullmatch(val))):
                self.err(f"{where}.{k}", "invalid_value", f"{shown(val)} is not a valid "
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
        labels = self.meta_map(meta.get("labels"), "metadata.labels", QUALIFIED)
        annotations = self.meta_map(meta.get("annotations"), "metadata.annotations", None)
        return labels, annotations


def _utf8_size(text: str) -> int:
    """The bytes of valid text in UTF-8 (Kubernetes' sizes are of bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_object(c: Checker, obj: Any, limits: ObjectLimits,
                 sized: tuple[str, int] | None = None) -> bool:
    """Whether ``obj`` is a mapping within ``limits`` (else ``c`` says why)."""
    if not isinstance(obj, dict):
        c.err("", "malformed", f"an object must be a mapping, not {type(obj).__name__}")
        return False
    too_big = check_size(obj, limits, sized)
    if too_big is not None:
        c.v.errors.append(too_big)
        return False
    return True


def check_app_protocol(c: Checker, value: Any, where: str) -> None:
    """A port's appProtocol: a qualified name when set, null is unset (a *string):
    ValidateQualifiedName in ValidateServicePort and discovery's validatePorts (svcproxy
    does not read it)."""
    if value is not None and not is_app_protocol(value):
        c.err(where, "invalid_value", f"{shown(value)} is not a qualified name")


def check_cidrs(c: Checker, value: Any, where: str, trimmed: bool = False) -> list[int]:
    """Checks a CIDR as ValidateCIDR (netutils.ParseCIDRSloppy) does, no space allowed
    (``trimmed``: spaces around it are dropped first, as GetLoadBalancerSourceRanges
    drops them); its family as Go reads it (``cidr_family``), as a list of none or one."""
    text = c.string(value, where, required=True)
    cidr = text.strip() if trimmed else text
    family = cidr_family(cidr)
    if text and not family:
        c.err(where, "invalid_ip", f"{shown(cidr)} is not a CIDR")
    return [family] if family else []

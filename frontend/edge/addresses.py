"""CIDRs as Kubernetes parses them (an IP: ``svcproxy.model.parse_ip``), and the addresses
it forbids."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from svcproxy.model import normalize_cidr, parse_ip

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# An IPv4 address in canonical form (no leading zeros): nearly every address there is.
CANONICAL_IPV4 = re.compile(rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}", re.ASCII)
# What ``ipv4_problem`` refuses, as prefixes of canonical addresses (0.0.0.0 is one
# only of itself): loopback, link-local, link-local multicast.
FORBIDDEN_IPV4 = ("0.0.0.0", "127.", "169.254.", "224.0.0.")
# A canonical IPv4 address Kubernetes allows for an endpoint: both tests in one match.
ALLOWED_IPV4 = re.compile(rf"(?!{'|'.join(map(re.escape, FORBIDDEN_IPV4))})"
                          + CANONICAL_IPV4.pattern, re.ASCII)


def cidr_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a CIDR as Kubernetes parses it (its prefix length may have leading
    zeros); None if ``text`` is not a CIDR."""
    addr, slash, length = text.partition("/")
    ip = parse_ip(addr)
    bits = length.lstrip("0")  # leading zeros are allowed, a 5,000-digit int() raises
    ok = ip is not None and slash and length.isdigit() and length.isascii() and \
        len(bits) <= 3 and int(bits or "0") <= (32 if ip.version == 4 else 128)
    return ip if ok else None


def cidr_family(text: str) -> int:
    """The family of a CIDR as Go reads it (0 if ``text`` is not one): an IPv4-mapped
    address with a length of 96 or more is an IPv4 range to Go (its network keeps the
    mapping, To4() != nil), a shorter one an IPv6 range (the mapping is masked away)."""
    ip = cidr_address(text)
    if ip is None:
        return 0
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return 4 if int(text.rpartition("/")[2].lstrip("0") or "0") >= 96 else 6
    return ip.version


def kube_cidr(text: str) -> str | None:
    """A CIDR's canonical form as Go reads it: ``normalize_cidr``'s, but an IPv4-mapped
    range of length 96 or more is the IPv4 range it maps (::ffff:10.0.0.0/104 is
    10.0.0.0/8, which is what Kubernetes and kube-proxy match); None if not a CIDR."""
    cidr = normalize_cidr(text)
    if cidr is None or not cidr.startswith("::ffff:"):
        return cidr
    net = ipaddress.IPv6Network(cidr)
    mapped = net.network_address.ipv4_mapped
    if mapped is None or net.prefixlen < 96:
        return cidr
    return f"{mapped}/{net.prefixlen - 96}"


def endpoint_ip_problem(addr: Any) -> str | None:
    """Why Kubernetes refuses ``addr`` as an endpoint or external IP (ValidateEndpointIP)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.version == 4:
        return ipv4_problem(int(addr))
    if addr.is_unspecified:
        return "may not be unspecified (0.0.0.0, ::)"
    if addr.is_loopback:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if addr.is_link_local:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    if addr.packed[0] == 0xFF and addr.packed[1] & 0x0F == 0x02:
        return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
    return None


def ipv4_problem(n: int) -> str | None:
    if n == 0:
        return "may not be unspecified (0.0.0.0, ::)"
    if n >> 24 == 127:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if n >> 16 == 0xA9FE:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    if n >> 8 == 0xE00000:
        return "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)"
    return None


def ipv4_cluster_problem(n: int) -> str | None:
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
        return ipv4_cluster_problem(int(addr))
    return "may not be a multicast address" if addr.is_multicast else None

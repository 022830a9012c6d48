"""The node's own IP addresses: read with rtnetlink, ordered primary first per family."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from svcproxy.model import of_family

_GLOBAL_SCOPE = 0
_IFA_F_DEPRECATED = 0x20
_IFA_F_TENTATIVE = 0x40


@dataclass(frozen=True, slots=True)
class InterfaceAddress:
    family: int  # 4 or 6
    ifindex: int
    address: str
    scope: int = _GLOBAL_SCOPE
    flags: int = 0


@dataclass(frozen=True, slots=True)
class DefaultRoute:
    family: int  # 4 or 6
    ifindex: int
    prefsrc: str = ""
    metric: int = 0


def order_node_ips(
    addresses: Iterable[InterfaceAddress], routes: Iterable[DefaultRoute]
) -> tuple[str, ...]:
    """Global, usable addresses; per family (IPv4 first) the default route's source first."""
    usable = [
        a
        for a in addresses
        if a.scope == _GLOBAL_SCOPE and not a.flags & (_IFA_F_DEPRECATED | _IFA_F_TENTATIVE)
    ]
    result: list[str] = []
    for family in (4, 6):
        candidates = [a for a in usable if a.family == family]
        ordered = [a.address for a in candidates]
        primary = _primary(candidates, [r for r in routes if r.family == family])
        if primary in ordered:
            ordered.remove(primary)
            ordered.insert(0, primary)
        result.extend(a for a in ordered if a not in result)
    return tuple(result)


def _primary(candidates: Sequence[InterfaceAddress], routes: Sequence[DefaultRoute]) -> str:
    """The source address the best default route would use, or "" if there is none."""
    for route in sorted(routes, key=lambda r: r.metric):
        if route.prefsrc:
            return route.prefsrc
        for a in candidates:
            if a.ifindex == route.ifindex:
                return a.address
    return candidates[0].address if candidates else ""


def discover_node_ips() -> tuple[str, ...]:
    """The node's IPs in the current network namespace, primary first per family."""
    from svcproxy.sdk import rtnetlink

    families: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 6}
    addresses = [InterfaceAddress(family=families[a.family], ifindex=a.index,
                                  address=a.address, scope=a.scope, flags=a.flags)
                 for a in rtnetlink.addresses()]
    routes = [DefaultRoute(family=families[family], ifindex=r.oif, prefsrc=r.prefsrc,
                           metric=r.priority)
              for family in families for r in rtnetlink.default_routes(family)]
    return order_node_ips(addresses, routes)


def primary_node_ips(node_ips: Sequence[str]) -> tuple[str, ...]:
    """The first node IP of each family."""
    return tuple(ips[0] for ips in (of_family(node_ips, 4), of_family(node_ips, 6)) if ips)


def node_port_ips(node_port_addresses: Sequence[str], node_ips: Sequence[str]) -> tuple[str, ...]:
    """The node IPs that --node-port-addresses selects; () means every address."""
    if not node_port_addresses or any(c in ("0.0.0.0/0", "::/0") for c in node_port_addresses):
        return ()
    if tuple(node_port_addresses) == ("primary",):
        return primary_node_ips(node_ips)
    networks = [ipaddress.ip_network(c, strict=False) for c in node_port_addresses]
    return tuple(
        ip for ip in node_ips if any(ipaddress.ip_address(ip) in net for net in networks)
    )

"""The node context: the node-side facts every backend needs, resolved once, one answer.

``resolve_context`` turns the node-agent flags (``NodeConfig``), the node's Node object
and the addresses on its interfaces into a ``NodeContext``: per IP family, the node IPs
(primary first), the addresses NodePorts answer on (and which are loopback), how to
tell pod traffic from other traffic (``--detect-local-mode``) and the service CIDRs;
for the node, the addresses health-check node ports listen on. Pure: the same inputs
give every backend the same answer. kube-proxy's rules, where they are subtle:

* ``--node-port-addresses`` CIDRs select the node's addresses inside them, loopback
  included when a CIDR holds it; a family with no CIDR, or a zero CIDR (``0.0.0.0/0``),
  means every address of that family (``node_port_ips`` is None); ``primary`` means the
  family's primary node IP. Unset, it means every address, except for a backend that
  asks ``node_port_default="primary"`` (kube-proxy's nftables mode does).
* A backend that cannot serve NodePorts on loopback (nftables, IPVS) uses
  ``node_port_ips_routable`` and never programs 127.0.0.1 or ::1.
* A backend that must name every NodePort address (IPVS: one virtual server each)
  uses ``node_port_ips_listed``: "every address" is then the node IPs and every address
  on the node's interfaces (``local_ips``: loopback and link-local ones aside, so that
  a pod's veth coming and going does not change the context).

For the node as a whole, from the kube-proxy mode the backend declares (``ProxyMode``,
its ``proxy_mode``): the IP families the node's kernel has (``ip_families``), how to
invoke iptables (``iptables``: the node's iptables-nft or iptables-legacy, for the modes
that use iptables), whether NodePorts answer on 127.0.0.1 (``localhost_nodeports``) and
the sysctls kube-proxy sets for the mode (``sysctls``; the node agent sets them before
the first sync, so a backend never writes /proc/sys).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from svcproxy.model import NodeInfo, normalize_ip, of_family
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.sysctls import mode_sysctls

__all__ = ["IPTABLES_MODES", "FamilyContext", "LocalTraffic", "NodeContext", "ProxyMode",
           "interface_addresses", "resolve_context"]

FAMILIES = (4, 6)
LOOPBACK = {4: "127.0.0.1", 6: "::1"}
IPTABLES_MODES = ("nft", "legacy")


@dataclass(frozen=True, slots=True)
class ProxyMode:
    """The kube-proxy mode a backend implements, with its settings that reach the node.

    A backend declares it as ``proxy_mode``; the node agent resolves from it the node
    context's ``sysctls``, ``iptables`` and ``localhost_nodeports``.
    """

    name: str  # kube-proxy's --proxy-mode: iptables | ipvs | nftables
    # iptables: NodePorts answer on 127.0.0.1 too (route_localnet=1), when the NodePort
    # addresses include it (--iptables-localhost-nodeports)
    localhost_nodeports: bool = False
    # ipvs: do not answer ARP for the service addresses on kube-ipvs0 (--ipvs-strict-arp)
    strict_arp: bool = False
    # which iptables to invoke: auto (the one the node already uses) | nft | legacy
    iptables: str = "auto"

    @property
    def uses_iptables(self) -> bool:
        """The mode programs iptables (IPVS: its fixed rules beside the virtual servers)."""
        return self.name in ("iptables", "ipvs")


@dataclass(frozen=True, slots=True)
class LocalTraffic:
    """How to tell traffic from pods (not masqueraded) in one family (--detect-local-mode).

    ClusterCIDR and NodeCIDR match the source address against ``cidrs``;
    InterfaceNamePrefix matches the incoming interface's name by prefix ``interface``,
    BridgeInterface by the name ``interface``. Not ``detectable``: treat every packet
    as non-local (masquerade where kube-proxy would for non-local traffic).
    """

    mode: str
    cidrs: tuple[str, ...] = ()
    interface: str = ""

    @property
    def detectable(self) -> bool:
        return bool(self.cidrs or self.interface)

    @property
    def by_interface_prefix(self) -> bool:
        return self.mode == "InterfaceNamePrefix" and bool(self.interface)


@dataclass(frozen=True, slots=True)
class FamilyContext:
    """The node-side facts of one IP family (4 or 6)."""

    family: int
    node_ips: tuple[str, ...] = ()
    # None: every local address of the family (kube-proxy's "match all").
    node_port_ips: tuple[str, ...] | None = None
    local_traffic: LocalTraffic = LocalTraffic("ClusterCIDR")
    service_cidrs: tuple[str, ...] = ()
    # Every address of the family on the node's interfaces, loopback, link-local and
    # IPVS's kube-ipvs0 ones aside, as the node agent found them.
    local_ips: tuple[str, ...] = ()

    @property
    def primary_ip(self) -> str:
        """The family's primary node IP, or "" when the node has none."""
        return self.node_ips[0] if self.node_ips else ""

    @property
    def node_port_loopback(self) -> bool:
        """Whether NodePorts are meant to answer on loopback (127.0.0.1 / ::1)."""
        ips = self.node_port_ips
        return ips is None or any(ipaddress.ip_address(ip).is_loopback for ip in ips)

    @property
    def node_port_ips_routable(self) -> tuple[str, ...] | None:
        """``node_port_ips`` without loopback addresses (None still means every address)."""
        ips = self.node_port_ips
        if ips is None:
            return None
        return tuple(ip for ip in ips if not ipaddress.ip_address(ip).is_loopback)

    @property
    def node_port_ips_listed(self) -> tuple[str, ...]:
        """Every address NodePorts answer on, named (loopback never): for "every address",
        the node IPs and ``local_ips``."""
        routable = self.node_port_ips_routable
        if routable is not None:
            return routable
        every = dict.fromkeys((*self.node_ips, *self.local_ips))
        return tuple(ip for ip in every if not ipaddress.ip_address(ip).is_loopback)


@dataclass(frozen=True, slots=True)
class NodeContext:
    """Everything node-side a backend programs from, besides the services."""

    node_name: str
    families: tuple[FamilyContext, ...]
    masquerade_all: bool = False
    # Where health-check node ports listen; () means every address.
    health_check_ips: tuple[str, ...] = ()
    # The IP families the node's kernel has (4, and 6 unless IPv6 is off): the ones to program.
    ip_families: tuple[int, ...] = FAMILIES
    # How to invoke iptables: "nft" (iptables-nft...) or "legacy"; "" for a mode without.
    iptables: str = ""
    # NodePorts answer on 127.0.0.1 (kube-proxy's iptables mode, with route_localnet=1).
    localhost_nodeports: bool = False
    # /proc/sys names (slashes) and values kube-proxy sets for the mode; the node agent
    # sets them before the first sync.
    sysctls: tuple[tuple[str, str], ...] = ()

    def family(self, family: int) -> FamilyContext:
        """The context of family 4 or 6."""
        for ctx in self.families:
            if ctx.family == family:
                return ctx
        raise KeyError(f"no IPv{family} context")


def _local_traffic(config: NodeConfig, node: NodeInfo | None, family: int) -> LocalTraffic:
    mode = config.detect_local_mode
    if mode == "InterfaceNamePrefix":
        return LocalTraffic(mode, interface=config.pod_interface_name_prefix)
    if mode == "BridgeInterface":
        return LocalTraffic(mode, interface=config.pod_bridge_interface)
    if mode == "NodeCIDR":
        return LocalTraffic(mode, tuple(of_family(node.pod_cidrs if node else (), family)))
    return LocalTraffic(mode, tuple(of_family(config.cluster_cidrs, family)))


def _node_port_ips(setting: Sequence[str], family: int, node_ips: Sequence[str],
                   local_addresses: Sequence[str],
                   default: Literal["all", "primary"]) -> tuple[str, ...] | None:
    if not setting:
        setting = ("primary",) if default == "primary" else ()
    if tuple(setting) == ("primary",):
        return tuple(node_ips[:1])
    networks = [ipaddress.ip_network(c, strict=False) for c in of_family(setting, family)]
    if not networks or any(n.prefixlen == 0 for n in networks):
        return None
    candidates = dict.fromkeys([*node_ips, *of_family(local_addresses, family),
                                LOOPBACK[family]])
    return tuple(ip for ip in candidates
                 if any(ipaddress.ip_address(ip) in n for n in networks))


def interface_addresses(exclude: Sequence[str] = ()) -> tuple[str, ...]:
    """Every address on this network namespace's interfaces (loopback included), except
    those on the interfaces named in ``exclude`` (IPVS's dummy kube-ipvs0 holds service
    IPs, not node addresses)."""
    from svcproxy.sdk import rtnetlink

    skip = {rtnetlink.interface_index(name) for name in exclude}
    return tuple(dict.fromkeys(a.address for a in rtnetlink.addresses() if a.index not in skip))


def resolve_context(config: NodeConfig, node: NodeInfo | None,
                    local_addresses: Sequence[str] = (), *,
                    node_port_default: Literal["all", "primary"] = "all",
                    mode: ProxyMode | None = None, ip_families: Sequence[int] = FAMILIES,
                    iptables: str = "") -> NodeContext:
    """The node context from the flags, the Node object and the interfaces' addresses.

    Node IPs are the configured or discovered ones (``config.node_ips``), else the Node
    object's addresses. ``local_addresses`` are every address on the node's interfaces
    (loopback is always assumed present); NodePort CIDRs select among them.
    ``ip_families`` are the families the node's kernel has; ``iptables`` the iptables
    the node already uses (found by the agent when ``mode`` asks for "auto"; "nft" on
    an empty node).
    """
    # The Node's addresses come from the frontend: only well-formed ones are node IPs.
    node_ips = tuple(config.node_ips) or tuple(
        ip for a in (node.addresses if node else ()) if (ip := normalize_ip(a)) is not None)
    families = []
    for family in FAMILIES:
        ips = tuple(of_family(node_ips, family))
        families.append(FamilyContext(
            family=family,
            node_ips=ips,
            node_port_ips=_node_port_ips(config.node_port_addresses, family, ips,
                                         local_addresses, node_port_default),
            local_traffic=_local_traffic(config, node, family),
            service_cidrs=tuple(of_family(config.service_cidrs, family)),
            local_ips=_routable(of_family(local_addresses, family)),
        ))
    present = tuple(f for f in FAMILIES if f in ip_families)
    localhost = (mode is not None and mode.name == "iptables" and mode.localhost_nodeports
                 and 4 in present and families[0].node_port_loopback)
    sysctls = () if mode is None else tuple(mode_sysctls(
        mode.name, present, localhost_nodeports=localhost, strict_arp=mode.strict_arp).items())
    return NodeContext(config.node_name, tuple(families), config.masquerade_all,
                       _health_check_ips(families), present, _iptables(mode, iptables),
                       localhost, sysctls)


def _iptables(mode: ProxyMode | None, found: str) -> str:
    """The iptables to invoke: the mode's choice, else the node's, else nft."""
    if mode is None or not mode.uses_iptables:
        return ""
    if mode.iptables in IPTABLES_MODES:
        return mode.iptables
    return found if found in IPTABLES_MODES else "nft"


def _routable(addresses: Sequence[str]) -> tuple[str, ...]:
    """The addresses that are neither loopback nor link-local, each once, in order."""
    found = {ip: ipaddress.ip_address(ip) for ip in addresses}
    return tuple(ip for ip, a in found.items() if not (a.is_loopback or a.is_link_local))


def _health_check_ips(families: Sequence[FamilyContext]) -> tuple[str, ...]:
    """The NodePort addresses of the families the node has; () when one of them is every
    address (health-check node ports then listen on every address)."""
    present = [f.node_port_ips for f in families if f.node_ips] or [None]
    if any(ips is None for ips in present):
        return ()
    return tuple(ip for ips in present for ip in ips or ())

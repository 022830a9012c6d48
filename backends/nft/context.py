"""What the ruleset of one IP family depends on besides the services: the node's config."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from svcproxy.sdk import NodeConfig, NodeInfo, normalize_cidr, of_family

from .names import TABLE

MASQUERADE_MARK = 0x4000


@dataclass(frozen=True, slots=True)
class FamilyContext:
    """Everything node-level that one family's rules are rendered from."""

    family: int
    table: str = TABLE
    # nft match for traffic from pods of this node/cluster; "" when not detectable.
    local_match: str = ""
    nonlocal_match: str = ""
    masquerade_all: bool = False
    node_ips: tuple[str, ...] = ()
    nodeport_ips: tuple[str, ...] = ()
    service_cidrs: tuple[str, ...] = ()
    mark: int = MASQUERADE_MARK

    @property
    def ipx(self) -> str:
        """``ip`` or ``ip6``: the nft family keyword and address match prefix."""
        return "ip" if self.family == 4 else "ip6"

    @property
    def addr_type(self) -> str:
        return "ipv4_addr" if self.family == 4 else "ipv6_addr"


def anonymous_set(items: tuple[str, ...] | list[str]) -> str:
    """``{ a, b }`` as nft writes an anonymous set."""
    return "{ " + ", ".join(items) + " }"


def local_matches(
    config: NodeConfig, node: NodeInfo | None, family: int
) -> tuple[str, str]:
    """(match, negated match) for pod-originated traffic, per --detect-local-mode."""
    ipx = "ip" if family == 4 else "ip6"
    mode = config.detect_local_mode
    if mode == "InterfaceNamePrefix" and config.pod_interface_name_prefix:
        name = f'"{config.pod_interface_name_prefix}*"'
        return f"iifname {name}", f"iifname != {name}"
    if mode == "BridgeInterface" and config.pod_bridge_interface:
        name = f'"{config.pod_bridge_interface}"'
        return f"iifname {name}", f"iifname != {name}"
    if mode == "NodeCIDR":
        cidrs = of_family(node.pod_cidrs if node else (), family)
    else:
        cidrs = of_family(config.cluster_cidrs, family)
    # The node's pod CIDRs come from the frontend: only well-formed ones reach a rule.
    cidrs = [n for c in cidrs if (n := normalize_cidr(c)) is not None]
    if not cidrs:
        return "", ""
    ranges = anonymous_set(cidrs)
    return f"{ipx} saddr {ranges}", f"{ipx} saddr != {ranges}"


def nodeport_ips(config: NodeConfig, family: int) -> tuple[str, ...]:
    """Node IPs accepting NodePorts: --node-port-addresses CIDRs, else the primary IP."""
    ips = [
        ip for ip in of_family(config.node_ips, family) if not ipaddress.ip_address(ip).is_loopback
    ]
    cidrs = [c for c in config.node_port_addresses if c != "primary"]
    if not cidrs:
        return tuple(ips[:1])
    nets = [ipaddress.ip_network(c, strict=False) for c in of_family(cidrs, family)]
    return tuple(ip for ip in ips if any(ipaddress.ip_address(ip) in n for n in nets))


def family_context(config: NodeConfig, node: NodeInfo | None, family: int) -> FamilyContext:
    local, nonlocal_ = local_matches(config, node, family)
    return FamilyContext(
        family=family,
        local_match=local,
        nonlocal_match=nonlocal_,
        masquerade_all=config.masquerade_all,
        node_ips=tuple(of_family(config.node_ips, family)),
        nodeport_ips=nodeport_ips(config, family),
        service_cidrs=tuple(of_family(config.service_cidrs, family)),
    )

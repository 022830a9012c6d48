"""What the ruleset of one IP family depends on besides the services: the node's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from svcproxy.sdk import (
    LocalTraffic,
    NodeConfig,
    NodeContext,
    NodeInfo,
    NodeState,
    normalize_cidr,
    resolve_context,
)

from .names import TABLE

MASQUERADE_MARK = 0x4000

NodePortDefault = Literal["all", "primary"]
# Without --nodeport-addresses NodePorts answer on the primary node IPs, as in kube-proxy's
# nftables mode: the one place this backend's default is set (the agent reads it from
# the backend, a composition from its members).
NODE_PORT_DEFAULT: NodePortDefault = "primary"


@dataclass(frozen=True, slots=True)
class TableContext:
    """Everything node-level that one family's rules are rendered from."""

    family: int
    table: str = TABLE
    # nft match for traffic from pods of this node/cluster; "" when not detectable.
    local_match: str = ""
    nonlocal_match: str = ""
    masquerade_all: bool = False
    node_ips: tuple[str, ...] = ()
    # None: every local address but loopback (``fib daddr type local``).
    nodeport_ips: tuple[str, ...] | None = ()
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


def local_matches(local: LocalTraffic, family: int) -> tuple[str, str]:
    """(match, negated match) for pod-originated traffic, per --detect-local-mode."""
    ipx = "ip" if family == 4 else "ip6"
    if local.interface and local.mode in ("InterfaceNamePrefix", "BridgeInterface"):
        name = f'"{local.interface}*"' if local.by_interface_prefix else f'"{local.interface}"'
        return f"iifname {name}", f"iifname != {name}"
    # The node's pod CIDRs come from the frontend: only well-formed ones reach a rule.
    cidrs = [n for c in local.cidrs if (n := normalize_cidr(c)) is not None]
    if not cidrs:
        return "", ""
    ranges = anonymous_set(cidrs)
    return f"{ipx} saddr {ranges}", f"{ipx} saddr != {ranges}"


def node_context(config: NodeConfig, state: NodeState,
                 node_port_default: NodePortDefault = NODE_PORT_DEFAULT) -> NodeContext:
    """The agent's node context, or (a state not from an agent) the same resolution here,
    with the NodePort default the agent uses for this backend."""
    if state.context is not None:
        return state.context
    return resolve_context(config, state.node, node_port_default=node_port_default)


def family_context(config: NodeConfig, node: NodeInfo | None, family: int) -> TableContext:
    """One family's rendering context resolved from the flags alone (tests, benchmarks)."""
    return from_node_context(
        resolve_context(config, node, node_port_default=NODE_PORT_DEFAULT), family)


def from_node_context(node: NodeContext, family: int) -> TableContext:
    """One family's rendering context from the node context (NodePorts never on loopback:
    kube-proxy's nftables mode does not serve them there)."""
    fam = node.family(family)
    local, nonlocal_ = local_matches(fam.local_traffic, family)
    return TableContext(
        family=family,
        local_match=local,
        nonlocal_match=nonlocal_,
        masquerade_all=node.masquerade_all,
        node_ips=fam.node_ips,
        nodeport_ips=fam.node_port_ips_routable,
        service_cidrs=fam.service_cidrs,
    )

"""From the node's configuration to one family's ``FamilyConfig`` (pure)."""

from __future__ import annotations

from svcproxy.backends.iptables.render import FamilyConfig
from svcproxy.sdk import (
    LocalTraffic,
    NodeConfig,
    NodeContext,
    NodeInfo,
    normalize_cidr,
    resolve_context,
)


def masquerade_mark(bit: int) -> str:
    """--iptables-masquerade-bit as the hex mark kube-proxy writes (14 -> 0x4000)."""
    return hex(1 << bit)


def local_detection(config: NodeConfig, node: NodeInfo | None, family: int) -> tuple[str, str]:
    """(if-local, if-not-local) match arguments for --detect-local-mode; ("", "") if unknown."""
    return _detection(resolve_context(config, node).family(family).local_traffic)


def _detection(local: LocalTraffic) -> tuple[str, str]:
    """The node context's local-traffic detection as iptables matches: an interface, or
    the first CIDR (kube-proxy's iptables mode matches one)."""
    if local.interface and local.mode in ("InterfaceNamePrefix", "BridgeInterface"):
        name = f"{local.interface}+" if local.by_interface_prefix else local.interface
        return f"-i {name}", f"! -i {name}"
    # The node's pod CIDRs come from the frontend: only well-formed ones reach a rule.
    cidrs = [n for c in local.cidrs if (n := normalize_cidr(c)) is not None]
    return (f"-s {cidrs[0]}", f"! -s {cidrs[0]}") if cidrs else ("", "")


def nodeport_ips(config: NodeConfig, family: int) -> tuple[str, ...] | None:
    """The addresses NodePorts answer on (the node context's); None for every local
    address (the default)."""
    return resolve_context(config, None).family(family).node_port_ips


def family_config(config: NodeConfig, node: NodeInfo | None, family: int, *,
                  context: NodeContext | None = None, masquerade_bit: int = 14,
                  localhost_nodeports: bool = False, drop_invalid: bool = True,
                  random_fully: bool = True, nfacct: bool = False) -> FamilyConfig:
    """Everything but the services that shapes one family's rules, from the node context
    the agent resolved (``context``), else resolved here from the flags and the node."""
    node_context = context if context is not None else resolve_context(config, node)
    fam = node_context.family(family)
    if_local, if_not_local = _detection(fam.local_traffic)
    return FamilyConfig(
        family=family,
        masquerade_mark=masquerade_mark(masquerade_bit),
        masquerade_all=node_context.masquerade_all,
        if_local=if_local,
        if_not_local=if_not_local,
        node_ip=fam.primary_ip,
        nodeport_ips=fam.node_port_ips,
        localhost_nodeports=family == 4 and localhost_nodeports,
        random_fully=random_fully,
        drop_invalid=drop_invalid,
        service_cidrs=fam.service_cidrs,
        nfacct=nfacct,
    )

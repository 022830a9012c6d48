"""From the node's configuration to one family's ``FamilyConfig`` (pure)."""

from __future__ import annotations

import ipaddress

from svcproxy.backends.iptables.render import FamilyConfig
from svcproxy.sdk import NodeConfig, NodeInfo, normalize_cidr, of_family


def masquerade_mark(bit: int) -> str:
    """--iptables-masquerade-bit as the hex mark kube-proxy writes (14 -> 0x4000)."""
    return hex(1 << bit)


def local_detection(config: NodeConfig, node: NodeInfo | None, family: int) -> tuple[str, str]:
    """(if-local, if-not-local) match arguments for --detect-local-mode; ("", "") if unknown."""
    mode = config.detect_local_mode
    if mode == "ClusterCIDR":
        cidrs = of_family(config.cluster_cidrs, family)
        return (f"-s {cidrs[0]}", f"! -s {cidrs[0]}") if cidrs else ("", "")
    if mode == "NodeCIDR":
        # The node's pod CIDRs come from the frontend: only well-formed ones reach a rule.
        cidrs = [n for c in (of_family(node.pod_cidrs, family) if node else [])
                 if (n := normalize_cidr(c)) is not None]
        return (f"-s {cidrs[0]}", f"! -s {cidrs[0]}") if cidrs else ("", "")
    if mode == "InterfaceNamePrefix" and config.pod_interface_name_prefix:
        prefix = config.pod_interface_name_prefix
        return f"-i {prefix}+", f"! -i {prefix}+"
    if mode == "BridgeInterface" and config.pod_bridge_interface:
        bridge = config.pod_bridge_interface
        return f"-i {bridge}", f"! -i {bridge}"
    return "", ""


def nodeport_ips(config: NodeConfig, family: int) -> tuple[str, ...] | None:
    """The addresses NodePorts answer on; None for every local address (the default).

    As kube-proxy: CIDRs of the family select the node's IPs inside them (plus
    127.0.0.1 when a CIDR holds it); no CIDR of the family, or a zero CIDR,
    means every address; "primary" means the family's primary node IP.
    """
    wanted = config.node_port_addresses
    node_ips = of_family(config.node_ips, family)
    if tuple(wanted) == ("primary",):
        return tuple(node_ips[:1])
    cidrs = [ipaddress.ip_network(c, strict=False) for c in of_family(wanted, family)]
    if not cidrs or any(c.prefixlen == 0 for c in cidrs):
        return None
    candidates = [*node_ips, "127.0.0.1"] if family == 4 else node_ips
    return tuple(ip for ip in candidates if any(ipaddress.ip_address(ip) in c for c in cidrs))


def localhost_nodeports_allowed(config: NodeConfig, wanted: bool) -> bool:
    """--iptables-localhost-nodeports holds only if the NodePort addresses include 127.0.0.1."""
    if not wanted:
        return False
    ips = nodeport_ips(config, 4)
    return ips is None or "127.0.0.1" in ips


def family_config(config: NodeConfig, node: NodeInfo | None, family: int, *,
                  masquerade_bit: int = 14, localhost_nodeports: bool = False,
                  drop_invalid: bool = True, random_fully: bool = True) -> FamilyConfig:
    """Everything but the services that shapes one family's rules."""
    if_local, if_not_local = local_detection(config, node, family)
    node_ips = of_family(config.node_ips, family)
    return FamilyConfig(
        family=family,
        masquerade_mark=masquerade_mark(masquerade_bit),
        masquerade_all=config.masquerade_all,
        if_local=if_local,
        if_not_local=if_not_local,
        node_ip=node_ips[0] if node_ips else "",
        nodeport_ips=nodeport_ips(config, family),
        localhost_nodeports=family == 4 and localhost_nodeports,
        random_fully=random_fully,
        drop_invalid=drop_invalid,
        service_cidrs=tuple(of_family(config.service_cidrs, family)),
    )

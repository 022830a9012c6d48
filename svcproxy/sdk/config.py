"""Node configuration shared by every backend (flags named as kube-proxy's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The node's configuration from the node-agent flags, resolved once, for every backend."""

    node_name: str
    # --cluster-cidr, comma separated in the flag; used for local-traffic detection.
    cluster_cidrs: tuple[str, ...] = ()
    # --detect-local-mode: ClusterCIDR | NodeCIDR | InterfaceNamePrefix | BridgeInterface
    detect_local_mode: str = "ClusterCIDR"
    # --pod-interface-name-prefix (InterfaceNamePrefix mode)
    pod_interface_name_prefix: str = ""
    # --pod-bridge-interface (BridgeInterface mode)
    pod_bridge_interface: str = ""
    # --masquerade-all
    masquerade_all: bool = False
    # --node-port-addresses: CIDRs, or ("primary",) ; () = the backend's default
    node_port_addresses: tuple[str, ...] = ()
    # The node's own IPs (discovered with pyroute2 unless given); primary first per family.
    node_ips: tuple[str, ...] = ()
    # --service-cidr: ranges of ClusterIPs (traffic to unallocated ones is dropped)
    service_cidrs: tuple[str, ...] = ()
    # --sync-period / --min-sync-period, seconds
    sync_period: float = 30.0
    min_sync_period: float = 1.0

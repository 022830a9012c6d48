"""The sysctls each proxy mode needs and the IP families a node's kernel has.

``mode_sysctls`` is the one list of a mode's values: the node context carries them
(``NodeContext.sysctls``) and the node agent sets them before the first sync, so no
backend writes /proc/sys.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ROUTE_LOCALNET = "net/ipv4/conf/all/route_localnet"
IPVS = (
    ("net/ipv4/vs/conntrack", "1"),
    ("net/ipv4/vs/expire_nodest_conn", "1"),
    ("net/ipv4/vs/expire_quiescent_template", "1"),
    ("net/ipv4/ip_forward", "1"),
    ("net/bridge/bridge-nf-call-iptables", "1"),
)
IPVS_V6 = (
    ("net/ipv6/conf/all/forwarding", "1"),
    ("net/bridge/bridge-nf-call-ip6tables", "1"),
)
STRICT_ARP = (("net/ipv4/conf/all/arp_ignore", "1"), ("net/ipv4/conf/all/arp_announce", "2"))


def mode_sysctls(mode: str, families: Sequence[int] = (4,), *,
                 localhost_nodeports: bool = False, strict_arp: bool = False,
                 ) -> dict[str, str]:
    """/proc/sys names and values kube-proxy's ``mode`` (iptables, ipvs, nftables) needs
    on a node with ``families``: route_localnet for NodePorts on 127.0.0.1 (iptables);
    IPVS's conntrack and expiry, forwarding, bridge netfilter, strict ARP (ipvs)."""
    wanted: dict[str, str] = {}
    if mode == "iptables" and localhost_nodeports:
        wanted[ROUTE_LOCALNET] = "1"
    if mode == "ipvs":
        wanted.update(IPVS)
        if 6 in families:
            wanted.update(IPVS_V6)
        if strict_arp:
            wanted.update(STRICT_ARP)
    return wanted


def ip_families(root: Path = Path("/proc/sys")) -> tuple[int, ...]:
    """The IP families this network namespace has: 4, and 6 unless IPv6 is absent or
    disabled (read per thread: /proc/sys/net is the calling thread's namespace)."""
    try:
        off = (root / "net/ipv6/conf/all/disable_ipv6").read_text().strip() == "1"
    except OSError:
        return (4,)
    return (4,) if off else (4, 6)

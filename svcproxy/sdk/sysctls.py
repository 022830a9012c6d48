"""The sysctls each proxy mode needs and the IP families a node's kernel has.

``mode_sysctls`` is the one list of a mode's values: the node context carries them
(``NodeContext.sysctls``) and the node agent sets them before the first sync, so no
backend writes /proc/sys.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
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

log = logging.getLogger(__name__)


def apply_sysctls(wanted: dict[str, str], root: Path = Path("/proc/sys")) -> list[str]:
    """Write the values that differ; returns one line per sysctl that could not be set.
    nf_conntrack_max is only raised, as kube-proxy does."""
    failures = []
    for name, value in wanted.items():
        path = root / name
        try:
            current = path.read_text().strip()
            if current == value or (name.endswith("nf_conntrack_max")
                                    and int(current) >= int(value)):
                continue
            path.write_text(value)
            log.info("Set sysctl %s=%s (was %s)", name.replace("/", "."), value, current)
        except OSError as err:
            failures.append(f"{name.replace('/', '.')}={value}: {err.strerror or err}")
    return failures


def set_sysctls(wanted: Mapping[str, str], root: Path = Path("/proc/sys")) -> list[str]:
    """``apply_sysctls``, each failure logged (bridge netfilter's as missing br_netfilter);
    returns the failures."""
    failures = apply_sysctls(dict(wanted), root)
    for line in failures:
        if line.startswith("net.bridge."):
            log.info("sysctl not set: %s (br_netfilter not loaded): pod-to-service traffic "
                     "whose endpoint is on the same bridge may not be de-NATed", line)
        else:
            log.warning("sysctl not set: %s (run --init-only in a privileged init container, "
                        "or run privileged)", line)
    return failures

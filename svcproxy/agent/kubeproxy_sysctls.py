"""The sysctls kube-proxy sets for a mode and its conntrack section, set only when they differ.

``--init-only`` sets them and exits, so a DaemonSet can run that step in a privileged init
container and the backend itself with NET_ADMIN/NET_RAW only (/proc/sys is read-only in an
unprivileged container; values already right are not written again).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_IPVS = (
    ("net/ipv4/vs/conntrack", "1"),
    ("net/ipv4/vs/expire_nodest_conn", "1"),
    ("net/ipv4/vs/expire_quiescent_template", "1"),
    ("net/ipv4/ip_forward", "1"),
    ("net/bridge/bridge-nf-call-iptables", "1"),
)
_CT = "net/netfilter/nf_conntrack_"


def wanted_sysctls(config: dict[str, Any], backend: str, cpus: int) -> dict[str, str]:
    """/proc/sys paths and values for ``backend`` under ``config`` (kube-proxy's rules)."""
    wanted: dict[str, str] = {}
    if backend == "iptables" and config["iptables"]["localhostNodePorts"]:
        wanted["net/ipv4/conf/all/route_localnet"] = "1"
    if backend == "ipvs":
        wanted.update(_IPVS)
        if config["ipvs"]["strictARP"]:
            wanted["net/ipv4/conf/all/arp_ignore"] = "1"
            wanted["net/ipv4/conf/all/arp_announce"] = "2"
    ct = config["conntrack"]
    if ct["maxPerCore"]:
        wanted["net/netfilter/nf_conntrack_max"] = str(max(ct["maxPerCore"] * cpus, ct["min"]))
    for field, name in (("tcpEstablishedTimeout", "tcp_timeout_established"),
                        ("tcpCloseWaitTimeout", "tcp_timeout_close_wait"),
                        ("udpTimeout", "udp_timeout"), ("udpStreamTimeout", "udp_timeout_stream")):
        if ct[field]:
            wanted[_CT + name] = str(int(ct[field]))
    if ct["tcpBeLiberal"]:
        wanted[_CT + "tcp_be_liberal"] = "1"
    return wanted


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


def set_mode_sysctls(config: dict[str, Any], backend: str) -> list[str]:
    """Apply wanted_sysctls for this machine; failures are logged and returned."""
    failures = apply_sysctls(wanted_sysctls(config, backend, os.cpu_count() or 1))
    for line in failures:
        log.warning("sysctl not set: %s (run --init-only in a privileged init container, or "
                    "run privileged)", line)
    return failures

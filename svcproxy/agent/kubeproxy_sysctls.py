"""The sysctls kube-proxy sets for a mode and its conntrack section, set only when they differ.

A mode's values are the SDK's ``mode_sysctls`` (svcproxy/sdk/sysctls.py), which the node
context carries and the node agent sets before the first sync. ``--init-only`` sets them
(with the conntrack section) and exits, so a DaemonSet can run that step in a privileged
init container and the backend itself with NET_ADMIN/NET_RAW only (/proc/sys is read-only
in an unprivileged container; values already right are not written again).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from svcproxy.sdk.sysctls import ip_families, mode_sysctls

log = logging.getLogger(__name__)

_CT = "net/netfilter/nf_conntrack_"


def wanted_sysctls(config: dict[str, Any], backend: str, cpus: int,
                   families: Sequence[int] = (4,)) -> dict[str, str]:
    """/proc/sys paths and values for ``backend`` under ``config`` (kube-proxy's rules):
    the mode's and the conntrack section's."""
    wanted = mode_sysctls(backend, families,
                          localhost_nodeports=config["iptables"]["localhostNodePorts"],
                          strict_arp=config["ipvs"]["strictARP"])
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


def set_mode_sysctls(config: dict[str, Any], backend: str) -> list[str]:
    """Apply wanted_sysctls for this machine; failures are logged and returned."""
    return set_sysctls(wanted_sysctls(config, backend, os.cpu_count() or 1, ip_families()))

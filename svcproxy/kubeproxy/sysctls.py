"""The sysctls kube-proxy sets for a mode and its conntrack section, set only when they differ.

A mode's values are the SDK's ``mode_sysctls`` (svcproxy/sdk/sysctls.py), which the node
context carries and the node agent sets before the first sync. ``--init-only`` sets them
(with the conntrack section) and exits, so a DaemonSet can run that step in a privileged
init container and the backend itself with NET_ADMIN/NET_RAW only (/proc/sys is read-only
in an unprivileged container; values already right are not written again).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

_CT = "net/netfilter/nf_conntrack_"


def wanted_sysctls(config: dict[str, Any], backend: str, cpus: int,
                   families: Sequence[int] = (4,)) -> dict[str, str]:
    """/proc/sys paths and values for ``backend`` under ``config`` (kube-proxy's rules):
    the mode's and the conntrack section's."""
    # Imported here: the configuration is read before local mode starts its listing, and
    # the SDK (which loads the node agent) only after that.
    from svcproxy.sdk.sysctls import mode_sysctls

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


def set_mode_sysctls(config: dict[str, Any], backend: str) -> list[str]:
    """Apply wanted_sysctls for this machine (the SDK's ``set_sysctls``); failures are
    logged and returned."""
    from svcproxy.sdk.sysctls import ip_families, set_sysctls

    return set_sysctls(wanted_sysctls(config, backend, os.cpu_count() or 1, ip_families()))

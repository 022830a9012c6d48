"""The ports the packet path SNATs flows to: ports the node's own connections never take.

A SNATed flow's reply entry (endpoint, node address, endpoint port, NAT port) catches
every packet of that tuple, so a NAT port the node's kernel may also give one of its own
connections to the same endpoint (``net.ipv4.ip_local_port_range``, 32768-60999 by
default) would steal that connection's replies. The NAT ports are therefore those above
the node's ephemeral range (61000-65535 by default), else those below it (from 1024).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_PORTS = 1024  # fewer free ports than this on both sides: the default range instead
DEFAULT = (32768, 32768)  # (first, count): 32768-65535


def local_port_range(path: Path = LOCAL_PORT_RANGE) -> tuple[int, int] | None:
    """The node's ephemeral ports (low, high), or None when it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def nat_ports(local: tuple[int, int] | None) -> tuple[int, int]:
    """(first, count) of the NAT ports for a node whose ephemeral ports are ``local``."""
    if local is None:
        return DEFAULT
    low, high = local
    above, below = 65535 - high, low - MIN_PORTS
    if above >= MIN_PORTS:
        return high + 1, above
    return (MIN_PORTS, below) if below >= MIN_PORTS else DEFAULT


def for_this_node(path: Path = LOCAL_PORT_RANGE) -> tuple[int, int]:
    """The NAT ports for the node this process runs in, a warning when they overlap."""
    local = local_port_range(path)
    first, count = nat_ports(local)
    if local is None or (first, count) == DEFAULT:
        log.warning("NAT ports %d-%d may collide with the node's own connections "
                    "(net.ipv4.ip_local_port_range %s): leave at least %d ports above or "
                    "below it, e.g. sysctl net.ipv4.ip_local_port_range='32768 60999'",
                    first, first + count - 1, local or "unreadable", MIN_PORTS)
    return first, count

"""What the ebpf backend names in the kernel: its maps, where it pins them, its links.

A restarted backend finds what the previous one left by these names, so they never
change between versions: the socket programs' maps (``sp_*``) and the tc packet path's
(``spp_*``, layouts in ``packet_layout.py``), pinned under ``TC_SUBDIR``.
"""

from __future__ import annotations

import re
from pathlib import Path

PIN_DIR = Path("/sys/fs/bpf/svcproxy")  # --ebpf-pin-dir's default
LINK_PREFIX = "link_"  # a pinned link: link_<program> (socket), link_<device>_<hook> (tc)
TC_SUBDIR = "tc"  # the packet path's pins: <pin dir>/tc

MAP_SERVICES = "sp_services"
MAP_ENDPOINTS = "sp_endpoints"
MAP_AFFINITY = "sp_affinity"
MAP_REVNAT = "sp_revnat"
MAPS = (MAP_SERVICES, MAP_ENDPOINTS, MAP_AFFINITY, MAP_REVNAT)

TC_MAP_SERVICES = "spp_services"
TC_MAP_ENDPOINTS = "spp_endpoints"
TC_MAP_MAGLEV = "spp_maglev"
TC_MAP_CT = "spp_ct"
TC_MAP_DEVICES = "spp_devices"
TC_MAP_AFFINITY = "spp_affinity"
TC_MAP_RANGES = "spp_ranges"
TC_MAP_CLUSTER_IPS = "spp_cluster_ips"
TC_MAP_XDP_STATS = "spp_xdp_stats"  # per-CPU counters of the XDP program (xdp.read_stats)
TC_MAP_STATS = "spp_stats"  # per-CPU counters of tc and XDP (packet_stats.py)
TC_CONSTANTS = "spp_constants"  # the loaded tc program's .rodata, pinned after each load
# --detect-local-mode: the generation in use, the local prefixes, the local devices
TC_MAP_LOCAL = "spp_local"
TC_MAP_LOCAL_CIDRS = "spp_local_cidrs"
TC_MAP_LOCAL_DEVICES = "spp_local_devices"
TC_MAPS = (TC_MAP_SERVICES, TC_MAP_ENDPOINTS, TC_MAP_MAGLEV, TC_MAP_CT, TC_MAP_DEVICES,
           TC_MAP_AFFINITY, TC_MAP_RANGES, TC_MAP_CLUSTER_IPS, TC_MAP_XDP_STATS, TC_MAP_STATS,
           TC_MAP_LOCAL, TC_MAP_LOCAL_CIDRS, TC_MAP_LOCAL_DEVICES)


def pin_device(device: str) -> str:
    """``device`` as it appears in a pin's name: bpffs refuses '.' in names (eth0.100),
    so '.' is written '=2e' and '=' '=3d'; other names are unchanged."""
    return device.replace("=", "=3d").replace(".", "=2e")


def device_of_pin(text: str) -> str:
    """The device name ``pin_device`` wrote as ``text``."""
    return re.sub(r"=(2e|3d)", lambda m: "." if m.group(1) == "2e" else "=", text)

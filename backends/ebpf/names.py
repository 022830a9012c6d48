"""What the ebpf backend names in the kernel: its maps, where it pins them, its links.

A restarted backend finds what the previous one left by these names, so they never
change between versions. The packet path's maps are named beside their layouts
(``packet_layout.py``, ``spp_*``) and pinned under ``TC_SUBDIR``.
"""

from __future__ import annotations

from pathlib import Path

PIN_DIR = Path("/sys/fs/bpf/svcproxy")  # --ebpf-pin-dir's default
LINK_PREFIX = "link_"  # a pinned link: link_<program> (socket), link_<device>_<hook> (tc)
TC_SUBDIR = "tc"  # the packet path's pins: <pin dir>/tc

MAP_SERVICES = "sp_services"
MAP_ENDPOINTS = "sp_endpoints"
MAP_AFFINITY = "sp_affinity"
MAP_REVNAT = "sp_revnat"
MAPS = (MAP_SERVICES, MAP_ENDPOINTS, MAP_AFFINITY, MAP_REVNAT)

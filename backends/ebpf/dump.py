"""``svcproxy backend ebpf --dump``: the pinned maps printed as services and endpoints."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from .layout import F_AFFINITY, F_REFUSE, ServiceAddress, Target
from .loader import open_pinned_maps
from .names import MAP_AFFINITY, MAP_ENDPOINTS, MAP_REVNAT, MAP_SERVICES
from .tables import read_kernel


def dump_lines(pin_dir: Path) -> Iterator[str]:
    """One line per services-map entry, sorted by address, then the maps' sizes."""
    maps = open_pinned_maps(pin_dir)
    try:
        applied, orphans = read_kernel(maps[MAP_SERVICES], maps[MAP_ENDPOINTS])
        rows = sorted((ServiceAddress.unpack(k), a) for k, a in applied.items())
        for fe, entry in rows:
            value = entry.value
            if value.flags & F_REFUSE:
                what = "refuse (no endpoints: connect() fails with ECONNREFUSED)"
            elif not value.count:
                what = "pass (no endpoint for this traffic here: left to the packet path)"
            elif entry.slots is None:
                what = f"{value.count} endpoints, set {value.set_id} INCOMPLETE"
            else:
                what = " ".join(str(Target.unpack(s)) for s in entry.slots)
            extra = f" [affinity ClientIP {value.affinity_timeout}s]" \
                if value.flags & F_AFFINITY else ""
            yield f"{fe} -> {what}{extra}"
        yield (f"# {len(rows)} services, "
               f"{sum(a.value.count for a in applied.values())} endpoint slots, "
               f"{len(maps[MAP_AFFINITY])} affinity entries, "
               f"{len(maps[MAP_REVNAT])} reverse translations, "
               f"{len(orphans)} unused endpoint sets")
    finally:
        for m in maps.values():
            os.close(m.fd)

"""Session-affinity clients kept through a rebuild.

A rebuild deletes and rewrites the tables in one transaction; the clients each affinity
set learnt from packets (``update @affinity-...``) would go with them. As kube-proxy's
nftables mode keeps them through its full syncs, the rebuild reads them first and adds
them back, each with the time it had left.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from .names import AFFINITY_PREFIX


def learnt_clients(listing: str, table: str) -> dict[str, str]:
    """Affinity set name -> its elements as nft text (``ip expires Ns, ...``) from
    ``nft -j list sets`` output, for the sets of ``table`` that hold any."""
    found: dict[str, str] = {}
    for item in json.loads(listing or "{}").get("nftables", []):
        body = item.get("set") if isinstance(item, dict) else None
        if not body or body.get("table") != table:
            continue
        name = body.get("name", "")
        if not name.startswith(AFFINITY_PREFIX):
            continue
        elements = []
        for elem in body.get("elem", []):
            inner = elem.get("elem") if isinstance(elem, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("val"), str) \
                    and int(inner.get("expires", 0)) > 0:
                elements.append(f"{inner['val']} expires {int(inner['expires'])}s")
        if elements:
            found[name] = ", ".join(elements)
    return found


def restore_lines(ref: str, clients: Mapping[str, str], sets: Collection[str]) -> list[str]:
    """``add element`` lines putting ``clients`` back into those of the sets still
    declared (``sets``: the names of the rebuilt table's sets)."""
    return [f"add element {ref} {name} {{ {elements} }}"
            for name, elements in clients.items() if name in sets]

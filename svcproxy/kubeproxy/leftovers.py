"""What other proxy modes left on the node, removed as kube-proxy removes it.

kube-proxy removes at start the rules of the modes it is not running (in nftables mode the
iptables and IPVS ones, in iptables or ipvs mode the nftables ones) and with ``--cleanup``
every mode's, so that switching modes leaves no stale DNAT rules in front of the new ones.
svcproxy does the same with ``--cleanup`` and in the privileged ``--init-only`` step (not in
the backend's own start, whose cold start this would lengthen), for its backends and for
what kube-proxy itself left when svcproxy replaces it: kube-proxy's nftables tables
(``ip``/``ip6 kube-proxy``; svcproxy's own table is named ``svcproxy``) are always
leftovers; kube-proxy's KUBE-* iptables chains are the iptables backend's own names, so its
cleanup removes them.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable

log = logging.getLogger("svcproxy.kube-proxy")

IPTABLES_BASED = ("iptables", "ipvs")
NFT_BASED = ("nft", "ebpf")  # ebpf's packet path is the nft backend's table
KUBE_PROXY_NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))


def leftover_backends(chosen: str, everything: bool) -> list[str]:
    """The svcproxy backends whose cleanup runs before ``chosen`` starts (``everything``:
    --cleanup, every mode's); a backend of another kind (a plugin) removes none."""
    if everything:
        return [b for b in ("iptables", "ipvs", "nft") if b != chosen]
    if chosen in IPTABLES_BASED:
        return ["nft"]
    if chosen in NFT_BASED:
        return list(IPTABLES_BASED)
    return []


def remove_kube_proxy_tables(run: Callable[..., subprocess.CompletedProcess[str]]
                             = subprocess.run) -> list[str]:
    """Delete kube-proxy's nftables tables that exist; returns the ones deleted."""
    deleted = []
    for family, table in KUBE_PROXY_NFT_TABLES:
        try:
            listed = run(["nft", "list", "table", family, table], capture_output=True,
                         text=True, timeout=30)
            if listed.returncode != 0:
                continue
            gone = run(["nft", "delete", "table", family, table], capture_output=True,
                       text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("kube-proxy's nftables table %s %s not checked: %s", family, table, err)
            continue
        if gone.returncode == 0:
            log.info("Removed kube-proxy's nftables table %s %s (left by its nftables mode)",
                     family, table)
            deleted.append(f"{family} {table}")
        else:
            log.warning("kube-proxy's nftables table %s %s not removed: %s", family, table,
                        gone.stderr.strip())
    return deleted


def remove_leftovers(chosen: str, everything: bool,
                     cleanup_of: Callable[[str], Callable[[], None] | None]) -> None:
    """kube-proxy's tables, then each leftover backend's cleanup (``cleanup_of(name)``:
    None when that backend is not installed). Failures are logged, never fatal, as
    kube-proxy's cleanup at start is best-effort."""
    remove_kube_proxy_tables()
    for name in leftover_backends(chosen, everything):
        try:
            cleanup = cleanup_of(name)
            if cleanup is not None:
                cleanup()
                log.debug("Removed what the %s mode left, if anything", name)
        except Exception as err:  # noqa: BLE001 - best-effort, as kube-proxy's
            log.warning("Leftovers of the %s mode not removed: %s", name, err)

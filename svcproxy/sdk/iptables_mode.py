"""Which iptables the node already uses (nft or legacy), as kube-proxy's iptables-wrapper
decides; the node agent asks once, for the node context."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

MODES = ("nft", "legacy")
HINT_CHAINS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")


def detect_iptables(prefix: Sequence[str] = ()) -> str:
    """nft or legacy: a kubelet hint chain in the mangle table decides first; otherwise
    the mode holding more rules (legacy with ten or more) wins; an empty node gets nft.
    ``prefix`` runs the commands through a wrapper (``ip netns exec NS``)."""
    for mode in MODES:
        for family in (4, 6):
            text = _quiet_save(prefix, family, mode, "mangle")
            if any(f":{chain} " in text for chain in HINT_CHAINS):
                return mode
    legacy = sum(_rules(_quiet_save(prefix, f, "legacy")) for f in (4, 6))
    if legacy >= 10:
        return "legacy"
    nft = sum(_rules(_quiet_save(prefix, f, "nft")) for f in (4, 6))
    return "legacy" if legacy > nft else "nft"


def _rules(save: str) -> int:
    """Rule lines in iptables-save output (how the wrapper weighs a mode)."""
    return sum(1 for line in save.splitlines() if line.startswith("-"))


def _quiet_save(prefix: Sequence[str], family: int, mode: str, table: str = "") -> str:
    program = f"{'iptables' if family == 4 else 'ip6tables'}-{mode}-save"
    args = [*prefix, program] + (["-t", table] if table else [])
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""

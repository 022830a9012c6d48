"""``--cleanup``: the transaction removing our jumps and chains and nothing else (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.jumps import delete_lines
from svcproxy.backends.iptables.render_restore import (
    SavedTable,
    TableChanges,
    all_chains_options,
    restore_text,
)
from svcproxy.backends.iptables.render_toplevel import (
    FILTER,
    FILTER_CHAINS,
    MANGLE,
    NAT,
    NAT_CHAINS,
)

KUBELET_CANARY = "KUBE-KUBELET-CANARY"


def owned_chains(saved: Mapping[str, SavedTable]) -> dict[str, set[str]]:
    """Our chains present per table. KUBE-FIREWALL stays when a kubelet owns it too."""
    kubelet = any(KUBELET_CANARY in t.chains for t in saved.values())
    fixed = {
        FILTER: set(FILTER_CHAINS) | ({names.KUBELET_FIREWALL} if not kubelet else set()),
        NAT: set(NAT_CHAINS),
        MANGLE: set(),
    }
    owned: dict[str, set[str]] = {}
    for table, ours in fixed.items():
        have = saved.get(table)
        if have is None:
            continue
        chains = {c for c in have.chains if c in ours or c == names.CANARY
                  or (table == NAT and names.is_service_chain(c))}
        if chains:
            owned[table] = chains
    return owned


def cleanup_text(saved: Mapping[str, SavedTable]) -> str:
    """iptables-restore input deleting our jump rules and chains ("" if none are left)."""
    tables: dict[str, TableChanges] = {}
    for table, chains in owned_chains(saved).items():
        changes = TableChanges(lines=delete_lines(chains, saved[table]),
                               delete=sorted(chains))
        tables[table] = changes
    return restore_text(tables)


def cleanup_texts(saved: Mapping[str, SavedTable], all_chains_min: int | None = None,
                  ) -> list[str]:
    """The cleanup as restore inputs to apply in order ([] if nothing is left).

    iptables-nft (``all_chains_min`` given, see restore): the jump deletions
    first, then the chains, so a big chain transaction can skip the rule cache.
    """
    if all_chains_min is None:
        return [text] if (text := cleanup_text(saved)) else []
    owned = owned_chains(saved)
    jumps = {t: TableChanges(lines=delete_lines(c, saved[t])) for t, c in owned.items()}
    chains = {t: TableChanges(delete=sorted(c)) for t, c in owned.items()}
    options = all_chains_options(chains, {t: len(saved[t].chains) for t in owned},
                                 minimum=all_chains_min)
    return [text for text in (restore_text(jumps), restore_text(chains, options)) if text]

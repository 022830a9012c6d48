"""iptables-restore input and iptables-save output, as text (pure).

A transaction names, per table, the chains to (re)write, the chains to delete
and raw lines (jump rules into built-in chains). It is applied with
``iptables-restore --noflush``: chains not named are left untouched.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

TABLE_ORDER = ("filter", "nat", "mangle")

# iptables-nft (1.8.x) records every chain a transaction names (each rule's chain
# and jump target) in a sorted linked list before fetching them one by one
# (nft-cache.c, cache_chain_list_insert): quadratic in the chains named, 85% of
# an 8.6 s restore at 1,000 services and hours at 10,000. One chain-less command
# first makes it fetch all the table's chains in one dump and skip the list.
# The chain-less ``-F``/``-X`` would flush or delete everyone's chains and
# ``-L``/``-S`` would fetch and print every rule; ``-Z`` changes no rule: with
# the chain cache only (no ``-D``/``-C``/``-R`` in the table) it zeroes just
# the built-in chains' policy counters.
ALL_CHAINS_LINE = "-Z"
# The dump costs with the chains already in the table (2.5 s for 110,000 chains,
# 10,000 services), the list with the square of the chains named (0.2 s for
# 4,000): the list wins below about an eighth of the table, and always below 500.
ALL_CHAINS_MIN = 500
ALL_CHAINS_SHARE = 8


@dataclass(slots=True)
class TableChanges:
    """What one transaction does to one table."""

    write: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.write or self.delete or self.lines)


def diff_chains(old: Mapping[str, str], new: Mapping[str, str], chains: Iterable[str],
                into: TableChanges) -> None:
    """Add to ``into`` the chains among ``chains`` whose text differs or that are gone."""
    for chain in chains:
        text = new.get(chain)
        if text is None:
            if chain in old:
                into.delete.append(chain)
        elif old.get(chain) != text:
            into.write[chain] = text


def restore_text(tables: Mapping[str, TableChanges],
                 all_chains_above: Mapping[str, int] | None = None) -> str:
    """The iptables-restore input: chain lines first, then rules, raw lines, deletions.

    ``all_chains_above`` (iptables-nft only), per table: a table naming more chains
    than that starts with ``ALL_CHAINS_LINE``, when nothing in it needs the rule cache.
    """
    parts: list[str] = []
    for table in sorted(tables, key=_table_rank):
        changes = tables[table]
        if changes.empty():
            continue
        parts.append(f"*{table}\n")
        above = all_chains_above.get(table) if all_chains_above is not None else None
        if above is not None and _fetch_all_chains(changes, above):
            parts.append(ALL_CHAINS_LINE + "\n")
        parts.extend(f":{chain} - [0:0]\n" for chain in changes.write)
        parts.extend(f":{chain} - [0:0]\n" for chain in changes.delete)
        parts.extend(changes.write.values())
        parts.extend(line + "\n" for line in changes.lines)
        parts.extend(f"-X {chain}\n" for chain in changes.delete)
        parts.append("COMMIT\n")
    return "".join(parts)


def all_chains_thresholds(tables: Iterable[str], existing: Mapping[str, int],
                          minimum: int = ALL_CHAINS_MIN) -> dict[str, int]:
    """Per table, the chains a transaction must name for iptables-nft's one dump of the
    table's ``existing`` chains to be cheaper than its sorted list."""
    return {t: max(minimum, existing.get(t, 0) // ALL_CHAINS_SHARE) for t in tables}


def _fetch_all_chains(changes: TableChanges, above: int) -> bool:
    """Many chains named, and only lines iptables-nft serves from its chain cache."""
    if len(changes.write) + len(changes.delete) <= above:
        return False
    return all(_chain_cache_only(line) for line in changes.lines)


def _chain_cache_only(line: str) -> bool:
    """``-A`` or ``-I CHAIN 1``: a line iptables-nft needs no rule cache for."""
    words = line.split(None, 3)
    if words[0] == "-A":
        return True
    return words[0] == "-I" and len(words) > 2 and words[2] == "1"


def _table_rank(table: str) -> int:
    return TABLE_ORDER.index(table) if table in TABLE_ORDER else len(TABLE_ORDER)


BUILTIN_CHAINS = ("INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING")
_BUILTIN_RULE = tuple(f"-A {chain} " for chain in BUILTIN_CHAINS)


@dataclass(frozen=True, slots=True)
class SavedTable:
    """One table of iptables-save output: its chains and the rules of its built-in chains
    (all anyone reads: jump rules; keeping 320,000 KUBE-* lines would cost ~100 MB)."""

    chains: frozenset[str]
    rules: tuple[str, ...]


def parse_save(text: str | Iterable[str]) -> dict[str, SavedTable]:
    """Tables of iptables-save output (a string, or its lines as they stream) by name."""
    tables: dict[str, SavedTable] = {}
    name = ""
    chains: set[str] = set()
    rules: list[str] = []
    for line in io.StringIO(text) if isinstance(text, str) else text:
        if line.startswith("*"):
            name, chains, rules = line[1:].strip(), set(), []
        elif line.startswith(":") and name:
            chains.add(line[1:].split(" ", 1)[0])
        elif line.startswith(_BUILTIN_RULE) and name:
            rules.append(line.rstrip("\n"))
        elif line.strip() == "COMMIT" and name:
            tables[name] = SavedTable(frozenset(chains), tuple(rules))
            name = ""
    return tables


def count_rules(text: str) -> int:
    """Rule lines in iptables-save output (how kube-proxy's wrapper weighs a mode)."""
    return sum(1 for line in text.splitlines() if line.startswith("-"))

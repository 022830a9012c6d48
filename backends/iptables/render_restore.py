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
# Chain-less -F/-X would flush or delete everyone's chains. -S (list) changes
# nothing: it also fetches every rule (+2 s over 110,000 chains) and prints the
# table (the output is discarded), and with that rule cache, iptables-nft 1.8.9
# fails ``-I CHAIN 1`` into a built-in chain that does not exist yet. -Z (zero)
# needs no rule cache but zeroes every counter of the table, foreign rules' too.
# So -S, and -Z only where -S would fail (a table still without those built-in
# chains, so with little to zero).
LIST_LINE = "-S"
ZERO_LINE = "-Z"
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


@dataclass(frozen=True, slots=True)
class AllChains:
    """When and how a table's transaction makes iptables-nft fetch all its chains."""

    above: int
    line: str = LIST_LINE


def restore_text(tables: Mapping[str, TableChanges],
                 all_chains: Mapping[str, AllChains] | None = None) -> str:
    """The iptables-restore input: chain lines first, then rules, raw lines, deletions.

    ``all_chains`` (iptables-nft only), per table: a table naming more chains than
    ``above`` starts with its ``line`` (``ZERO_LINE`` only with no rule-cache line).
    """
    parts: list[str] = []
    for table in sorted(tables, key=_table_rank):
        changes = tables[table]
        if changes.empty():
            continue
        parts.append(f"*{table}\n")
        option = all_chains.get(table) if all_chains is not None else None
        if option is not None and _fetch_all_chains(changes, option):
            parts.append(option.line + "\n")
        parts.extend(f":{chain} - [0:0]\n" for chain in changes.write)
        parts.extend(f":{chain} - [0:0]\n" for chain in changes.delete)
        parts.extend(changes.write.values())
        parts.extend(line + "\n" for line in changes.lines)
        parts.extend(f"-X {chain}\n" for chain in changes.delete)
        parts.append("COMMIT\n")
    return "".join(parts)


def all_chains_options(tables: Mapping[str, TableChanges], existing: Mapping[str, int],
                       present: Mapping[str, frozenset[str]] | None = None,
                       minimum: int = ALL_CHAINS_MIN) -> dict[str, AllChains]:
    """Per table: how many chains a transaction must name for iptables-nft's one dump of
    the ``existing`` chains to be cheaper than its sorted list, and the line for it
    (``ZERO_LINE`` when an ``-I`` line inserts into a chain not ``present``)."""
    options = {}
    for table, changes in tables.items():
        inserted = {line.split()[1] for line in changes.lines if line.startswith("-I ")}
        known = present.get(table, frozenset()) if present is not None else None
        line = LIST_LINE if known is None or inserted <= known else ZERO_LINE
        above = max(minimum, existing.get(table, 0) // ALL_CHAINS_SHARE)
        options[table] = AllChains(above, line)
    return options


def _fetch_all_chains(changes: TableChanges, option: AllChains) -> bool:
    """Many chains named, and for ``-Z`` only lines served from the chain cache."""
    if len(changes.write) + len(changes.delete) <= option.above:
        return False
    return option.line != ZERO_LINE or all(_chain_cache_only(line) for line in changes.lines)


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

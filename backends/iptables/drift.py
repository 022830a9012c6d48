"""What of our iptables rules the kernel no longer holds as applied (pure).

The reference is what the kernel held right after each write (``ReadBack``, read back
by the backend then, so known at apply time): per chain its rule count and a digest.
iptables-nft reads it over netlink (nftrules: the digest of the rules' messages, and
the expressions of our jumps in the built-in chains); iptables-legacy from
``iptables-save -t TABLE`` as it streams (``read_saved``: the digest of each chain's
saved lines; ``iptables-save`` normalizes rules, so the text the renderer wrote cannot
be compared with it), our jumps by their presence in the built-in chains. A
top-level chain (KUBE-SERVICES, ...) or a jump that differs is the skeleton's drift
(everything is rewritten); a service port's own chain (KUBE-SVC/SEP/EXT/FW/SVL-*) that
differs is that service port's drift (its chains are written again); a chain not known
as written is drift too. Chains that are not ours are not looked at. iptables-legacy
runs ``iptables-save`` only when a table's blob digest (``legacyblob``) differs from
``ReadBack.blobs``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.backends.iptables.jumps import JumpChain, insert_lines
from svcproxy.backends.iptables.nftrules import ChainDigest, TableRules
from svcproxy.backends.iptables.render import ServiceRules
from svcproxy.backends.iptables.render_restore import BUILTIN_CHAINS, SavedTable
from svcproxy.backends.iptables.render_toplevel import NAT
from svcproxy.sdk import ServicePortKey


@dataclass(slots=True)
class Saved:
    """One family's tables as saved: our chains, and the built-in chains' rules."""

    chains: dict[str, dict[str, ChainDigest]] = field(default_factory=dict)
    builtin: dict[str, SavedTable] = field(default_factory=dict)


def read_saved(lines: Iterable[str], wanted: Mapping[str, Iterable[str]]) -> Saved:
    """``iptables-save`` output (lines as they stream) reduced to the chains of
    ``wanted`` (table -> chains) and the built-in chains' rules."""
    saved = Saved()
    table = ""
    ours: set[str] = set()
    declared: set[str] = set()
    rules: dict[str, list[str]] = {}
    builtin: list[str] = []
    wanted_sets = {t: set(chains) for t, chains in wanted.items()}
    for line in lines:
        if line.startswith("-A "):
            chain = line[3:line.find(" ", 3)]
            if chain in ours:
                rules[chain].append(line)
            elif chain in BUILTIN_CHAINS:
                builtin.append(line.rstrip("\n"))
        elif line.startswith(":"):
            name = line[1:].split(" ", 1)[0]
            declared.add(name)
            if name in ours:
                rules[name] = []
        elif line.startswith("*"):
            table = line[1:].strip()
            ours = wanted_sets.get(table, set())
            declared, rules, builtin = set(), {}, []
        elif line.startswith("COMMIT") and table:
            saved.chains[table] = {
                name: ChainDigest(len(lines_), _digest(lines_)) for name, lines_ in rules.items()}
            saved.builtin[table] = SavedTable(frozenset(declared), tuple(builtin))
            table = ""
    return saved


def _digest(lines: list[str]) -> bytes:
    return hashlib.blake2b("".join(lines).encode(), digest_size=16).digest()


def compare_saved(top: Mapping[str, Mapping[str, str]],
                  services: Mapping[ServicePortKey, ServiceRules], jumps: tuple[JumpChain, ...],
                  saved: Saved, reference: ReadBack) -> tuple[set[ServicePortKey], str]:
    """iptables-legacy: (the service ports whose chains differ, why the skeleton differs
    or ""), from ``iptables-save`` of the tables of ours."""
    for table in top:
        missing = insert_lines(jumps, table, saved.builtin.get(table))
        if missing:
            return set(), f"{table} lacks our jump {missing[0][3:]}"
    held = {table: TableRules(chains) for table, chains in saved.chains.items()}
    return compare_kernel(top, services, held, reference)


@dataclass(slots=True)
class ReadBack:
    """One family's rules as the kernel held them right after the backend wrote them
    (read back then, so known at apply time): per (table, chain) its count and digest
    (None: not known, someone else committed between the write and the read: drift);
    iptables-nft: per (table, built-in chain) the expressions of our jumps, and the
    ruleset generation at which the kernel was last seen holding all of it (None: to
    be compared)."""

    chains: dict[tuple[str, str], ChainDigest | None] = field(default_factory=dict)
    jumps: dict[tuple[str, str], list[bytes]] = field(default_factory=dict)
    generation: int | None = None
    # iptables-nft: the (table, chain)s someone else's transactions changed since the
    # last check, from the kernel's events (None: not known, every chain is read).
    touched: set[tuple[str, str]] | None = None
    # iptables-legacy: per table the digest of its blob (``legacyblob``) when the kernel
    # was last seen holding all that was applied (a table not here: to be compared).
    blobs: dict[str, bytes] = field(default_factory=dict)


def adopt_blobs(applied: ReadBack, tables: Iterable[str],
                after: Mapping[str, bytes] | None) -> None:
    """iptables-legacy, after a restore of ``tables``: the blob digests read right after
    a full restore (``after``, it wrote every chain of ours) are the reference; after
    a partial one (None) the tables are compared with iptables-save at the next check
    (a change someone made since the last check is not taken as ours; reading the
    blobs before and after each partial restore would cost more than that check)."""
    for table in tables:
        if after is not None and table in after:
            applied.blobs[table] = after[table]
        else:
            applied.blobs.pop(table, None)


def assumed(applied: ReadBack, read: Mapping[str, TableRules]) -> dict[str, TableRules]:
    """What the kernel holds, from the chains ``read`` (those someone else touched) and,
    for every other chain of ours, what was read back after our write (nobody changed
    it since: the events say so)."""
    touched = applied.touched or set()
    held: dict[str, TableRules] = {}
    for (table, chain), digest in applied.chains.items():
        if digest is not None and (table, chain) not in touched:
            held.setdefault(table, TableRules()).chains[chain] = digest
    for (table, chain), jumps in applied.jumps.items():
        if (table, chain) not in touched:
            held.setdefault(table, TableRules()).builtin[chain] = jumps
    for table, rules in read.items():
        found = held.setdefault(table, TableRules())
        found.chains.update(rules.chains)
        found.builtin.update(rules.builtin)
    return held


def our_jumps(expressions: Iterable[bytes], targets: Iterable[str]) -> list[bytes]:
    """The rules (by expressions) of a built-in chain that jump to one of ``targets``."""
    names = [t.encode() + b"\0" for t in targets]
    return [e for e in expressions if any(n in e for n in names)]


def compare_kernel(top: Mapping[str, Mapping[str, str]],
                   services: Mapping[ServicePortKey, ServiceRules],
                   held: Mapping[str, TableRules], applied: ReadBack,
                   ) -> tuple[set[ServicePortKey], str]:
    """(the service ports whose chains differ, why the skeleton differs or ""): our
    chains in ``held`` (read now) against ``applied`` (read back after the writes)."""
    for table, chains in top.items():
        found = held.get(table, TableRules())
        for chain in chains:
            why = _kernel_differs(table, chain, found.chains.get(chain), applied)
            if why:
                return set(), why
    for (table, chain), jumps in applied.jumps.items():
        rules = held.get(table, TableRules()).builtin.get(chain, [])
        if any(jump not in rules for jump in jumps):
            return set(), f"{table} {chain} lacks one of our jumps"
    nat = held.get(NAT, TableRules()).chains
    drifted: set[ServicePortKey] = set()
    for key, rules in services.items():
        if any(_kernel_differs(NAT, chain, nat.get(chain), applied) for chain in rules.chains):
            drifted.add(key)
    return drifted, ""


def _kernel_differs(table: str, chain: str, held: ChainDigest | None,
                    applied: ReadBack) -> str:
    if held is None:
        return f"chain {chain} of {table} is gone"
    expected = applied.chains.get((table, chain))
    if expected is None:
        return f"chain {chain} of {table} is not known as written"
    if held.rules != expected.rules:
        return f"chain {chain} of {table} holds {held.rules} rules, not {expected.rules}"
    if held.digest != expected.digest:
        return f"a rule of chain {chain} of {table} was changed"
    return ""

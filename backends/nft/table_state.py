"""What the backend applied to one family's table, and the nft text that changes it.

Kept after every successful apply so that the next change is computed from it
(never from a kernel dump): a full text rewrites the table; a delta text touches
only the chains, sets and map elements of the service ports that changed.

Map elements are shared by key: two service ports may claim the same key (a
ClusterIP in ``cluster-ips``, or a misconfigured duplicate address). Each key
records its owners in claim order; the first owner's value is the one applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.model import ServicePortKey

from .context import FamilyContext
from .service_rules import ServiceRules
from .skeleton import CONTAINERS, MAPS, SETS, chain_block, render_skeleton

ElementId = tuple[str, str]  # (container, key)
Owners = dict[ServicePortKey, str]


@dataclass(slots=True)
class FamilyTable:
    """The applied content of one family's table."""

    ctx: FamilyContext
    services: dict[ServicePortKey, ServiceRules] = field(default_factory=dict)
    owners: dict[ElementId, Owners] = field(default_factory=dict)
    applied: dict[ElementId, str] = field(default_factory=dict)


@dataclass(slots=True)
class Delta:
    """A planned change of one FamilyTable: its nft text and the state after it."""

    text: str
    services: dict[ServicePortKey, ServiceRules | None]
    owners: dict[ElementId, Owners]
    applied: dict[ElementId, str | None]

    @property
    def empty(self) -> bool:
        return not self.text


def _element_claims(rules: ServiceRules | None) -> dict[ElementId, str]:
    return {(e.container, e.key): e.value for e in rules.elements} if rules else {}


def _element_lines(ctx: FamilyContext, verb: str, elements: Mapping[ElementId, str]) -> list[str]:
    """``add``/``delete element`` commands, one per container."""
    by_container: dict[str, list[str]] = {}
    for (container, key), value in elements.items():
        item = f"{key} : {value}" if value and verb == "add" else key
        by_container.setdefault(container, []).append(item)
    head = f"{verb} element {ctx.ipx} {ctx.table}"
    return [f"{head} {c} {{ {', '.join(items)} }}" for c, items in by_container.items()]


def _table_block(ctx: FamilyContext, parts: Iterable[str]) -> str:
    body = "\n".join(parts)
    return f"table {ctx.ipx} {ctx.table} {{\n{body}\n}}" if body else ""


def build_table(ctx: FamilyContext, services: Mapping[ServicePortKey, ServiceRules]) -> FamilyTable:
    """The state a full sync produces."""
    table = FamilyTable(ctx, dict(services))
    for key, rules in services.items():
        for eid, value in _element_claims(rules).items():
            owners = table.owners.setdefault(eid, {})
            owners[key] = value
            if len(owners) == 1:
                table.applied[eid] = value
    return table


def full_text(table: FamilyTable, previous: FamilyTable | None = None) -> str:
    """Text writing the whole table in one transaction.

    Without ``previous`` the table is deleted first (a clean slate). With the
    state applied before (same context), its objects are flushed and rewritten
    instead, so affinity sets keep their contents, and its leftovers are deleted.
    """
    ctx = table.ctx
    ref = f"{ctx.ipx} {ctx.table}"
    sets: dict[str, str] = {}
    chains: dict[str, tuple[str, ...]] = {}
    for rules in table.services.values():
        sets.update(rules.sets)
        chains.update(rules.chains)
    lines = [f"add table {ref}"]
    if previous is None:
        lines.append(f"delete table {ref}")
    else:
        lines.append(f"flush table {ref}")
        lines += [f"flush set {ref} {c}" for c in ("nodeport-ips", *SETS)]
        lines += [f"flush map {ref} {c}" for c in MAPS]
    body = [render_skeleton(ctx)]
    body += [f"\tset {n} {{ {d} }}" for n, d in sets.items()]
    body += [chain_block(n, r) for n, r in chains.items()]
    lines.append(_table_block(ctx, body))
    lines += _element_lines(ctx, "add", table.applied)
    if previous is not None:
        old_chains = {n for r in previous.services.values() for n in r.chains}
        old_sets = {n for r in previous.services.values() for n in r.sets}
        lines += [f"delete chain {ref} {n}" for n in sorted(old_chains - chains.keys())]
        lines += [f"delete set {ref} {n}" for n in sorted(old_sets - sets.keys())]
    return "\n".join(lines) + "\n"


def plan_delta(
    table: FamilyTable, updates: Mapping[ServicePortKey, ServiceRules | None]
) -> Delta:
    """The text and resulting state for replacing some service ports' rules."""
    ctx = table.ctx
    ref = f"{ctx.ipx} {ctx.table}"
    new_chains: dict[str, tuple[str, ...]] = {}
    changed_chains: dict[str, tuple[str, ...]] = {}
    removed_chains: list[str] = []
    new_sets: dict[str, str] = {}
    removed_sets: list[str] = []
    owners: dict[ElementId, Owners] = {}
    changed_services: dict[ServicePortKey, ServiceRules | None] = {}
    for key, new in updates.items():
        old = table.services.get(key)
        if old == new:
            continue
        changed_services[key] = new
        old_chains = old.chains if old else {}
        new_chains_of = new.chains if new else {}
        for name, rules in new_chains_of.items():
            if name not in old_chains:
                new_chains[name] = rules
            elif old_chains[name] != rules:
                changed_chains[name] = rules
        removed_chains += [n for n in old_chains if n not in new_chains_of]
        old_sets = old.sets if old else {}
        new_sets_of = new.sets if new else {}
        new_sets.update({n: d for n, d in new_sets_of.items() if n not in old_sets})
        removed_sets += [n for n in old_sets if n not in new_sets_of]
        _reclaim(table, owners, key, _element_claims(old), _element_claims(new))

    removed_el: dict[ElementId, str] = {}
    added_el: dict[ElementId, str] = {}
    applied: dict[ElementId, str | None] = {}
    for eid, claim in owners.items():
        want = next(iter(claim.values())) if claim else None
        have = table.applied.get(eid)
        if want == have:
            continue
        applied[eid] = want
        if have is not None:
            removed_el[eid] = have
        if want is not None:
            added_el[eid] = want

    lines = [f"add set {ref} {n} {{ {d} }}" for n, d in new_sets.items()]
    lines += [f"add chain {ref} {n}" for n in new_chains]
    lines += [f"flush chain {ref} {n}" for n in (*changed_chains, *removed_chains)]
    written = {**new_chains, **changed_chains}
    if written:
        lines.append(_table_block(ctx, [chain_block(n, r) for n, r in written.items()]))
    lines += _element_lines(ctx, "delete", removed_el)
    lines += _element_lines(ctx, "add", added_el)
    lines += [f"delete chain {ref} {n}" for n in removed_chains]
    lines += [f"delete set {ref} {n}" for n in removed_sets]
    text = "\n".join(lines) + "\n" if lines else ""
    return Delta(text, changed_services, owners, applied)


def _reclaim(
    table: FamilyTable,
    owners: dict[ElementId, Owners],
    key: ServicePortKey,
    old: Mapping[ElementId, str],
    new: Mapping[ElementId, str],
) -> None:
    """Move ``key``'s claims from ``old`` to ``new`` in (copies of) the owner lists."""
    for eid in old.keys() - new.keys():
        claim = owners.setdefault(eid, dict(table.owners.get(eid, {})))
        claim.pop(key, None)
    for eid, value in new.items():
        claim = owners.setdefault(eid, dict(table.owners.get(eid, {})))
        claim[key] = value


def commit(table: FamilyTable, delta: Delta) -> None:
    """Record a delta as applied."""
    for key, rules in delta.services.items():
        if rules is None:
            table.services.pop(key, None)
        else:
            table.services[key] = rules
    for eid, claim in delta.owners.items():
        if claim:
            table.owners[eid] = claim
        else:
            table.owners.pop(eid, None)
    for eid, value in delta.applied.items():
        if value is None:
            table.applied.pop(eid, None)
        else:
            table.applied[eid] = value


__all__ = ["CONTAINERS", "Delta", "FamilyTable", "build_table", "commit", "full_text", "plan_delta"]

"""The claims the applied rules add up to in one family's table, and the nft text
that changes them.

What each service port applied is the SDK's ``Applied`` (the backend's render ->
diff -> apply); this module keeps only what nft needs on top of it to write a
delta: elements may be claimed by several service ports (a ClusterIP in
``cluster-ips``, a pod in ``hairpin``, or a misconfigured duplicate address), so
each element counts its claims and remembers whose value was applied (the element
goes when the last claim does), and each shared ``lb-N`` chain counts its users.
A full text writes the whole table; a delta text touches only the chains, sets and
elements of the service ports that changed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.sdk import ServicePortKey

from .context import TableContext
from .elements import Encoded, update
from .names import lb_chain, lb_map
from .render import ServiceObjects
from .render_skeleton import chain_block, lb_declarations, render_skeleton

ElementId = tuple[str, str]  # (container, key)
# nft splits a long element list over several netlink messages, and then points an
# error at the wrong element of the line: lines this short keep its location exact.
ELEMENTS_PER_LINE = 500
Claimed = tuple[str, ServicePortKey]  # (value, owner)


@dataclass(slots=True)
class FamilyTable:
    """The claims of one family's table (derived from the applied rules)."""

    ctx: TableContext
    claims: dict[ElementId, int] = field(default_factory=dict)
    applied: dict[ElementId, Claimed] = field(default_factory=dict)
    lb_users: dict[int, int] = field(default_factory=dict)  # lb-N size -> service ports
    # The applied elements as the kernel holds them (made by the first drift check,
    # then kept up to date by ``commit``).
    encoded: Encoded | None = None

    @property
    def lb_sizes(self) -> set[int]:
        return set(self.lb_users)


@dataclass(slots=True)
class TableDelta:
    """A planned change of one FamilyTable: its nft text, the service ports' rules it
    writes (None: removed), the claims after it, and the chains it writes and deletes."""

    text: str
    services: dict[ServicePortKey, ServiceObjects | None]
    claims: dict[ElementId, int]
    applied: dict[ElementId, Claimed | None]
    lb_users: dict[int, int]
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.text


def _claims_of(rules: ServiceObjects | None) -> dict[ElementId, str]:
    return {(c, k): v for c, k, v in rules.elements} if rules else {}


def _element_lines(
    ctx: TableContext, verb: str, elements: Iterable[tuple[ElementId, str]]
) -> list[str]:
    """``add``/``delete element`` commands, one per container."""
    by_container: dict[str, list[str]] = {}
    add = verb == "add"
    for (container, key), value in elements:
        items = by_container.get(container)
        if items is None:
            items = by_container[container] = []
        items.append(f"{key} : {value}" if value and add else key)
    head = f"{verb} element {ctx.ipx} {ctx.table}"
    return [f"{head} {c} {{ {', '.join(items[i:i + ELEMENTS_PER_LINE])} }}"
            for c, items in by_container.items()
            for i in range(0, len(items), ELEMENTS_PER_LINE)]


def _table_block(ctx: TableContext, parts: Iterable[str]) -> str:
    body = "\n".join(parts)
    return f"table {ctx.ipx} {ctx.table} {{\n{body}\n}}" if body else ""


def build_table(ctx: TableContext,
                services: Mapping[ServicePortKey, ServiceObjects]) -> FamilyTable:
    """The claims of ``services`` written whole (the first claimant in their order owns
    a shared element)."""
    table = FamilyTable(ctx)
    claims, applied = table.claims, table.applied
    for key, rules in services.items():
        for n in rules.lb_sizes:
            table.lb_users[n] = table.lb_users.get(n, 0) + 1
        # Once per service port, as plan_delta counts (an endpoint of a NodePort service
        # is in ``hairpin`` twice: its ClusterIP and its external chain).
        for eid, v in _claims_of(rules).items():
            n = claims.get(eid, 0)
            claims[eid] = n + 1
            if not n:
                applied[eid] = (v, key)
    return table


def full_text(table: FamilyTable, services: Mapping[ServicePortKey, ServiceObjects]) -> str:
    """Text replacing the whole table by ``services`` (whose claims ``table`` holds) in one
    transaction: the table is deleted first (a clean slate)."""
    ctx = table.ctx
    ref = f"{ctx.ipx} {ctx.table}"
    sets: dict[str, str] = {}
    chains: dict[str, tuple[str, ...]] = {}
    for rules in services.values():
        sets.update(rules.sets)
        chains.update(rules.chains)
    lines = [f"add table {ref}", f"delete table {ref}"]
    body = [render_skeleton(ctx)]
    for n in sorted(table.lb_sizes):
        body += lb_declarations(ctx, n)
    body += [f"\tset {n} {{ {d} }}" for n, d in sets.items()]
    body += [chain_block(n, r) for n, r in chains.items()]
    lines.append(_table_block(ctx, body))
    lines += _element_lines(ctx, "add", ((eid, v) for eid, (v, _) in table.applied.items()))
    return "\n".join(lines) + "\n"


def element_lines(ctx: TableContext, verb: str,
                  elements: Iterable[tuple[ElementId, str]]) -> list[str]:
    """``add``/``delete element`` commands, one per container (at most 500 a line)."""
    return _element_lines(ctx, verb, elements)


def plan_delta(
    table: FamilyTable,
    old: Mapping[ServicePortKey, ServiceObjects],
    updates: Mapping[ServicePortKey, ServiceObjects | None],
    keep: Collection[str] = (),
    existing: Collection[str] = (),
) -> TableDelta:
    """The text and resulting claims for replacing some service ports' rules; ``old`` is
    what every service port applied (``table``'s claims add it up).

    Shared ``lb-N`` objects are created with their first user and deleted
    with their last, so the result equals what a full sync would write. Chains and
    sets named in ``keep`` are not deleted (the kernel refuses: a foreign rule uses
    them); new ones named in ``existing`` (kept so before) are flushed, not created.
    """
    ctx = table.ctx
    ref = f"{ctx.ipx} {ctx.table}"
    new_chains: dict[str, tuple[str, ...]] = {}
    changed_chains: dict[str, tuple[str, ...]] = {}
    removed_chains: list[str] = []
    new_sets: dict[str, str] = {}
    removed_sets: list[str] = []
    changed: dict[ServicePortKey, ServiceObjects | None] = {}
    count_change: dict[ElementId, int] = {}
    wanted: dict[ElementId, dict[ServicePortKey, str]] = {}
    users: dict[int, int] = {}
    for key, new in updates.items():
        before = old.get(key)
        if before == new:
            continue
        changed[key] = new
        old_chains = before.chains if before else {}
        new_chains_of = new.chains if new else {}
        for name, rules in new_chains_of.items():
            if name not in old_chains:
                new_chains[name] = rules
            elif old_chains[name] != rules:
                changed_chains[name] = rules
        removed_chains += [n for n in old_chains if n not in new_chains_of]
        old_sets = before.sets if before else {}
        new_sets_of = new.sets if new else {}
        new_sets.update({n: d for n, d in new_sets_of.items() if n not in old_sets})
        removed_sets += [n for n in old_sets if n not in new_sets_of]
        for n in before.lb_sizes if before else ():
            users[n] = users.get(n, table.lb_users.get(n, 0)) - 1
        for n in new.lb_sizes if new else ():
            users[n] = users.get(n, table.lb_users.get(n, 0)) + 1
        old_claims, new_claims = _claims_of(before), _claims_of(new)
        for eid in old_claims.keys() - new_claims.keys():
            count_change[eid] = count_change.get(eid, 0) - 1
        for eid, value in new_claims.items():
            if eid not in old_claims:
                count_change[eid] = count_change.get(eid, 0) + 1
            wanted.setdefault(eid, {})[key] = value
    for eid in old_claims_touched(old, changed):
        count_change.setdefault(eid, 0)

    claims: dict[ElementId, int] = {}
    applied: dict[ElementId, Claimed | None] = {}
    removed_el: dict[ElementId, str] = {}
    added_el: dict[ElementId, str] = {}
    for eid, delta in count_change.items():
        count = table.claims.get(eid, 0) + delta
        claims[eid] = count
        have = table.applied.get(eid)
        want = _winner(old, changed, wanted.get(eid, {}), eid, have) if count else None
        if want == have:
            continue
        applied[eid] = want
        if have is not None and (want is None or want[0] != have[0]):
            removed_el[eid] = have[0]
        if want is not None and (have is None or want[0] != have[0]):
            added_el[eid] = want[0]

    new_sizes = sorted(n for n, c in users.items() if c and n not in table.lb_users)
    stale_sizes = sorted(n for n, c in users.items() if not c and n in table.lb_users)
    lines = [f"add set {ref} {n} {{ {d} }}" for n, d in new_sets.items()]
    lb_lines = [line for n in new_sizes for line in lb_declarations(ctx, n)]
    lines.append(_table_block(ctx, lb_lines))
    removed_chains = [n for n in removed_chains if n not in keep]
    removed_sets = [n for n in removed_sets if n not in keep]
    lines += [f"add chain {ref} {n}" for n in new_chains]
    lines += [f"flush chain {ref} {n}" for n in new_chains if n in existing]
    lines += [f"flush chain {ref} {n}" for n in (*changed_chains, *removed_chains)]
    written = {**new_chains, **changed_chains}
    lines.append(_table_block(ctx, [chain_block(n, r) for n, r in written.items()]))
    lines += _element_lines(ctx, "delete", removed_el.items())
    lines += _element_lines(ctx, "add", added_el.items())
    lines += [f"delete chain {ref} {n}" for n in removed_chains]
    lines += [f"delete set {ref} {n}" for n in removed_sets]
    lines += [f"delete chain {ref} {lb_chain(n)}" for n in stale_sizes]
    lines += [f"delete map {ref} {lb_map(n)}" for n in stale_sizes]
    lines = [line for line in lines if line]
    text = "\n".join(lines) + "\n" if lines else ""
    return TableDelta(text, changed, claims, applied, users,
                      (*written, *(lb_chain(n) for n in new_sizes)),
                      (*removed_chains, *(lb_chain(n) for n in stale_sizes)))


def old_claims_touched(
    old: Mapping[ServicePortKey, ServiceObjects],
    changed: Mapping[ServicePortKey, ServiceObjects | None],
) -> set[ElementId]:
    """Elements the changed service ports claimed before (their value may change hands)."""
    touched: set[ElementId] = set()
    for key in changed:
        touched |= _claims_of(old.get(key)).keys()
    return touched


def _winner(
    old: Mapping[ServicePortKey, ServiceObjects],
    changed: Mapping[ServicePortKey, ServiceObjects | None],
    wanted: Mapping[ServicePortKey, str],
    eid: ElementId,
    have: Claimed | None,
) -> Claimed:
    """Whose value the element carries: the current owner's while it claims it."""
    if have is not None:
        owner = have[1]
        if owner not in changed:
            return have
        if owner in wanted:
            return (wanted[owner], owner)
    if wanted:
        owner, value = next(iter(wanted.items()))
        return (value, owner)
    for key, rules in old.items():  # rare: the owner left a shared element
        if key not in changed:
            claimed = _claims_of(rules).get(eid)
            if claimed is not None:
                return (claimed, key)
    raise AssertionError(f"element {eid} is claimed but has no claimant")


def commit(table: FamilyTable, delta: TableDelta) -> None:
    """Record a delta's claims as applied (its rules are the caller's to record)."""
    for eid, count in delta.claims.items():
        if count:
            table.claims[eid] = count
        else:
            table.claims.pop(eid, None)
    encoded, ipx = table.encoded, table.ctx.ipx
    for eid, value in delta.applied.items():
        if encoded is not None:
            before = table.applied.get(eid)
            update(encoded, ipx, eid, before[0] if before else None,
                   value[0] if value else None)
        if value is None:
            table.applied.pop(eid, None)
        else:
            table.applied[eid] = value
    for n, count in delta.lb_users.items():
        if count:
            table.lb_users[n] = count
        else:
            table.lb_users.pop(n, None)

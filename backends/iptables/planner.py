"""What one family's next iptables-restore must write, from what was applied (pure).

The planner keeps, per service port, the input it last rendered and the
fragment it produced, plus the text of every chain it believes is in the
kernel. A partial plan re-renders only the candidate service ports and writes
only chains whose text changed (kube-proxy's partial sync, KEP-3453, but
also skipping unchanged top-level chains). A full plan writes every chain
and deletes stale service chains found in the kernel. Nothing changes in the
planner until ``commit`` is called after a successful apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.render import (
    LARGE_CLUSTER_ENDPOINTS,
    FamilyConfig,
    ServiceRules,
    render_service,
)
from svcproxy.backends.iptables.restore import TableChanges
from svcproxy.backends.iptables.toplevel import FIELDS, FILTER, NAT, top_level
from svcproxy.sdk import ServicePortKey, ServicePortState

Fragment = tuple[ServicePortState, ServiceRules | None]
Fragments = dict[ServicePortKey, Fragment]
Entry = tuple[ServicePortKey, ServicePortState | None, Fragment | None]


@dataclass(slots=True)
class Plan:
    """A transaction for one family and the planner state to adopt once it is applied."""

    tables: dict[str, TableChanges]
    fragments: Fragments
    top: dict[str, dict[str, str]]
    large: bool
    endpoint_total: int
    full: bool
    rendered: int = 0
    rules: dict[str, int] = field(default_factory=dict)
    chains: dict[str, int] = field(default_factory=dict)

    def empty(self) -> bool:
        return all(t.empty() for t in self.tables.values())


class Planner:
    """Diffing state of one IP family."""

    def __init__(self, cfg: FamilyConfig) -> None:
        self.cfg = cfg
        self.fragments: Fragments = {}
        self.top: dict[str, dict[str, str]] = {}
        self.large = False
        self.endpoint_total = 0
        self.rules: dict[str, int] = {}
        self.chains: dict[str, int] = {}
        self.synced = False

    def reconfigure(self, cfg: FamilyConfig) -> bool:
        """Adopt a new config; True (and everything to re-render) if it differs."""
        if cfg == self.cfg:
            return False
        self.cfg = cfg
        self.forget()
        return True

    def forget(self) -> None:
        """Drop what was applied: the next plan must be full."""
        self.fragments = {}
        self.top = {}
        self.rules = {}
        self.chains = {}
        self.synced = False

    def plan(self, services: Mapping[ServicePortKey, ServicePortState],
             candidates: Iterable[ServicePortKey] | None,
             existing_nat_chains: frozenset[str] | None = None) -> Plan:
        """Plan a sync. ``candidates`` None means full: re-check and write everything."""
        full = candidates is None or not self.synced
        entries = [] if full else self._entries(services, candidates or ())
        if full:
            endpoint_total = sum(len(s.endpoints) for s in services.values())
        else:
            endpoint_total = self._endpoint_total_after(entries)
        large = endpoint_total > LARGE_CLUSTER_ENDPOINTS
        if large != self.large and self.synced:
            full = True
        if full:
            entries = [(k, services[k], self.fragments.get(k)) for k in sorted(services)]
        fragments, changed, rendered = self._render(entries, full, large)
        live = (f for _, f in fragments.values() if f is not None)
        if full:
            top = top_level(self.cfg, live)
            tables = self._full_tables(fragments, top, existing_nat_chains or frozenset())
            rules = {t: sum(map(_lines, c.write.values())) for t, c in tables.items()}
            chains = {t: len(c.write) for t, c in tables.items()}
        else:
            top = top_level(self.cfg, live, self.top, self._dirty_fields(fragments, changed))
            tables = self._partial_tables(fragments, top, changed)
            rules, chains = self._counts_after(tables, changed)
        return Plan(tables=tables, fragments=fragments, top=top, large=large,
                    endpoint_total=endpoint_total, full=full, rendered=rendered, rules=rules,
                    chains=chains)

    def _counts_after(self, tables: dict[str, TableChanges], changed: list[ServicePortKey],
                      ) -> tuple[dict[str, int], dict[str, int]]:
        """Rules and chains of ours per table once a partial plan is applied."""
        rules, chains = dict(self.rules), dict(self.chains)
        for table, changes in tables.items():
            old = dict(self.top.get(table, {}))
            if table == NAT:
                for key in changed:
                    before = self.fragments.get(key)
                    old.update(before[1].chains if before and before[1] else {})
            delta = sum(map(_lines, changes.write.values()))
            delta -= sum(_lines(old.get(c, "")) for c in [*changes.write, *changes.delete])
            rules[table] = rules.get(table, 0) + delta
            added = sum(1 for c in changes.write if c not in old)
            chains[table] = chains.get(table, 0) + added - len(changes.delete)
        return rules, chains

    def _render(self, entries: list[Entry], full: bool, large: bool,
                ) -> tuple[Fragments, list[ServicePortKey], int]:
        """Fragments after re-rendering the entries whose input changed (or all, if full)."""
        fragments: Fragments = {} if full else dict(self.fragments)
        changed: list[ServicePortKey] = []
        rendered = 0
        for key, state, old in entries:
            if state is None:
                if fragments.pop(key, None) is not None:
                    changed.append(key)
                continue
            if old is not None and large == self.large and (old[0] is state or old[0] == state):
                fragments[key] = old
                continue
            fragments[key] = (state, render_service(state, self.cfg, large))
            rendered += 1
            changed.append(key)
        return fragments, changed, rendered

    def _entries(self, services: Mapping[ServicePortKey, ServicePortState],
                 candidates: Iterable[ServicePortKey]) -> list[Entry]:
        """(key, new state, applied fragment) of the candidates and of applied service
        ports gone from ``services`` (scanned for only if the counts say some are).

        Each key is looked up once: hashing a ServicePortKey is most of a periodic
        sync's cost at 10,000 service ports.
        """
        listed = candidates if isinstance(candidates, (set, frozenset)) else set(candidates)
        entries = [(k, services.get(k), self.fragments.get(k)) for k in listed]
        added = sum(1 for _, new, old in entries if new is not None and old is None)
        removed = sum(1 for _, new, old in entries if new is None and old is not None)
        if len(self.fragments) + added - removed != len(services):
            entries += [(k, None, old) for k, old in self.fragments.items()
                        if k not in services and k not in listed]
        return entries

    def _dirty_fields(self, fragments: Fragments,
                      changed: list[ServicePortKey]) -> frozenset[str]:
        """The fragment fields (of shared chains) that some changed service port altered."""
        dirty: set[str] = set()
        empty = ServiceRules()
        for key in changed:
            before = self.fragments.get(key)
            after = fragments.get(key)
            old = before[1] if before and before[1] else empty
            new = after[1] if after and after[1] else empty
            dirty.update(f for f in FIELDS if getattr(old, f) != getattr(new, f))
        return frozenset(dirty)

    def commit(self, plan: Plan) -> None:
        """Adopt a plan that is now in the kernel."""
        self.fragments = plan.fragments
        self.top = plan.top
        self.large = plan.large
        self.endpoint_total = plan.endpoint_total
        self.rules = plan.rules
        self.chains = plan.chains
        self.synced = True

    def _endpoint_total_after(self, entries: list[Entry]) -> int:
        total = self.endpoint_total
        for _, new, old in entries:
            if old is not None and old[0] is new:
                continue
            if old is not None:
                total -= len(old[0].endpoints)
            if new is not None:
                total += len(new.endpoints)
        return total

    def _full_tables(self, fragments: Fragments,
                     top: dict[str, dict[str, str]],
                     existing: frozenset[str]) -> dict[str, TableChanges]:
        nat = TableChanges(write=dict(top[NAT]))
        for _, frag in fragments.values():
            if frag is not None:
                nat.write.update(frag.chains)
        nat.delete = sorted(c for c in existing if names.is_service_chain(c)
                            and c not in nat.write)
        return {FILTER: TableChanges(write=dict(top[FILTER])), NAT: nat}

    def _partial_tables(self, fragments: Fragments,
                        top: dict[str, dict[str, str]],
                        changed: list[ServicePortKey]) -> dict[str, TableChanges]:
        tables = {FILTER: TableChanges(), NAT: TableChanges()}
        for table, chains in top.items():
            old = self.top.get(table, {})
            for chain, text in chains.items():
                if old.get(chain) != text:
                    tables[table].write[chain] = text
            tables[table].delete.extend(c for c in old if c not in chains)
        nat = tables[NAT]
        for key in changed:
            before = self.fragments.get(key)
            after = fragments.get(key)
            old_chains = before[1].chains if before and before[1] else {}
            new_chains = after[1].chains if after and after[1] else {}
            for chain, text in new_chains.items():
                if old_chains.get(chain) != text:
                    nat.write[chain] = text
            nat.delete.extend(c for c in old_chains if c not in new_chains)
        return tables



def _lines(text: str) -> int:
    return text.count("\n")

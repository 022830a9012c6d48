"""One family's iptables-restore transaction, from the SDK's delta (pure).

The backend is a ``StagedBackend``: its ``render`` stage turns a service port into a
``Rendered`` value (its rules in every family), the SDK's ``diff`` stage compares the
values with what is applied (``Applied``, the one record of what the kernel holds) and
hands the ``apply`` stage a ``Delta``. A ``Planner`` turns that delta into one family's
transaction. A rebuild writes every chain and deletes stale service chains found in
the kernel; otherwise only the chains of changed service ports whose text changed, and
the shared top-level chains that a changed fragment field feeds (kube-proxy's partial
sync, KEP-3453, also skipping unchanged top-level chains). The planner keeps only what
derives from the applied values (the top-level chains' text and the rule counts), and
adopts a plan with ``commit`` once the kernel took it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.render import (
    LARGE_CLUSTER_ENDPOINTS,
    FamilyConfig,
    ServiceRules,
    render_service,
)
from svcproxy.backends.iptables.render_restore import TableChanges
from svcproxy.backends.iptables.render_toplevel import FIELDS, FILTER, NAT, top_level
from svcproxy.sdk import Delta, ServicePortKey, ServicePortState


@dataclass(frozen=True, slots=True)
class Rendered:
    """What one service port holds in the kernel: the record rendered and its rules per
    family, in the backend's family order (None: no ClusterIP of that family)."""

    record: ServicePortState
    rules: tuple[ServiceRules | None, ...]


Values = Mapping[ServicePortKey, Rendered]


def large_cluster(records: Iterable[ServicePortState]) -> bool:
    """kube-proxy's large-cluster mode (no comments on endpoint rules): more than 1,000
    endpoints in all."""
    return sum(len(r.endpoints) for r in records) > LARGE_CLUSTER_ENDPOINTS


def render(record: ServicePortState, configs: Sequence[FamilyConfig],
           large: bool = False) -> Rendered:
    """The render stage: one service port in every family."""
    return Rendered(record, tuple(render_service(record, cfg, large) for cfg in configs))


@dataclass(slots=True)
class Plan:
    """A transaction for one family and what the planner adopts once it is applied."""

    tables: dict[str, TableChanges]
    top: dict[str, dict[str, str]]
    full: bool
    rules: dict[str, int] = field(default_factory=dict)
    chains: dict[str, int] = field(default_factory=dict)

    def empty(self) -> bool:
        return all(t.empty() for t in self.tables.values())

    def written(self) -> dict[str, int]:
        """Rules this transaction writes, per table (kube-proxy's iptables_last)."""
        return {table: sum(map(_lines, changes.write.values())) + len(changes.lines)
                for table, changes in self.tables.items()}


class Planner:
    """One family: its config, its index in ``Rendered.rules`` and the top-level chains
    and rule counts of what is applied."""

    def __init__(self, cfg: FamilyConfig, index: int = 0) -> None:
        self.cfg = cfg
        self.index = index
        self.top: dict[str, dict[str, str]] = {}
        self.rules: dict[str, int] = {}
        self.chains: dict[str, int] = {}

    @property
    def synced(self) -> bool:
        """True once a plan was committed (and not forgotten since)."""
        return bool(self.top)

    def reconfigure(self, cfg: FamilyConfig) -> bool:
        """Adopt a new config; True (everything must be rewritten) if it differs."""
        if cfg == self.cfg:
            return False
        self.cfg = cfg
        self.forget()
        return True

    def forget(self) -> None:
        """The kernel may hold anything: the next plan must be a full one."""
        self.top, self.rules, self.chains = {}, {}, {}

    def full(self, values: Values, existing_nat_chains: frozenset[str] = frozenset()) -> Plan:
        """Every chain of ``values`` (all that must be applied), and the deletion of the
        service chains among ``existing_nat_chains`` that none of them writes."""
        live = [r for k in sorted(values) if (r := values[k].rules[self.index]) is not None]
        top = top_level(self.cfg, live)
        nat = TableChanges(write=dict(top[NAT]))
        for rules in live:
            nat.write.update(rules.chains)
        nat.delete = sorted(c for c in existing_nat_chains
                            if names.is_service_chain(c) and c not in nat.write)
        tables = {FILTER: TableChanges(write=dict(top[FILTER])), NAT: nat}
        rules_after = {t: sum(map(_lines, c.write.values())) for t, c in tables.items()}
        chains_after = {t: len(c.write) for t, c in tables.items()}
        return Plan(tables, top, True, rules_after, chains_after)

    def partial(self, applied: Values, delta: Delta[ServicePortKey, Rendered]) -> Plan:
        """The chains ``delta`` changes on top of ``applied`` (needs a committed plan)."""
        i = self.index
        changed = [*delta.set, *delta.removed]
        old = {k: _rules(delta.previous.get(k) or delta.removed.get(k), i) for k in changed}
        new = {k: _rules(delta.set.get(k), i) for k in changed}
        dirty = _dirty_fields(old, new)
        live = _live(applied, delta, i) if dirty else iter(())
        top = top_level(self.cfg, live, self.top, dirty)
        tables = {FILTER: TableChanges(), NAT: TableChanges()}
        for table, chains in top.items():
            before = self.top.get(table, {})
            tables[table].write.update((c, t) for c, t in chains.items() if before.get(c) != t)
            tables[table].delete.extend(c for c in before if c not in chains)
        nat = tables[NAT]
        for key in changed:
            was, now = old[key], new[key]
            old_chains = was.chains if was else {}
            new_chains = now.chains if now else {}
            nat.write.update((c, t) for c, t in new_chains.items() if old_chains.get(c) != t)
            nat.delete.extend(c for c in old_chains if c not in new_chains)
        rules_after, chains_after = self._counts_after(tables, old)
        return Plan(tables, top, False, rules_after, chains_after)

    def _counts_after(self, tables: dict[str, TableChanges],
                      old: dict[ServicePortKey, ServiceRules | None],
                      ) -> tuple[dict[str, int], dict[str, int]]:
        """Rules and chains of ours per table once a partial plan is applied."""
        rules, chains = dict(self.rules), dict(self.chains)
        for table, changes in tables.items():
            before = dict(self.top.get(table, {}))
            if table == NAT:
                for frag in old.values():
                    before.update(frag.chains if frag else {})
            delta = sum(map(_lines, changes.write.values()))
            delta -= sum(_lines(before.get(c, "")) for c in [*changes.write, *changes.delete])
            rules[table] = rules.get(table, 0) + delta
            added = sum(1 for c in changes.write if c not in before)
            chains[table] = chains.get(table, 0) + added - len(changes.delete)
        return rules, chains

    def commit(self, plan: Plan) -> None:
        """Adopt a plan that is now in the kernel."""
        self.top = plan.top
        self.rules = plan.rules
        self.chains = plan.chains


def after(applied: Values, delta: Delta[ServicePortKey, Rendered]) -> dict[ServicePortKey,
                                                                            Rendered]:
    """Everything applied once ``delta`` is."""
    if delta.rebuild:
        return dict(delta.set)
    values = {k: v for k, v in applied.items() if k not in delta.removed}
    values.update(delta.set)
    return values


def _rules(value: Rendered | None, index: int) -> ServiceRules | None:
    return value.rules[index] if value is not None else None


def _live(applied: Values, delta: Delta[ServicePortKey, Rendered],
          index: int) -> Iterator[ServiceRules]:
    """One family's fragments once ``delta`` is applied (in applied order, new ones last:
    the order of KUBE-SERVICES' rules does not matter, and sorting 10,000 keys would)."""
    for value in after(applied, delta).values():
        if (rules := value.rules[index]) is not None:
            yield rules


def _dirty_fields(old: Mapping[ServicePortKey, ServiceRules | None],
                  new: Mapping[ServicePortKey, ServiceRules | None]) -> frozenset[str]:
    """The fragment fields (of shared chains) that some changed service port altered."""
    empty = ServiceRules()
    dirty: set[str] = set()
    for key, before in old.items():
        a, b = before or empty, new[key] or empty
        dirty.update(f for f in FIELDS if getattr(a, f) != getattr(b, f))
    return frozenset(dirty)


def _lines(text: str) -> int:
    return text.count("\n")


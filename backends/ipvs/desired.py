"""The node's desired IPVS programming, kept up to date one service port at a time (pure).

Each service port's plan is added and removed as a whole; addresses and ipset
entries are reference-counted because several ports (and services) can share
them. Every update reports what it touched so that only that is diffed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs.genl import ServiceId, ServiceSpec, fwmark_service
from svcproxy.backends.ipvs.render import PortPlan, VirtualServer
from svcproxy.sdk import ServicePortKey


@dataclass(slots=True)
class Touched:
    """The objects whose desired state may have changed."""

    servers: set[ServiceId] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    routes: set[str] = field(default_factory=set)
    entries: set[tuple[str, str]] = field(default_factory=set)

    def add_plan(self, plan: PortPlan) -> None:
        self.servers.update(v.spec.id for v in plan.servers)
        self.addresses |= plan.addresses
        self.routes |= plan.local_routes
        self.entries |= plan.entries


MARK_SHIFT = 16
MAX_MARKS = 0xFFFF


def is_our_fwmark(mark: int) -> bool:
    """Marks this backend allocates: bits 16-31 only (clear of the 0x4000 masquerade bit)."""
    return mark > 0 and not mark & ((1 << MARK_SHIFT) - 1)


@dataclass(slots=True)
class MarkAllocator:
    """One firewall mark per (service port, family), stable while the port needs it."""

    marks: dict[tuple[ServicePortKey, int], int] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    next_index: int = 1

    def get(self, key: ServicePortKey, family: int) -> int:
        if (key, family) not in self.marks:
            if self.free:
                mark = self.free.pop()
            elif self.next_index <= MAX_MARKS:
                mark = self.next_index << MARK_SHIFT
                self.next_index += 1
            else:
                raise OverflowError("more than 65535 externalTrafficPolicy=Local service ports")
            self.marks[(key, family)] = mark
        return self.marks[(key, family)]

    def release(self, key: ServicePortKey, keep: set[int]) -> None:
        """Free the marks of ``key`` for families not in ``keep``."""
        for family in (4, 6):
            if family not in keep and (key, family) in self.marks:
                self.free.append(self.marks.pop((key, family)))


@dataclass(slots=True)
class Desired:
    plans: dict[ServicePortKey, PortPlan] = field(default_factory=dict)
    claims: dict[ServiceId, dict[ServicePortKey, VirtualServer]] = field(default_factory=dict)
    addresses: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    entries: Counter[tuple[str, str]] = field(default_factory=Counter)
    marks: MarkAllocator = field(default_factory=MarkAllocator)

    def set_plan(self, key: ServicePortKey, plan: PortPlan | None, touched: Touched) -> None:
        """Replace the plan of one service port (None removes it)."""
        old = self.plans.pop(key, None)
        if old is not None:
            touched.add_plan(old)
            self._count(key, old, -1)
        needed = {c.family for c in plan.short_circuits} if plan is not None else set()
        self.marks.release(key, needed)
        if plan is not None:
            plan = self._with_marks(key, plan)
            touched.add_plan(plan)
            self.plans[key] = plan
            self._count(key, plan, +1)

    def release_marks_of_gone_ports(self) -> None:
        """Free the marks of service ports that have no plan (after a full re-render)."""
        for key, _family in list(self.marks.marks):
            if key not in self.plans:
                self.marks.release(key, set())

    def _with_marks(self, key: ServicePortKey, plan: PortPlan) -> PortPlan:
        """The plan plus its firewall-mark virtual servers and their ipset entries."""
        if not plan.short_circuits:
            return plan
        servers = list(plan.servers)
        entries = set(plan.entries)
        for c in plan.short_circuits:
            mark = self.marks.get(key, c.family)
            spec = ServiceSpec(fwmark_service(c.family, mark), c.scheduler, c.persistence)
            servers.append(VirtualServer(spec, c.dests))
            name = S.set_name(S.EXTERNAL_LOCAL_FWMARK, c.family)
            entries.update((name, f"{t} skbmark {mark:#x}") for t in c.targets)
        return replace(plan, servers=tuple(servers), entries=frozenset(entries))

    def _count(self, key: ServicePortKey, plan: PortPlan, sign: int) -> None:
        for server in plan.servers:
            claims = self.claims.setdefault(server.spec.id, {})
            if sign > 0:
                claims[key] = server
            else:
                claims.pop(key, None)
                if not claims:
                    del self.claims[server.spec.id]
        for counter, items in ((self.addresses, plan.addresses), (self.routes, plan.local_routes),
                               (self.entries, plan.entries)):
            counter.update({item: sign for item in items})
            for item in items:
                if counter[item] <= 0:
                    del counter[item]

    def server(self, sid: ServiceId) -> VirtualServer | None:
        """The virtual server wanted at ``sid``; the first service port (by key) wins."""
        claims = self.claims.get(sid)
        if not claims:
            return None
        return claims[min(claims)]

    def conflicts(self) -> list[str]:
        """Human-readable lines for addresses claimed by more than one service port."""
        return [
            f"{sid} is wanted by {', '.join(str(k) for k in sorted(c))}; using {min(c)}"
            for sid, c in sorted(self.claims.items()) if len(c) > 1
        ]

    def entries_by_set(self) -> dict[str, set[str]]:
        result: dict[str, set[str]] = {}
        for name, value in self.entries:
            result.setdefault(name, set()).add(value)
        return result

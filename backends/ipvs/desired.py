"""The node's desired IPVS objects, indexed from the service ports' plans (pure).

The plans themselves are the SDK's applied state (``StagedBackend.applied``, one
``PortPlan`` per service port); this index turns them into kernel objects: virtual
servers by id (with the ports that claim them), reference-counted addresses, routes
and ipset entries (several ports and services share them), and the firewall marks
allocated to the externalTrafficPolicy=Local short-circuits. Each change swaps one
port's previous plan for its new one and reports what it touched, so that only that
is diffed against the kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container
from dataclasses import dataclass, field, replace

from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs.genl import ServiceId, ServiceSpec, fwmark_service
from svcproxy.backends.ipvs.render import PortPlan, VirtualServer
from svcproxy.sdk import ServicePortKey


@dataclass(slots=True)
class TouchedObjects:
    """The kernel objects whose desired state may have changed."""

    servers: set[ServiceId] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    routes: set[str] = field(default_factory=set)
    entries: set[tuple[str, str]] = field(default_factory=set)

    def add_plan(self, plan: PortPlan) -> None:
        self.servers.update(v.spec.id for v in plan.servers)
        self.addresses |= plan.addresses
        self.routes |= plan.local_routes
        self.entries |= plan.entries


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
            elif self.next_index <= N.MAX_MARKS:
                mark = self.next_index << N.MARK_SHIFT
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
    """Every kernel object the applied plans want (see the module's docstring)."""

    claims: dict[ServiceId, dict[ServicePortKey, VirtualServer]] = field(default_factory=dict)
    addresses: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    entries: Counter[tuple[str, str]] = field(default_factory=Counter)
    marks: MarkAllocator = field(default_factory=MarkAllocator)

    def replace(self, key: ServicePortKey, old: PortPlan | None, new: PortPlan | None,
                touched: TouchedObjects) -> None:
        """Swap the plan of one service port: ``old`` (what the index holds for it, the
        applied plan) for ``new`` (None: none)."""
        if old is not None:
            marked = self._with_marks(key, old)
            touched.add_plan(marked)
            self._count(key, marked, -1)
        needed = {c.family for c in new.short_circuits} if new is not None else set()
        self.marks.release(key, needed)
        if new is not None:
            marked = self._with_marks(key, new)
            touched.add_plan(marked)
            self._count(key, marked, +1)

    def release_marks_except(self, keys: Container[ServicePortKey]) -> None:
        """Free the marks of service ports not in ``keys`` (after a rebuild)."""
        for key, _family in list(self.marks.marks):
            if key not in keys:
                self.marks.release(key, set())

    def marked(self, key: ServicePortKey, plan: PortPlan) -> PortPlan:
        """The applied plan of ``key`` as the kernel holds it: with its firewall-mark
        virtual servers and their ipset entries."""
        return self._with_marks(key, plan)

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
            name = N.set_name(N.EXTERNAL_LOCAL_FWMARK, c.family)
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

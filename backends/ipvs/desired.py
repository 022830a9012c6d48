"""The node's desired IPVS programming, kept up to date one service port at a time (pure).

Each service port's plan is added and removed as a whole; addresses and ipset
entries are reference-counted because several ports (and services) can share
them. Every update reports what it touched so that only that is diffed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from svcproxy.backends.ipvs.genl import ServiceId
from svcproxy.backends.ipvs.render import PortPlan, VirtualServer
from svcproxy.model import ServicePortKey


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


@dataclass(slots=True)
class Desired:
    plans: dict[ServicePortKey, PortPlan] = field(default_factory=dict)
    claims: dict[ServiceId, dict[ServicePortKey, VirtualServer]] = field(default_factory=dict)
    addresses: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    entries: Counter[tuple[str, str]] = field(default_factory=Counter)

    def set_plan(self, key: ServicePortKey, plan: PortPlan | None, touched: Touched) -> None:
        """Replace the plan of one service port (None removes it)."""
        old = self.plans.pop(key, None)
        if old is not None:
            touched.add_plan(old)
            self._count(key, old, -1)
        if plan is not None:
            touched.add_plan(plan)
            self.plans[key] = plan
            self._count(key, plan, +1)

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

"""What of one family's table the kernel no longer holds as applied (pure).

Compared with what the backend applied (the claims of ``FamilyTable`` and each service
port's ``ServiceObjects``): every chain of ours by its rule count and the digest of its
rules' messages that the kernel showed right after the backend wrote it (``Learnt``:
read back at apply time, as the kernel's encoding cannot be predicted from the text; a
chain without one is not known as written, and is drift); every set and map of ours by
name; the elements of our shared sets and maps key by key and value by value. A chain,
set or element of the skeleton (what every service port relies on) that differs, or an
element nobody applied in one of our maps, is the skeleton's drift: the table is
rewritten. A service port's own chain, set or element that differs is that service
port's drift: it is written again. Objects that are not ours (a chain someone added to
our table) are not looked at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.sdk import ServicePortKey

from .elements import Held, encode, encode_all
from .kernel_view import ADDR, TableView, encoder
from .names import lb_chain, lb_map
from .render import ServiceObjects
from .render_skeleton import BASE_CHAINS, CONTAINERS, lb_rules, skeleton_chains
from .render_table import FamilyTable

NF_ACCEPT = 1
_BASE = frozenset(name for name, *_ in BASE_CHAINS)


@dataclass(slots=True)
class Learnt:
    """Per chain: the digest the kernel showed for its rules right after the backend
    wrote them (read back then, so known at apply time)."""

    chains: dict[str, bytes] = field(default_factory=dict)

    def same(self, name: str, digest: bytes) -> bool:
        """False when the chain is not known as written or its digest differs."""
        return self.chains.get(name) == digest

    def learn(self, digests: Mapping[str, bytes]) -> None:
        """These chains were written and read back."""
        self.chains.update(digests)

    def forget(self, names: Iterable[str]) -> None:
        """These chains were written (and not read back) or deleted."""
        for name in names:
            self.chains.pop(name, None)


def compare(table: FamilyTable, services: Mapping[ServicePortKey, ServiceObjects],
            view: TableView | None, learnt: Learnt) -> tuple[set[ServicePortKey], str]:
    """(the service ports whose objects differ, why the skeleton differs or "")."""
    ctx = table.ctx
    if view is None:
        return set(), f"table {ctx.ipx} {ctx.table} is gone"
    why = _skeleton(table, view, learnt)
    if why:
        return set(), why
    drifted, why = _elements(table, view)
    if why:
        return set(), why
    chains = view.chains
    for key, rules in services.items():
        if key in drifted:
            continue
        for name, body in rules.chains.items():
            chain = chains.get(name)
            if chain is None or chain.rules != len(body) or not learnt.same(
                    name, chain.digest):
                drifted.add(key)
                break
        else:
            if rules.sets and any(name not in view.sets for name in rules.sets):
                drifted.add(key)
    return drifted, ""


def _skeleton(table: FamilyTable, view: TableView, learnt: Learnt) -> str:
    """Why the fixed chains, sets and maps, and the ``lb-N`` ones in use, differ, or ""."""
    ctx = table.ctx
    wanted = skeleton_chains(ctx)
    wanted.update((lb_chain(n), lb_rules(ctx, n)) for n in table.lb_sizes)
    for name, body in wanted.items():
        chain = view.chains.get(name)
        if chain is None:
            return f"chain {name} is gone"
        if chain.rules != len(body):
            return f"chain {name} holds {chain.rules} rules, not {len(body)}"
        if name in _BASE and chain.policy not in (None, NF_ACCEPT):
            return f"base chain {name}'s policy is not accept"
        if not learnt.same(name, chain.digest):
            return f"a rule of chain {name} was changed or is not known as written"
    sets = [*CONTAINERS, *(lb_map(n) for n in table.lb_sizes)]
    if ctx.nodeport_ips is not None:
        sets.append("nodeport-ips")
    for name in sets:
        if name not in view.sets:
            return f"set or map {name} is gone"
    if ctx.nodeport_ips is not None:
        held = view.elements.get("nodeport-ips", {})
        address = encoder((ADDR,), ctx.ipx)
        if set(held) != {address(ip) for ip in ctx.nodeport_ips}:
            return "set nodeport-ips does not hold the node's NodePort addresses"
    return ""


def _elements(table: FamilyTable, view: TableView) -> tuple[set[ServicePortKey], str]:
    """The owners of elements missing or holding another value; why the skeleton
    differs (an element nobody applied) or ""."""
    if table.encoded is None:
        table.encoded = encode_all(table.ctx.ipx, table.applied)
    values = table.encoded
    drifted: set[ServicePortKey] = set()
    for container, held in view.elements.items():
        wanted = values.get(container, {})
        if container == "nodeport-ips" or held == wanted:
            continue
        drifted.update(owner for k, (v, owner) in _owners(table, container).items()
                       if held.get(k) != v)
        extra = [k for k in held if k not in wanted]
        if extra:
            return set(), f"{container} holds {len(extra)} elements not ours"
    return drifted, ""


def _owners(table: FamilyTable, container: str) -> dict[bytes, tuple[Held, ServicePortKey]]:
    """One container's applied elements: key bytes -> (value as held, owner)."""
    found = {}
    for (c, key), (value, owner) in table.applied.items():
        if c == container:
            raw, held = encode(table.ctx.ipx, c, key, value)
            found[raw] = (held, owner)
    return found

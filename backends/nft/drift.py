"""What of one family's table the kernel no longer holds as applied (pure).

Compared with what the backend applied (the claims of ``FamilyTable`` and each service
port's ``ServiceRules``): every chain of ours by its rule count and, once learnt, the
digest of its rules' expressions (the kernel's own encoding, which the renderer cannot
predict: the digest read the first time a chain is checked after it was written is
the reference until it is written again); every set and map of ours by name; the
elements of our shared sets and maps key by key and value by value. A chain, set or
element of the skeleton (what every service port relies on) that differs, or an
element nobody applied in one of our maps, is the skeleton's drift: the table is
rewritten. A service port's own chain, set or element that differs is that service
port's drift: it is written again. Objects that are not ours (a chain someone added to
our table) are not looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from svcproxy.sdk import ServicePortKey

from .claims import FamilyTable
from .context import FamilyContext
from .kernel_view import ADDR, PORT, PROTO, U32, Encoder, Layout, TableView, encoder
from .names import lb_chain, lb_map
from .service_rules import ServiceRules
from .skeleton import BASE_CHAINS, CONTAINERS, SETS, lb_rules, skeleton_chains

NF_ACCEPT = 1
_SERVICE = (ADDR, PROTO, PORT)
_NODEPORT = (PROTO, PORT)
_LAYOUTS: dict[str, tuple[Layout, Layout]] = {
    "cluster-ips": ((ADDR,), ()),
    "hairpin": ((ADDR, ADDR), ()),
    "service-ips": (_SERVICE, ()),
    "no-endpoint-services": (_SERVICE, ()),
    "firewall-ips": (_SERVICE, ()),
    "service-nodeports": (_NODEPORT, ()),
    "no-endpoint-nodeports": (_NODEPORT, ()),
}
_BASE = frozenset(name for name, *_ in BASE_CHAINS)


Held = bytes | str  # an element's value as read: data bytes, a verdict's text, b"" (a set)


@dataclass(slots=True)
class Learnt:
    """Per chain: the rules written and the digest the kernel showed for them; per
    element: its key and value as the kernel holds them (encoded once)."""

    chains: dict[str, tuple[tuple[str, ...], bytes]] = field(default_factory=dict)
    encoded: dict[tuple[str, str, str], tuple[bytes, Held]] = field(default_factory=dict)

    def same(self, name: str, rules: tuple[str, ...], digest: bytes) -> bool:
        """False when the chain's digest differs from the one learnt for these rules."""
        seen = self.chains.get(name)
        if seen is None or (seen[0] is not rules and seen[0] != rules):
            self.chains[name] = (rules, digest)
            return True
        return seen[1] == digest

    def forget(self, names: list[str] | None = None) -> None:
        """These chains were written again (None: all of them)."""
        if names is None:
            self.chains.clear()
        for name in names or ():
            self.chains.pop(name, None)


def layouts(ctx: FamilyContext, lb_sizes: set[int]) -> dict[str, tuple[Layout, Layout]]:
    """The sets and maps whose elements are compared, with their key and value layouts."""
    found = dict(_LAYOUTS)
    if ctx.nodeport_ips is not None:
        found["nodeport-ips"] = ((ADDR,), ())
    for n in lb_sizes:
        found[lb_map(n)] = ((ADDR, PROTO, PORT, U32), (ADDR, PORT))
    return found


def compare(table: FamilyTable, services: Mapping[ServicePortKey, ServiceRules],
            view: TableView | None, learnt: Learnt) -> tuple[set[ServicePortKey], str]:
    """(the service ports whose objects differ, why the skeleton differs or "")."""
    ctx = table.ctx
    if view is None:
        return set(), f"table {ctx.ipx} {ctx.table} is gone"
    why = _skeleton(table, view, learnt)
    if why:
        return set(), why
    drifted, why = _elements(table, view, learnt)
    if why:
        return set(), why
    chains = view.chains
    for key, rules in services.items():
        if key in drifted:
            continue
        for name, body in rules.chains.items():
            chain = chains.get(name)
            if chain is None or chain.rules != len(body) or not learnt.same(
                    name, body, chain.digest):
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
        if not learnt.same(name, body, chain.digest):
            return f"a rule of chain {name} was changed"
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


def _elements(table: FamilyTable, view: TableView, learnt: Learnt
              ) -> tuple[set[ServicePortKey], str]:
    """The owners of elements missing or holding another value; why the skeleton
    differs (an element nobody applied) or ""."""
    values = _expected(table, view, learnt)
    drifted: set[ServicePortKey] = set()
    for container, held in view.elements.items():
        wanted = values.get(container, {})
        if container == "nodeport-ips" or held == wanted:
            continue
        drifted.update(owner for k, (v, owner) in _owners(table, container, learnt).items()
                       if held.get(k) != v)
        extra = [k for k in held if k not in wanted]
        if extra:
            return set(), f"{container} holds {len(extra)} elements not ours"
    return drifted, ""


def _expected(table: FamilyTable, view: TableView, learnt: Learnt
              ) -> dict[str, dict[bytes, Held]]:
    """Per container read: key bytes -> value as the kernel would show the applied ones
    (the encodings of the elements still applied are kept for the next check)."""
    ctx, old = table.ctx, learnt.encoded
    encoders = _encoders(ctx, table.lb_sizes)
    cache: dict[tuple[str, str, str], tuple[bytes, Held]] = {}
    values: dict[str, dict[bytes, Held]] = {c: {} for c in view.elements}
    for (container, key), (value, _) in table.applied.items():
        items = values.get(container)
        if items is None:
            continue
        eid = (container, key, value)
        pair = old.get(eid)
        if pair is None:
            pair = _encode(encoders[container], container, key, value)
        cache[eid] = pair
        items[pair[0]] = pair[1]
    learnt.encoded = cache
    return values


def _owners(table: FamilyTable, container: str, learnt: Learnt
            ) -> dict[bytes, tuple[Held, ServicePortKey]]:
    """One container's applied elements: key bytes -> (value as held, owner)."""
    found = {}
    for (c, key), (value, owner) in table.applied.items():
        if c == container:
            pair = learnt.encoded[(c, key, value)]
            found[pair[0]] = (pair[1], owner)
    return found


def _encoders(ctx: FamilyContext, lb_sizes: set[int]) -> dict[str, tuple[Encoder, Encoder]]:
    return {name: (encoder(key, ctx.ipx), encoder(value, ctx.ipx))
            for name, (key, value) in layouts(ctx, lb_sizes).items()}


def _encode(encoders: tuple[Encoder, Encoder], container: str, key: str, value: str
            ) -> tuple[bytes, Held]:
    """An element as the kernel holds it: a set's value is b"", a verdict map's its
    text, a data map's its bytes."""
    if container in SETS:
        return encoders[0](key), b""
    if container.startswith("endpoints-"):
        return encoders[0](key), encoders[1](value)
    return encoders[0](key), value

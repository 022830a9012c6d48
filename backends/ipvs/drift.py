"""What the kernel holds that is not as this backend applied it (pure).

The periodic drift check reads the kernel into a ``Kernel`` (virtual servers with their
real servers, kube-ipvs0's addresses, local routes, our ipsets' entries) and compares
it with the backend's own ``Kernel``, the mirror of what it applied: ``compare`` says
which applied objects are gone or altered and which objects nobody applied sit in what
we own; ``owners`` names the service ports whose plans hold the drifted objects (the
SDK writes those again from their applied plans). Draining real servers are ours to
delete and are not compared.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from svcproxy.backends.ipvs.desired import Desired
from svcproxy.backends.ipvs.diff import Kernel
from svcproxy.backends.ipvs.genl import ServiceId
from svcproxy.backends.ipvs.render import PortPlan
from svcproxy.sdk import ServicePortKey

Entry = tuple[str, str]  # (ipset name, entry as the backend writes it)


@dataclass(frozen=True, slots=True)
class ObjectDrift:
    """Applied objects the kernel lost or altered, and objects nobody applied."""

    servers: frozenset[ServiceId] = frozenset()  # gone, altered, or real servers differ
    addresses: frozenset[str] = frozenset()
    routes: frozenset[str] = frozenset()
    entries: frozenset[Entry] = frozenset()
    foreign: tuple[str, ...] = ()  # what nobody applied, described

    def __bool__(self) -> bool:
        return bool(self.servers or self.addresses or self.routes or self.entries
                    or self.foreign)


def _part(text: str) -> str:
    """One comma-separated part of an ipset element, as ``ipset save`` prints it."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if "/" in text:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return text.lower()
        return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
    return text.lower()


def normalize_entry(value: str) -> str:
    """An ipset entry in one spelling for both sides: addresses and networks canonical,
    protocol names lower case, a full-width skbmark mask left out."""
    element, _, extra = value.partition(" ")
    words = extra.lower().split()
    if len(words) == 2 and words[0] == "skbmark" and "/" in words[1]:
        mark, _, mask = words[1].partition("/")
        if int(mask, 16) == 0xFFFFFFFF:
            words[1] = mark
    spelled = ",".join(_part(p) for p in element.split(","))
    return " ".join([spelled, *words])


def parse_ipset_save(text: str, names: Iterable[str]) -> tuple[set[str], set[Entry]]:
    """(sets present, their entries as printed) of ``ipset save`` output, for ``names``."""
    wanted = set(names)
    present: set[str] = set()
    entries: set[Entry] = set()
    for line in text.splitlines():
        verb, _, rest = line.partition(" ")
        name, _, value = rest.partition(" ")
        if name not in wanted:
            continue
        if verb == "create":
            present.add(name)
        elif verb == "add":
            entries.add((name, value))
    return present, entries


def in_our_spelling(held: Iterable[Entry], ours: Iterable[Entry]) -> set[Entry]:
    """Entries read from the kernel, each written as the backend writes it when it is one
    of ``ours`` (so that kernel and mirror compare as sets); only those not spelled the
    same on both sides are normalized."""
    held, ours = set(held), set(ours)
    same = held & ours
    spelling = {(name, normalize_entry(value)): (name, value) for name, value in ours - same}
    return same | {spelling.get((name, normalize_entry(value)), (name, value))
                   for name, value in held - same}


def _dests_differ(applied: Kernel, held: Kernel, sid: ServiceId, draining: set[ServiceId],
                  ) -> bool:
    """Whether the real servers of ``sid`` differ (weights included), draining ones aside."""
    have, want = held.dests.get(sid, {}), applied.dests.get(sid, {})
    if sid not in draining:
        return have != want
    skip = applied.draining
    return ({d: w for d, w in want.items() if (sid, d) not in skip}
            != {d: w for d, w in have.items() if (sid, d) not in skip})


def compare(applied: Kernel, held: Kernel) -> ObjectDrift:
    """What ``held`` (read from the kernel) lacks or alters of ``applied`` (the mirror),
    and what it holds that ``applied`` does not."""
    servers = {sid for sid, spec in applied.servers.items()
               if held.servers.get(sid) != spec}
    draining = {sid for sid, _ in applied.draining}
    servers.update(sid for sid in applied.servers if sid not in servers
                   and _dests_differ(applied, held, sid, draining))
    foreign = [f"virtual server {sid}" for sid in sorted(held.servers.keys()
                                                           - applied.servers.keys())]
    foreign += [f"address {a}" for a in sorted(held.addresses - applied.addresses)]
    foreign += [f"local route {a}" for a in sorted(held.routes - applied.routes)]
    foreign += [f"ipset entry {n} {v}" for n, v in sorted(held.entries - applied.entries)]
    return ObjectDrift(frozenset(servers), frozenset(applied.addresses - held.addresses),
                       frozenset(applied.routes - held.routes),
                       frozenset(applied.entries - held.entries), tuple(foreign))


def owners(drift: ObjectDrift, plans: Mapping[ServicePortKey, PortPlan],
           desired: Desired) -> set[ServicePortKey]:
    """The service ports whose applied plans hold a drifted object."""
    found = {k for sid in drift.servers for k in desired.claims.get(sid, {})}
    if not (drift.addresses or drift.routes or drift.entries):
        return found
    for key, plan in plans.items():
        if key in found:
            continue
        if plan.short_circuits:
            plan = desired.marked(key, plan)
        if (not drift.addresses.isdisjoint(plan.addresses)
                or not drift.routes.isdisjoint(plan.local_routes)
                or not drift.entries.isdisjoint(plan.entries)):
            found.add(key)
    return found

"""What to send to the kernel to go from what it holds to the desired objects (pure).

``Kernel`` mirrors the IPVS objects the kernel holds for this backend, object by object
(read back on every rebuild); the per-service-port applied state is the SDK's
(``StagedBackend.applied``), translated into objects by ``desired.Desired``.

Removed real servers of a surviving virtual server are not deleted at once:
they get weight 0 (no new connections) and are remembered as draining, with a
deadline. ``reap`` later picks those that have no connections left or whose
deadline passed. UDP real servers are deleted at once, as kube-proxy does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.backends.ipvs import genl
from svcproxy.backends.ipvs.desired import Desired
from svcproxy.backends.ipvs.genl import DestId, DestStats, ServiceId, ServiceSpec
from svcproxy.backends.ipvs.netlink import Request, ipvs_request

Draining = tuple[ServiceId, DestId]


@dataclass(slots=True)
class Kernel:
    """What the kernel holds of this backend's objects (real servers with their weights,
    draining ones with their deadlines)."""

    servers: dict[ServiceId, ServiceSpec] = field(default_factory=dict)
    dests: dict[ServiceId, dict[DestId, int]] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)
    routes: set[str] = field(default_factory=set)
    entries: set[tuple[str, str]] = field(default_factory=set)
    draining: dict[Draining, float] = field(default_factory=dict)


@dataclass(slots=True)
class IpvsDelta:
    """Requests plus what the kernel holds after them (committed only on success).

    ``changes`` (deleted virtual servers, and the updates and real servers of those
    that stay) go before the sync's ipset and rule changes; ``creations`` (new
    virtual servers with their real servers) go after them, so that nothing becomes
    reachable before the ipset entries that police it are in place."""

    changes: list[Request] = field(default_factory=list)
    creations: list[Request] = field(default_factory=list)
    servers: dict[ServiceId, ServiceSpec | None] = field(default_factory=dict)
    dests: dict[ServiceId, dict[DestId, int] | None] = field(default_factory=dict)
    draining_add: dict[Draining, float] = field(default_factory=dict)
    draining_drop: set[Draining] = field(default_factory=set)

    @property
    def requests(self) -> list[Request]:
        """Every request, in the order they are sent."""
        return self.changes + self.creations

    def commit(self, kernel: Kernel) -> None:
        for sid, spec in self.servers.items():
            if spec is None:
                kernel.servers.pop(sid, None)
            else:
                kernel.servers[sid] = spec
        for sid, dests in self.dests.items():
            if dests is None:
                kernel.dests.pop(sid, None)
            else:
                kernel.dests[sid] = dests
        for key in self.draining_drop:
            kernel.draining.pop(key, None)
        kernel.draining.update(self.draining_add)


def diff_servers(
    ids: Iterable[ServiceId], desired: Desired, kernel: Kernel, now: float, grace: float
) -> IpvsDelta:
    """Requests for the virtual servers ``ids`` (and their real servers)."""
    delta = IpvsDelta()
    for sid in sorted(ids):
        want = desired.server(sid)
        have = kernel.servers.get(sid)
        if want is None:
            if have is not None:
                delta.changes.append(ipvs_request(f"delete virtual server {sid}",
                                                  genl.del_service(sid), sid))
                delta.servers[sid] = None
                delta.dests[sid] = None
                delta.draining_drop |= {k for k in kernel.draining if k[0] == sid}
            continue
        if have is None:
            out = delta.creations
            out.append(ipvs_request(f"add virtual server {sid}", genl.add_service(want.spec), sid))
            delta.servers[sid] = want.spec
            old: Mapping[DestId, int] = {}
        else:
            out = delta.changes
            if have != want.spec:
                out.append(ipvs_request(f"update virtual server {sid}",
                                        genl.set_service(want.spec), sid))
                delta.servers[sid] = want.spec
            old = kernel.dests.get(sid, {})
        _diff_dests(sid, want.dests, old, kernel, delta, now + grace, out)
    return delta


def _diff_dests(sid: ServiceId, want: frozenset[DestId], old: Mapping[DestId, int],
                kernel: Kernel, delta: IpvsDelta, deadline: float,
                out: list[Request]) -> None:
    new = dict(old)
    for dest in sorted(want):
        weight = old.get(dest)
        if weight is None:
            out.append(ipvs_request(f"add real server {dest} to {sid}",
                                    genl.add_dest(sid, dest, 1), sid))
        elif weight != 1:
            out.append(ipvs_request(f"restore real server {dest} of {sid}",
                                    genl.set_dest(sid, dest, 1), sid))
        delta.draining_drop.add((sid, dest))
        new[dest] = 1
    for dest in sorted(set(old) - want):
        if sid.protocol == "UDP":
            out.append(ipvs_request(f"delete real server {dest} of {sid}",
                                    genl.del_dest(sid, dest), sid))
            del new[dest]
            delta.draining_drop.add((sid, dest))
        elif old[dest] != 0:
            out.append(ipvs_request(f"drain real server {dest} of {sid}",
                                    genl.set_dest(sid, dest, 0), sid))
            new[dest] = 0
            delta.draining_add[(sid, dest)] = deadline
        elif (sid, dest) not in kernel.draining:
            delta.draining_add[(sid, dest)] = deadline
    if new != old or sid not in kernel.dests:
        delta.dests[sid] = new


def reap(
    draining: Mapping[Draining, float], stats: Mapping[Draining, DestStats | None], now: float
) -> list[Draining]:
    """Draining real servers to delete now: no connections left, gone, or past the deadline."""
    done = []
    for key, deadline in sorted(draining.items()):
        s = stats.get(key)
        if s is None or s.active + s.inactive == 0 or now >= deadline:
            done.append(key)
    return done


def reap_requests(keys: Iterable[Draining]) -> list[Request]:
    return [ipvs_request(f"delete drained real server {d} of {sid}", genl.del_dest(sid, d), sid)
            for sid, d in keys]


def diff_members(want: Iterable[str], have: Iterable[str]) -> tuple[set[str], set[str]]:
    """(to add, to remove) between two sets of plain items."""
    w, h = set(want), set(have)
    return w - h, h - w

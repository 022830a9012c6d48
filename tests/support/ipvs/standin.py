"""An in-memory kernel for the ipvs backend on a host without IPVS.

``StandInIpvs`` decodes the backend's IPVS requests (``genl.parse_service``,
``genl.parse_dest``) into virtual servers and real servers with the kernel's errors
(EEXIST, ESRCH, ENOENT); ``StandInRoute`` decodes address and local-route requests and
answers the backend's dumps with them; ``StandInIpset`` keeps the sets ``ipset restore``
input makes and prints them as ``ipset save``. iptables input is recorded, not run.
What these check is the backend's own logic (what it sends, when it reads back);
real packets are checked in the IPVS guest (tests/backends/ipvs/test_ipvs_vm.py).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable, Sequence

import pytest

from svcproxy.backends.ipvs import apply, genl, rtnl
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.genl import DestId, DestStats, ServiceId, ServiceSpec
from svcproxy.backends.ipvs.netlink import Failure, Request

IFINDEX = 7  # kube-ipvs0's


class StandInIpvs:
    """Virtual servers and their real servers (weights); ``refuse`` addresses fail to be
    created, as a kernel without the scheduler asked for does (ENOENT)."""

    def __init__(self, refuse: Iterable[str] = ()) -> None:
        self.servers: dict[ServiceId, ServiceSpec] = {}
        self.dests_of: dict[ServiceId, dict[DestId, int]] = {}
        self.refuse = set(refuse)
        self.sent: list[Request] = []
        self.dumps = 0

    def apply(self, requests: Sequence[Request]) -> list[Failure]:
        failures = []
        for request in requests:
            self.sent.append(request)
            error = self._one(request)
            if error:
                failures.append(Failure(request, error))
        return failures

    def _one(self, request: Request) -> int:
        cmd = request.body[0]
        spec = genl.parse_service(request.body)
        if spec is None:
            return 0
        sid = spec.id
        if cmd == genl.CMD_NEW_SERVICE:
            if sid in self.servers:
                return errno.EEXIST
            if sid.address in self.refuse:
                return errno.ENOENT
            self.servers[sid] = spec
            self.dests_of[sid] = {}
            return 0
        if sid not in self.servers:
            return errno.ESRCH
        if cmd == genl.CMD_SET_SERVICE:
            self.servers[sid] = spec
        elif cmd == genl.CMD_DEL_SERVICE:
            del self.servers[sid], self.dests_of[sid]
        else:
            return self._dest(cmd, sid, genl.parse_dest(request.body, sid.family))
        return 0

    def _dest(self, cmd: int, sid: ServiceId, dest: DestStats) -> int:
        dests = self.dests_of[sid]
        if cmd == genl.CMD_NEW_DEST:
            if dest.id in dests:
                return errno.EEXIST
            dests[dest.id] = dest.weight
        elif dest.id not in dests:
            return errno.ENOENT
        elif cmd == genl.CMD_SET_DEST:
            dests[dest.id] = dest.weight
        elif cmd == genl.CMD_DEL_DEST:
            del dests[dest.id]
        return 0

    def services(self) -> list[ServiceSpec]:
        self.dumps += 1
        return list(self.servers.values())

    def dests(self, service: ServiceId) -> list[DestStats]:
        return [DestStats(d, w, genl.FWD_MASQ, 0, 0)
                for d, w in self.dests_of.get(service, {}).items()]

    def close(self) -> None:
        pass


class StandInRoute:
    """Addresses per interface and local routes, changed by the backend's requests and
    dumped back; ``fail`` makes every request fail (EPERM)."""

    def __init__(self, node_addresses: Iterable[tuple[int, str]] = ()) -> None:
        self.addresses: set[tuple[int, str]] = set(node_addresses)
        self.routes: set[tuple[int, str]] = set()
        self.fail = False

    def apply(self, requests: Sequence[Request]) -> list[Failure]:
        if self.fail:
            return [Failure(r, errno.EPERM) for r in requests]
        for r in requests:
            if r.msg_type in (rtnl.RTM_NEWADDR, rtnl.RTM_DELADDR):
                found = rtnl.parse_address(r.body)
                table = self.addresses
            else:
                found = rtnl.parse_local_route(r.body)
                table = self.routes
            assert found is not None, r.what
            if r.msg_type in (rtnl.RTM_NEWADDR, rtnl.RTM_NEWROUTE):
                table.add(found)
            else:
                table.discard(found)
        return []

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        if msg_type == rtnl.RTM_GETADDR:
            return [rtnl.address_body(a, i) for i, a in sorted(self.addresses)]
        family = 6 if body[0] == socket.AF_INET6 else 4
        return [rtnl.local_route_body(a, i) for i, a in sorted(self.routes)
                if (":" in a) == (family == 6)]

    def bound(self) -> set[str]:
        """The addresses on kube-ipvs0."""
        return {a for i, a in self.addresses if i == IFINDEX}

    def close(self) -> None:
        pass


class Recorded:
    """The ipset and iptables-restore inputs the backend sent."""

    def __init__(self) -> None:
        self.ipset: list[str] = []
        self.iptables: list[str] = []
        self.sets: StandInIpset | None = None  # the ipsets as the restores left them


class StandInIpset:
    """Sets and entries changed by ``ipset restore`` input and printed by ``ipset save``
    (entries as they were added: the real kernel's spelling is checked in the guest)."""

    def __init__(self) -> None:
        self.sets: dict[str, set[str]] = {}

    def restore(self, text: str) -> None:
        for line in text.splitlines():
            verb, name, *rest = line.replace(" -exist", "").split(" ")
            if verb == "create":
                self.sets.setdefault(name, set())
            elif verb == "flush":
                self.sets[name].clear()
            elif verb == "add":
                self.sets[name].add(" ".join(rest))
            elif verb == "del":
                self.sets[name] = {e for e in self.sets[name] if e.split(" ")[0] != rest[0]}
            elif verb == "swap":
                self.sets[name], self.sets[rest[0]] = self.sets[rest[0]], self.sets[name]
            elif verb == "destroy":
                del self.sets[name]

    def save(self) -> str:
        lines = []
        for name, entries in sorted(self.sets.items()):
            lines.append(f"create {name} hash:ip,port family inet")
            lines.extend(f"add {name} {e}" for e in sorted(entries))
        return "\n".join(lines) + "\n"


def stand_in(backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch,
             ipvs: StandInIpvs | None = None,
             node_addresses: Iterable[tuple[int, str]] = ((1, "10.100.0.1"),),
             ) -> tuple[StandInIpvs, StandInRoute, Recorded]:
    """Put ``backend`` on the stand-in kernel (its setup already done)."""
    recorded = Recorded()
    sets = StandInIpset()

    def ipset_restore(text: str) -> None:
        recorded.ipset.append(text)
        sets.restore(text)

    monkeypatch.setattr(apply, "ipset_restore", ipset_restore)
    monkeypatch.setattr(apply, "ipset_save", sets.save)
    monkeypatch.setattr(apply, "link_index", lambda name: IFINDEX)
    recorded.sets = sets
    monkeypatch.setattr(apply, "iptables_restore",
                        lambda family, text, mode="": recorded.iptables.append(text))
    monkeypatch.setattr(apply, "iptables_save", lambda *args: "")
    ipvs = ipvs or StandInIpvs()
    route = StandInRoute(node_addresses)
    backend.ipvs, backend.route, backend.ifindex = ipvs, route, IFINDEX  # type: ignore[assignment]
    return ipvs, route, recorded

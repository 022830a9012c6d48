"""Render (pure): one service port as the socket programs' map entries, the frontend's
decision translated.

Every address a socket on this node may connect or send to becomes one services-map
entry: ClusterIPs with the endpoints the frontend marked ``internal``; NodePorts on
the node's addresses, externalIPs and load-balancer VIPs with the ``external`` ones
(with externalTrafficPolicy Local, connections made on the node are short-circuited
to the internal set, as kube-proxy does for local traffic). Nothing here decides
which endpoint is usable: the flags on the endpoints do, and nothing here checks a value
(the SDK's screening refuses a record with a port or address no entry can hold before
it is rendered).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from svcproxy.sdk import Endpoint, ServicePortKey, ServicePortState

from .layout import F_AFFINITY, F_REFUSE, PROTOCOLS, ServiceAddress, Target, pack_target, service_id

DEFAULT_AFFINITY_TIMEOUT = 10800  # kube-proxy's default sessionAffinityConfig timeout


@dataclass(frozen=True, slots=True)
class Entry:
    """One services-map entry: endpoints to choose from (as the endpoints map holds them,
    in slot order), or refuse, or pass (no endpoint)."""

    slots: tuple[bytes, ...] = ()
    flags: int = 0
    affinity_timeout: int = 0
    service_id: int = 0  # with affinity: layout.service_id of the service port

    @classmethod
    def of(cls, targets: Iterable[Target], flags: int = 0, affinity_timeout: int = 0) -> Entry:
        return cls(tuple(t.pack() for t in targets), flags, affinity_timeout)

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(Target.unpack(s) for s in self.slots)

    @property
    def refuses(self) -> bool:
        return bool(self.flags & F_REFUSE)


MAX_ENDPOINTS = 0xFFFF  # the services map's endpoint count is 16 bits

# What one service port holds in the maps (StagedBackend's value): its addresses and
# their entries, in the order rendered. Two service ports may claim one address
# (``claims.py`` says which gets it).
ServicePortEntries = tuple[tuple[ServiceAddress, Entry], ...]


class TooManyEndpoints(ValueError):
    """More endpoints than a services-map entry counts (refused as the dataplane's)."""


def affinity_id(key: ServicePortKey) -> int:
    """The id every address of the service port shares in the affinity keys."""
    return service_id(key.namespace, key.name, key.port_name, key.protocol.value)


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def _slots(endpoints: Iterable[Endpoint]) -> tuple[bytes, ...]:
    """The endpoints packed, in slot order; a bad address or port raises here, for this
    service alone."""
    slots = tuple(sorted(pack_target(e.ip, e.port) for e in endpoints))
    if len(slots) > MAX_ENDPOINTS:
        raise TooManyEndpoints(f"{len(slots)} endpoints, at most {MAX_ENDPOINTS} fit")
    return slots


def _entry(slots: tuple[bytes, ...], has_endpoints: bool, affinity: int,
           sid: int = 0) -> Entry:
    if not slots:
        # No endpoint anywhere: refuse (kube-proxy's REJECT). Endpoints exist but none
        # for this traffic (a Local policy without local endpoints): leave the socket
        # alone, the packet path drops it as kube-proxy does.
        return Entry(flags=0 if has_endpoints else F_REFUSE)
    if affinity:
        return Entry(slots, F_AFFINITY, affinity, sid)
    return Entry(slots)


def service_entries(state: ServicePortState, node_ips: Iterable[str]
                    ) -> dict[ServiceAddress, Entry]:
    """The entries of one service port in both families (SCTP: none, left to the packets);
    TooManyEndpoints when a family's set does not fit."""
    svc = state.service
    proto = svc.key.protocol.value
    if proto not in PROTOCOLS:
        return {}
    affinity = (svc.session_affinity_timeout or DEFAULT_AFFINITY_TIMEOUT) if svc.affinity else 0
    sid = affinity_id(svc.key) if affinity else 0
    result: dict[ServiceAddress, Entry] = {}
    by_family: dict[int, list[Endpoint]] = {4: [], 6: []}
    for e in state.endpoints.values():
        by_family[_family(e.ip)].append(e)
    for family, eps in by_family.items():
        cips = [c for c in svc.cluster_ips if _family(c) == family]
        if not cips:
            continue
        has = svc.has_endpoints and bool(eps)
        internal = _slots(e for e in eps if e.internal)
        inside = _entry(internal, has, affinity, sid)
        for cip in cips:
            result[ServiceAddress(cip, svc.port, proto)] = inside
        ext = [a for a in svc.external_ips if _family(a) == family]
        if not any(_family(r) == family for r in svc.load_balancer_source_ranges):
            # With source ranges the client's address decides, which a socket does not
            # have yet at connect(): those VIPs stay with the packet path.
            ext += [a for a in svc.vip_ingress_ips() if _family(a) == family]
        ports = [ip for ip in node_ips if _family(ip) == family] if svc.node_port else []
        if not ext and not ports:
            continue
        if svc.external_policy_local:
            # Every connection a socket hook sees is the node's or its pods': kube-proxy
            # short-circuits those to the cluster set, whatever the local set holds.
            cluster = _slots(e for e in eps if e.cluster)
            outside = inside if cluster == internal else _entry(cluster, has, affinity, sid)
        elif all(e.internal == e.external for e in eps):
            outside = inside
        else:
            outside = _entry(_slots(e for e in eps if e.external), has, affinity, sid)
        for addr in ext:
            result.setdefault(ServiceAddress(addr, svc.port, proto), outside)
        for ip in ports:
            result.setdefault(ServiceAddress(ip, svc.node_port, proto), outside)
    return result

"""Which stale UDP/SCTP conntrack entries to delete after a sync, as kube-proxy decides.

Connectionless flows keep their conntrack entry (and so their DNAT target)
for as long as the client keeps sending. Two cases need cleaning:

* an endpoint stopped serving a service port: delete entries whose original
  destination is one of the service's IPs:port, or any address at its node
  port, and whose reply comes from that endpoint;
* a service port went from no serving endpoint to some: delete entries to its
  IPs:port and to its node port, which hold the REJECT/blackhole verdict.

A deleted service port gets its entries deleted too. Everything here is pure:
a function of (state before, state after).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from svcproxy.model import Protocol, ServicePort, ServicePortKey, ServicePortState, ip_family
from svcproxy.sdk.backend import NodeState

CLEANED_PROTOCOLS = (Protocol.UDP, Protocol.SCTP)


@dataclass(frozen=True, slots=True, order=True)
class ConntrackFilter:
    """Entries to delete; an empty field matches anything."""

    protocol: Protocol
    family: int  # 4 or 6
    orig_dst: str = ""  # a service IP
    orig_dport: int = 0  # the service port or node port
    reply_src: str = ""  # the endpoint the flow was DNATed to

    def __str__(self) -> str:
        dst = f"{self.orig_dst or '*'}:{self.orig_dport or '*'}"
        via = f" -> {self.reply_src}" if self.reply_src else ""
        return f"{self.protocol.value.lower()} {dst}{via}"


@dataclass(frozen=True, slots=True)
class ConntrackEntry:
    """The part of a conntrack entry the filters look at."""

    protocol: Protocol
    family: int
    orig_dst: str
    orig_dport: int
    reply_src: str


def matches(f: ConntrackFilter, entry: ConntrackEntry) -> bool:
    """Whether ``f`` selects ``entry``."""
    return (
        f.protocol == entry.protocol
        and f.family == entry.family
        and (not f.orig_dst or f.orig_dst == entry.orig_dst)
        and (not f.orig_dport or f.orig_dport == entry.orig_dport)
        and (not f.reply_src or f.reply_src == entry.reply_src)
    )


def stale_conntrack_filters(old: NodeState | None, new: NodeState,
                            changed: Iterable[ServicePortKey] | None = None
                            ) -> list[ConntrackFilter]:
    """The deletions that make ``new`` take effect for existing UDP/SCTP flows; when
    ``changed`` is given, only those service ports may differ between the states."""
    before = old.services if old else {}
    found: set[ConntrackFilter] = set()
    keys = before.keys() | new.services.keys() if changed is None else changed
    for key in keys:
        if key.protocol not in CLEANED_PROTOCOLS:
            continue
        a, b = before.get(key), new.services.get(key)
        if a is b:
            continue
        if b is None:
            assert a is not None
            found.update(_all_frontends(a.service))
            continue
        old_serving = _serving(a)
        new_serving = _serving(b)
        if new_serving and not old_serving:
            found.update(_all_frontends(b.service))
        services = [b.service] + ([a.service] if a else [])
        for endpoint_ip, _port in old_serving - new_serving:
            for svc in services:
                found.update(_towards_endpoint(svc, endpoint_ip))
    return sorted(found)


def _serving(sps: ServicePortState | None) -> set[tuple[str, int]]:
    """(IP, port) of the endpoints that may receive traffic."""
    if sps is None:
        return set()
    return {(ip, ep.port) for ip, ep in sps.endpoints.items() if ep.ready or ep.serving}


def _service_ips(svc: ServicePort) -> list[str]:
    return [*svc.cluster_ips, *svc.external_ips, *svc.vip_ingress_ips()]


def _families(svc: ServicePort) -> set[int]:
    return {ip_family(ip) for ip in svc.cluster_ips} or {4}


def _all_frontends(svc: ServicePort) -> Iterable[ConntrackFilter]:
    """Every entry towards the service, whatever its endpoint."""
    proto = svc.key.protocol
    for ip in _service_ips(svc):
        yield ConntrackFilter(proto, ip_family(ip), orig_dst=ip, orig_dport=svc.port)
    if svc.node_port:
        for family in _families(svc):
            yield ConntrackFilter(proto, family, orig_dport=svc.node_port)


def _towards_endpoint(svc: ServicePort, endpoint_ip: str) -> Iterable[ConntrackFilter]:
    """Entries towards the service that were DNATed to ``endpoint_ip``."""
    proto, family = svc.key.protocol, ip_family(endpoint_ip)
    for ip in _service_ips(svc):
        if ip_family(ip) == family:
            yield ConntrackFilter(proto, family, ip, svc.port, endpoint_ip)
    if svc.node_port:
        yield ConntrackFilter(proto, family, orig_dport=svc.node_port, reply_src=endpoint_ip)

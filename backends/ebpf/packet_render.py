"""Render (pure) for the packet path: one service port as the tc programs' map entries,
the frontend's decision translated.

Rows served so far, TCP, UDP and SCTP, IPv4 and IPv6: ClusterIPs routed to the node (with
the endpoints marked ``internal``), NodePorts on the node's NodePort addresses,
externalIPs and load-balancer VIPs (ipMode VIP; with loadBalancerSourceRanges
only their sources get through), with the endpoints the frontend marked ``external`` (so
externalTrafficPolicy Local already means the local ones); session affinity ClientIP
(per client address and service address, refreshed by each new flow). Each endpoint
says whether it runs on this node (DNAT only) or elsewhere (DNAT and SNAT). No endpoint
at all: the entry refuses (the program answers RST / port unreachable); endpoints but
none for external traffic: dropped, as kube-proxy does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from svcproxy.sdk import Endpoint, ServicePortState

from .layout import F_AFFINITY, F_REFUSE, PACKET_PROTOCOLS, ServiceAddress
from .packet_layout import (
    F_MAGLEV,
    F_MASQ,
    F_MASQ_ALL,
    F_MASQ_NONLOCAL,
    F_RANGES,
    pack_endpoint,
    pack_range,
)
from .render import (
    DEFAULT_AFFINITY_TIMEOUT,
    MAX_ENDPOINTS,
    Entry,
    TooManyEndpoints,
    affinity_id,
)

log = logging.getLogger(__name__)

LB_ALGORITHMS = ("random", "maglev")
LB_ANNOTATION = "svcproxy.io/lb-algorithm"


def algorithm(state: ServicePortState, default: str) -> str:
    """The service's ``svcproxy.io/lb-algorithm`` when it names one, else ``default``."""
    chosen = state.service.option(LB_ANNOTATION, default)
    return chosen if chosen in LB_ALGORITHMS else default


def packet_entries(state: ServicePortState, node_ips: Iterable[str],
                   default_algorithm: str = "random",
                   masquerade_all: bool = False) -> dict[ServiceAddress, Entry]:
    """The tc entries of one service port; ``masquerade_all`` (the node context's
    --masquerade-all) SNATs ClusterIP traffic from outside to local endpoints too;
    without it, kube-proxy's rule for ClusterIPs: SNATed unless local traffic (what is
    local, the node context's --detect-local-mode, is in the maps of local_traffic.py)."""
    svc = state.service
    proto = svc.key.protocol.value
    if proto not in PACKET_PROTOCOLS:
        return {}
    fronts = [ServiceAddress(ip, svc.node_port, proto) for ip in node_ips if svc.node_port]
    fronts += [ServiceAddress(ip, svc.port, proto) for ip in svc.external_ips]
    ranged = [ServiceAddress(ip, svc.port, proto) for ip in svc.vip_ingress_ips()]
    if not svc.load_balancer_source_ranges:
        fronts += ranged
        ranged = []
    flags = F_MAGLEV if algorithm(state, default_algorithm) == "maglev" else 0
    timeout = sid = 0
    if svc.affinity:
        flags |= F_AFFINITY
        timeout = svc.session_affinity_timeout or DEFAULT_AFFINITY_TIMEOUT
        sid = affinity_id(svc.key)  # one client, one endpoint across the addresses
    cips = [ServiceAddress(ip, svc.port, proto) for ip in svc.cluster_ips]
    # Which endpoints are on this node, as the frontend's decision holds them (every used
    # endpoint here is in the set: a local one gets DNAT only, a remote one SNAT too).
    here = {e.ip for e in state.hairpin_endpoints()}
    result: dict[ServiceAddress, Entry] = {}
    for family in (4, 6):
        eps = [e for e in state.endpoints.values() if _of(e.ip, family)]
        has = svc.has_endpoints and bool(eps)
        if mine := [fe for fe in cips if _of(fe.ip, family)]:
            # A ClusterIP routed to the node from outside: the internal endpoints.
            masq = F_MASQ_ALL if masquerade_all else F_MASQ_NONLOCAL
            inside = _entry([e for e in eps if e.internal], here, has, flags | masq,
                            timeout, sid)
            result.update(dict.fromkeys(mine, inside))
        mine = [fe for fe in fronts if _of(fe.ip, family)]
        vips = [fe for fe in ranged if _of(fe.ip, family)]
        if mine or vips:
            # kube-proxy masquerades external traffic unless externalTrafficPolicy Local.
            masq = 0 if svc.external_policy_local else F_MASQ
            entry = _entry([e for e in eps if e.external], here, has, flags | masq,
                           timeout, sid)
            result.update(dict.fromkeys(mine, entry))
            result.update(dict.fromkeys(vips, Entry(entry.slots, entry.flags | F_RANGES,
                                                    entry.affinity_timeout, entry.service_id)))
    return result


def _of(ip: str, family: int) -> bool:
    return (":" in ip) == (family == 6)


def source_ranges(state: ServicePortState) -> set[bytes]:
    """The spp_ranges keys of a service port's load-balancer VIPs (each VIP with each
    source range of its family; a range that is no CIDR is left out)."""
    svc = state.service
    proto = svc.key.protocol.value
    keys: set[bytes] = set()
    if proto not in PACKET_PROTOCOLS or not svc.load_balancer_source_ranges:
        return keys
    for vip in svc.vip_ingress_ips():
        for cidr in svc.load_balancer_source_ranges:
            if (":" in cidr) == (":" in vip):
                try:
                    keys.add(pack_range(ServiceAddress(vip, svc.port, proto).pack(), cidr.strip()))
                except ValueError:
                    log.warning("%s: loadBalancerSourceRanges %r is no CIDR", svc.key, cidr)
    return keys


def _entry(eps: list[Endpoint], here: set[str], has_endpoints: bool, flags: int,
           timeout: int, sid: int = 0) -> Entry:
    """The entry of one family over ``eps`` (those for this traffic): pick among them;
    none while the service has endpoints: drop; none at all: refuse."""
    slots = tuple(sorted(pack_endpoint(e.ip, e.port, e.ip in here) for e in eps))
    if len(slots) > MAX_ENDPOINTS:
        raise TooManyEndpoints(f"{len(slots)} endpoints, at most {MAX_ENDPOINTS} fit")
    if not slots:
        return Entry(flags=0 if has_endpoints else F_REFUSE)
    return Entry(slots, flags, timeout, sid if timeout else 0)

"""Two Services on one address: the apiserver's allocators' outcome, where none guarded.

The apiserver refuses a Service asking for a ClusterIP or nodePort/protocol another
holds; manifests and an upstream frontend's view have no allocator. For those sources
(``UNALLOCATED``: the store keeps its Services here only for those) every Service
declares its claims, the earliest (creationTimestamp, then namespace/name; one without
a usable time after any with one) holds each, and a later one is refused for that port
alone: the port is left out of the Service the computation sees, logged once with the
holder's name and counted in ``svcproxy_frontend_refused_service_ports_total{claim}``.
When the holder goes or lets the claim go, the next in line is served.
"""

from __future__ import annotations

import logging
import math

import msgspec

from svcproxy.frontend.edge.objects import Service, SvcPort
from svcproxy.frontend.runtime import metrics

log = logging.getLogger("svcproxy.frontend.engine")
ObjKey = tuple[str, str]
UNALLOCATED = ("manifests", "upstream")  # sources no allocator guarded
# ("cluster_ip", ip, port, protocol) or ("node_port", "", nodePort, protocol)
Claim = tuple[str, str, int, str]
Refusal = tuple[str, str, str]  # the claim's kind, the claim as shown, its holder


def port_claims(svc: Service, port: SvcPort) -> list[Claim]:
    """What one service port holds: each cluster IP's port, and its node port."""
    out: list[Claim] = [("cluster_ip", ip, port.port, port.protocol.value)
                        for ip in svc.cluster_ips]
    if port.node_port:
        out.append(("node_port", "", port.node_port, port.protocol.value))
    return out


def order(svc: Service) -> tuple[float, str, str]:
    """Who came first: creation time (unknown: last), then namespace/name."""
    return (svc.created if svc.created > 0 else math.inf, svc.namespace, svc.name)


def _shown(claim: Claim) -> str:
    kind, ip, port, protocol = claim
    return f"{ip}:{port}/{protocol}" if kind == "cluster_ip" else f"nodePort {port}/{protocol}"


class Claims:
    """The Services as declared, and each claim's holders."""

    def __init__(self) -> None:
        self.declared: dict[ObjKey, Service] = {}
        self._holders: dict[Claim, set[ObjKey]] = {}
        # Per Service, its refused ports' names -> (claim kind, claim shown, holder).
        self._refused: dict[ObjKey, dict[str, Refusal]] = {}

    def _claims(self, svc: Service | None) -> set[Claim]:
        if svc is None or svc.proxyable_type is None:
            return set()
        return {c for p in svc.ports for c in port_claims(svc, p)}

    def update(self, key: ObjKey, svc: Service | None) -> dict[ObjKey, Service | None]:
        """Declare ``svc`` (None: gone) as ``key``; the Services whose served view that may
        change, each as it is now served (None: not at all)."""
        old = self._claims(self.declared.get(key))
        new = self._claims(svc)
        if svc is None:
            self.declared.pop(key, None)
        else:
            self.declared[key] = svc
        for claim in old - new:
            holders = self._holders.get(claim)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self._holders[claim]
        for claim in new - old:
            self._holders.setdefault(claim, set()).add(key)
        affected = {key} | {k for c in old | new for k in self._holders.get(c, ())}
        return {k: self.served(k) for k in affected}

    def served(self, key: ObjKey) -> Service | None:
        """The declared Service less the ports an earlier Service holds a claim of."""
        svc = self.declared.get(key)
        if svc is None:
            self._refused.pop(key, None)
            return None
        mine = order(svc)
        kept = []
        refused: dict[str, Refusal] = {}
        for port in svc.ports if svc.proxyable_type is not None else ():
            why = self._earlier_holder(key, mine, svc, port)
            if why:
                refused[port.name] = why
            else:
                kept.append(port)
        self._say(key, svc, refused)
        return svc if not refused else msgspec.structs.replace(svc, ports=tuple(kept))

    def _earlier_holder(self, key: ObjKey, mine: tuple[float, str, str], svc: Service,
                        port: SvcPort) -> Refusal | None:
        for claim in port_claims(svc, port):
            first = min(self._holders.get(claim, {key}),
                        key=lambda k: order(self.declared[k]))
            if first != key and order(self.declared[first]) < mine:
                return (claim[0], _shown(claim), f"{first[0]}/{first[1]}")
        return None

    def _say(self, key: ObjKey, svc: Service, refused: dict[str, Refusal]) -> None:
        """Log and count each newly refused port; forget what is no longer refused."""
        before = self._refused.get(key, {})
        for name, why in refused.items():
            if before.get(name) == why:
                continue
            claim, shown, holder = why
            metrics.REFUSED_PORTS.labels(claim).inc()
            log.error("refused port %s of Service %s/%s: %s is held by Service %s, created "
                      "earlier (the apiserver's allocator would have refused it); the "
                      "Service's other ports are served", name or "<unnamed>", svc.namespace,
                      svc.name, shown, holder)
        for name in before.keys() - refused.keys():
            log.info("port %s of Service %s/%s is served: no earlier Service holds its "
                     "address any more", name or "<unnamed>", svc.namespace, svc.name)
        if refused:
            self._refused[key] = refused
        else:
            self._refused.pop(key, None)

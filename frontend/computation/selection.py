"""Which endpoints a node uses for a service port: kube-proxy's CategorizeEndpoints.

One small pure function decides for every backend, so they all agree:

- cluster endpoints: ready ones, narrowed by topology hints when kube-proxy's
  safeguards allow; when none is ready, serving-and-terminating ones;
- local endpoints (for Local traffic policies): ready local ones, else
  serving-and-terminating local ones;
- internal traffic uses local endpoints when internalTrafficPolicy is Local,
  external traffic when externalTrafficPolicy is Local, cluster ones otherwise;
- traffic from pods and from the node to the external addresses of an
  externalTrafficPolicy Local service is short-circuited to the cluster endpoints;
- ``has_endpoints`` is False only when no endpoint anywhere is usable, so the
  service's traffic is rejected rather than dropped; ``has_local`` says whether the
  local set is empty (Local traffic then is dropped on this node).

The whole categorisation goes on the wire (``Endpoint.internal/external/cluster/local``,
``ServicePort.has_endpoints/has_local_endpoints``): backends translate it and never
re-decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from svcproxy.model import Endpoint, ServicePort


@dataclass(frozen=True, slots=True)
class Selection:
    """kube-proxy's categorisation of one service port's endpoints on one node (IPs)."""

    internal: frozenset[str]
    external: frozenset[str]
    has_endpoints: bool
    cluster: frozenset[str] = frozenset()
    local: frozenset[str] = frozenset()

    @property
    def has_local(self) -> bool:
        return bool(self.local)


def topology_mode(endpoints: Sequence[Endpoint], node_name: str, zone: str) -> str:
    """"PreferSameNode", "PreferSameZone" or "" from the hints, with kube-proxy's safeguards.

    Hints are used only when every ready endpoint carries one and at least one
    is hinted for this node (or, for zones, this node's zone).
    """
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return ""
    if node_name and all(e.hint_nodes for e in ready) and any(
            node_name in e.hint_nodes for e in ready):
        return "PreferSameNode"
    if zone and all(e.hint_zones for e in ready) and any(zone in e.hint_zones for e in ready):
        return "PreferSameZone"
    return ""


def _in_topology(ep: Endpoint, mode: str, node_name: str, zone: str) -> bool:
    if mode == "PreferSameNode":
        return node_name in ep.hint_nodes
    if mode == "PreferSameZone":
        return zone in ep.hint_zones
    return True


def cluster_endpoints(endpoints: Sequence[Endpoint], node_name: str, zone: str) -> set[str]:
    """IPs of the endpoints for Cluster traffic policy."""
    return set(_cluster(endpoints, node_name, zone))


def _cluster(endpoints: Sequence[Endpoint], node_name: str, zone: str) -> frozenset[str]:
    """``cluster_endpoints``: the ready ones (narrowed by the hints when ``topology_mode``
    allows, which leaves at least one), else the serving-and-terminating ones."""
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return frozenset([e.ip for e in endpoints if e.serving and e.terminating])
    mode = topology_mode(ready, node_name, zone) if ready[0].hint_nodes or \
        ready[0].hint_zones else ""
    if mode:
        ready = [e for e in ready if _in_topology(e, mode, node_name, zone)]
    return frozenset([e.ip for e in ready])


def local_endpoints(endpoints: Sequence[Endpoint]) -> set[str]:
    """IPs of the endpoints for Local traffic policy: ready local ones, else terminating ones."""
    return set(_local(endpoints))


def _local(endpoints: Sequence[Endpoint]) -> frozenset[str]:
    mine = [e for e in endpoints if e.is_local]
    if not mine:
        return _NONE
    ready = [e.ip for e in mine if e.ready]
    return frozenset(ready or [e.ip for e in mine if e.serving and e.terminating])


_NONE: frozenset[str] = frozenset()


def categorize(service: ServicePort, endpoints: Sequence[Endpoint], node_name: str,
               zone: str) -> Selection:
    """Which endpoints this node uses for internal and external traffic (endpoints carry
    ``is_local``)."""
    cluster = _cluster(endpoints, node_name, zone)
    local = _local(endpoints)
    internal = local if service.internal_policy_local else cluster
    external = local if service.external_policy_local else cluster
    # Some endpoint is ready or serving-and-terminating exactly when the cluster set has one.
    return Selection(internal, external, bool(cluster), cluster, local)


def categorize_by_family(service: ServicePort, endpoints: Sequence[Endpoint], node_name: str,
                         zone: str) -> Selection:
    """``categorize`` per IP family, united: each family's proxier in kube-proxy sees only
    its own endpoints, so topology and the terminating fallback are decided per family."""
    if not any(":" in e.ip for e in endpoints):
        return categorize(service, endpoints, node_name, zone)
    v6 = [e for e in endpoints if ":" in e.ip]
    if len(v6) == len(endpoints):
        return categorize(service, endpoints, node_name, zone)
    a = categorize(service, [e for e in endpoints if ":" not in e.ip], node_name, zone)
    b = categorize(service, v6, node_name, zone)
    return Selection(a.internal | b.internal, a.external | b.external,
                     a.has_endpoints or b.has_endpoints, a.cluster | b.cluster,
                     a.local | b.local)

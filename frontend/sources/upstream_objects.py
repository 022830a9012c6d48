"""Pure conversion of another frontend's cluster view back into Kubernetes objects.

A cluster watch carries every service port with all of its endpoints, unfiltered, and
every node: what the frontend's own computation needs, in per-port records. These
functions rebuild a Service per (namespace, name), EndpointSlices per service port,
target port and IP family, and Nodes, in the JSON shape the apiserver serves, so a
chained frontend runs exactly the computation the first one runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from svcproxy.frontend.edge.endpointslice import MAX_SLICE_ENDPOINTS
from svcproxy.frontend.edge.wellknown import (
    SERVICE_NAME_LABEL,
    TO_BE_DELETED_TAINT,
    TRIGGER_TIME_ANNOTATION,
)
from svcproxy.model import (
    Endpoint,
    NodeInfo,
    ServicePortState,
    SessionAffinity,
    ip_family,
)

Obj = dict[str, Any]


def service_object(records: list[ServicePortState]) -> Obj:
    """One Service from the records of all its ports (service-level fields are shared)."""
    svc = records[0].service
    spec: Obj = {
        "type": str(svc.type), "clusterIPs": list(svc.cluster_ips),
        "clusterIP": svc.cluster_ips[0] if svc.cluster_ips else None,
        "ports": [{"name": r.key.port_name, "protocol": str(r.key.protocol),
                   "port": r.service.port, "nodePort": r.service.node_port or None}
                  for r in records],
        "externalIPs": list(svc.external_ips),
        "loadBalancerSourceRanges": list(svc.load_balancer_source_ranges),
        "sessionAffinity": str(svc.session_affinity),
        "internalTrafficPolicy": str(svc.internal_traffic_policy),
        # Kubernetes allows it only on externally reachable services.
        "externalTrafficPolicy": str(svc.external_traffic_policy)
        if svc.type != "ClusterIP" or svc.external_ips else None,
        "healthCheckNodePort": svc.health_check_node_port or None,
        "trafficDistribution": svc.traffic_distribution or None,
    }
    if svc.session_affinity is SessionAffinity.CLIENT_IP:
        spec["sessionAffinityConfig"] = {
            "clientIP": {"timeoutSeconds": svc.session_affinity_timeout}}
    return {
        "kind": "Service",
        "metadata": {"namespace": svc.key.namespace, "name": svc.key.name,
                     "annotations": dict(svc.options)},
        "spec": spec,
        "status": {"loadBalancer": {"ingress": [
            {"ip": ing.ip, "ipMode": ing.ip_mode} for ing in svc.load_balancer_ingress]}},
    }


def _endpoint(ep: Endpoint) -> Obj:
    out: Obj = {"addresses": [ep.ip],
                "conditions": {"ready": ep.ready, "serving": ep.serving,
                               "terminating": ep.terminating},
                "nodeName": ep.node_name or None, "zone": ep.zone or None}
    if ep.hint_zones or ep.hint_nodes:
        out["hints"] = {"forZones": [{"name": z} for z in ep.hint_zones],
                        "forNodes": [{"name": n} for n in ep.hint_nodes]}
    return out


def _rfc3339(seconds: float) -> str | None:
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat() if seconds > 0 else None
    except (ValueError, OverflowError, OSError):
        return None


def slice_objects(record: ServicePortState) -> list[Obj]:
    """The EndpointSlices of one service port: per target port and IP family, at most
    MAX_SLICE_ENDPOINTS endpoints each (Kubernetes' limit, which the engine enforces)."""
    key = record.key
    groups: dict[tuple[int, int], list[Endpoint]] = {}
    for ep in record.endpoints.values():
        groups.setdefault((ep.port, ip_family(ep.ip)), []).append(ep)
    trigger = _rfc3339(record.service.trigger_time)
    port_part = f"{key.port_name or 'port'}-{key.protocol.lower()}"
    chunks = [(port, family, i, eps[i:i + MAX_SLICE_ENDPOINTS])
              for (port, family), eps in sorted(groups.items())
              for i in range(0, len(eps), MAX_SLICE_ENDPOINTS)]
    return [{
        "kind": "EndpointSlice", "addressType": f"IPv{family}",
        "metadata": {
            "namespace": key.namespace,
            "name": f"{key.name}-{port_part}-{port}-v{family}" + (f"-{i}" if i else ""),
            "labels": {SERVICE_NAME_LABEL: key.name},
            "annotations": {TRIGGER_TIME_ANNOTATION: trigger} if trigger else {}},
        "ports": [{"name": key.port_name, "protocol": str(key.protocol), "port": port}],
        "endpoints": [_endpoint(ep) for ep in eps],
    } for port, family, i, eps in chunks]


def node_object(node: NodeInfo) -> Obj:
    spec: Obj = {"podCIDRs": list(node.pod_cidrs)}
    if node.terminating:
        spec["taints"] = [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]
    return {"kind": "Node", "metadata": {"name": node.name, "labels": dict(node.labels)},
            "spec": spec,
            "status": {"addresses": [{"type": "InternalIP", "address": a}
                                     for a in node.addresses]}}


def service_objects(records: Iterable[ServicePortState]) -> tuple[Obj, list[Obj]]:
    """The Service and EndpointSlices of one service's port records."""
    ordered = sorted(records, key=lambda r: (r.key.port_name, str(r.key.protocol)))
    return service_object(ordered), [s for r in ordered for s in slice_objects(r)]

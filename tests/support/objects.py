"""Services, EndpointSlices and Nodes as the apiserver serves them, and an engine holding them."""

from __future__ import annotations

from typing import Any

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.sources.events import Replace
from svcproxy.model import Protocol, ServicePortKey


def service(name: str, *, ns: str = "default", ip: str = "10.96.0.1", port: int = 80,
            target: Any = "http", **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {})
    return {"kind": "Service", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": port, "targetPort": target}], **spec}}


def slice_(name: str, svc: str, eps: list[dict[str, Any]], *, ns: str = "default",
           port: int = 8080, family: str = "IPv4", port_name: str = "http") -> dict[str, Any]:
    return {"kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}], "endpoints": eps}


def endpoint(ip: str, node: str = "n1", **cond: Any) -> dict[str, Any]:
    return {"addresses": [ip], "nodeName": node, "conditions": {"ready": True, **cond}}


def node(name: str, zone: str = "") -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


KEY = ServicePortKey("default", "web", "http", Protocol.TCP)


def engine_with(*objs: dict[str, Any]) -> Engine:
    eng = Engine()
    by_kind: dict[str, list[dict[str, Any]]] = {"Service": [], "EndpointSlice": [], "Node": []}
    for o in objs:
        by_kind[o["kind"]].append(o)
    eng.submit([Replace(k, v) for k, v in by_kind.items()])  # type: ignore[arg-type]
    for o in by_kind["Node"]:  # every node's backend watching, and a cluster watcher
        eng.changelog.view(o["metadata"]["name"])
    eng.changelog.view("")
    return eng

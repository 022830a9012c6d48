"""Kubernetes manifests for the lab's pods: Services, EndpointSlices, Nodes."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from .plan import NodeSpec, PodSpec

NAMESPACE = "lab"
Doc = dict[str, Any]


def node(spec: NodeSpec, zone: str = "") -> Doc:
    labels = {"kubernetes.io/hostname": spec.name}
    if zone:
        labels["topology.kubernetes.io/zone"] = zone
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"podCIDRs": list(spec.pod_cidrs)},
        "status": {"addresses": [
            {"type": "InternalIP", "address": spec.ipv4},
            {"type": "InternalIP", "address": spec.ipv6},
        ]},
    }


def port(name: str, port: int, target: int | str, protocol: str = "TCP", node_port: int = 0) -> Doc:
    p: Doc = {"name": name, "port": port, "targetPort": target, "protocol": protocol}
    if node_port:
        p["nodePort"] = node_port
    return p


def service(name: str, cluster_ips: Sequence[str], ports: Sequence[Doc], **spec: Any) -> Doc:
    """A Service; extra keyword arguments go into ``spec`` as written (camelCase)."""
    status = spec.pop("status", None)
    body: Doc = {
        "type": "ClusterIP",
        "clusterIP": cluster_ips[0],
        "clusterIPs": list(cluster_ips),
        "ipFamilies": ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips],
        "ports": list(ports),
        **spec,
    }
    doc: Doc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }
    if status:
        doc["status"] = status
    return doc


def endpoint(
    pod: PodSpec,
    family: int = 4,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    zone: str = "",
    hint_zones: Iterable[str] = (),
) -> Doc:
    """One endpoint entry of an EndpointSlice for ``pod``."""
    ep: Doc = {
        "addresses": [pod.ipv4 if family == 4 else pod.ipv6],
        "conditions": {
            "ready": ready,
            "serving": ready if serving is None else serving,
            "terminating": terminating,
        },
        "nodeName": pod.node.name,
    }
    if zone:
        ep["zone"] = zone
    hints = list(hint_zones)
    if hints:
        ep["hints"] = {"forZones": [{"name": z} for z in hints]}
    return ep


def slice_port(name: str, port: int, protocol: str = "TCP") -> Doc:
    return {"name": name, "port": port, "protocol": protocol}


def endpoint_slice(
    service_name: str,
    endpoints: Sequence[Doc],
    ports: Sequence[Doc],
    family: int = 4,
    suffix: str = "",
) -> Doc:
    """An EndpointSlice of ``service_name`` (one per family; ``suffix`` for more)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-v{family}{suffix}",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4" if family == 4 else "IPv6",
        "ports": list(ports),
        "endpoints": list(endpoints),
    }


def write(directory: Path, filename: str, docs: Sequence[Doc]) -> Path:
    """Write ``docs`` to ``directory/filename`` atomically (the source never sees half a file)."""
    path = directory / filename
    tmp = directory / f".{filename}.tmp"
    tmp.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    os.replace(tmp, path)
    return path


def remove(directory: Path, filename: str) -> None:
    (directory / filename).unlink(missing_ok=True)

"""The three collections the apiserver source lists and watches, and how to call them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes.client

from .events import Kind


@dataclass(frozen=True)
class Resource:
    """One watched collection: its kind, apiVersion and REST plural."""

    kind: Kind
    api_version: str
    plural: str

    def list_call(self, api: kubernetes.client.ApiClient) -> Callable[..., Any]:
        """The official client's cluster-wide list (and watch) function for this kind."""
        if self.kind == "Service":
            return kubernetes.client.CoreV1Api(api).list_service_for_all_namespaces
        if self.kind == "EndpointSlice":
            return kubernetes.client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces
        return kubernetes.client.CoreV1Api(api).list_node

    def complete(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Fill in kind and apiVersion, which list responses leave out of their items."""
        obj.setdefault("kind", self.kind)
        obj.setdefault("apiVersion", self.api_version)
        return obj


RESOURCES: dict[Kind, Resource] = {
    "Service": Resource("Service", "v1", "services"),
    "EndpointSlice": Resource("EndpointSlice", "discovery.k8s.io/v1", "endpointslices"),
    "Node": Resource("Node", "v1", "nodes"),
}


def object_ref(obj: dict[str, Any]) -> tuple[str, str]:
    """(namespace, name) of an object; namespace is "" for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def resource_version(obj: dict[str, Any]) -> str | None:
    """The object's metadata.resourceVersion, if any."""
    return (obj.get("metadata") or {}).get("resourceVersion") or None

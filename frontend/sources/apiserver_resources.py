"""The three collections the apiserver source lists and watches, and how to call them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from .events import Kind

# The list/watch options the reflector passes, as the apiserver's query parameters.
_QUERY = {"limit": "limit", "_continue": "continue", "resource_version": "resourceVersion",
          "allow_watch_bookmarks": "allowWatchBookmarks", "timeout_seconds": "timeoutSeconds",
          "watch": "watch"}


@dataclass(frozen=True)
class Resource:
    """One watched collection: its kind, apiVersion and REST plural."""

    kind: Kind
    api_version: str
    plural: str

    @property
    def path(self) -> str:
        """The cluster-wide collection's REST path."""
        group = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{group}/{self.plural}"

    def list_call(self, api: kubernetes.client.ApiClient) -> Callable[..., Any]:
        """The cluster-wide list (and watch) GET of this kind through ``api`` (its
        credentials and TLS), returning the raw urllib3 response. Not the generated
        CoreV1Api/DiscoveryV1Api: importing them builds ~200 pydantic models (1.2-1.4 s of
        CPU, the largest part of a local-mode cold start at 1,000 services)."""
        path = self.path

        def call(_preload_content: bool = False, _request_timeout: Any = None,
                 **query: Any) -> Any:
            params = [(_QUERY[k], v) for k, v in query.items() if v is not None]
            request = api.param_serialize("GET", path, query_params=params,
                                          header_params={"Accept": "application/json"},
                                          auth_settings=["BearerToken"])
            resp = api.call_api(*request, _request_timeout=_request_timeout)
            if not 200 <= resp.status <= 299:
                resp.read()
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return resp.response

        return call

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

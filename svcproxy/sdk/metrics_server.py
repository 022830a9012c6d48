"""--metrics-bind-address: /metrics (Prometheus), /healthz, /proxyMode and /configz as
kube-proxy."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from svcproxy.httpserve import Response, RoutedServer
from svcproxy.sdk.metrics import AgentMetrics

# /configz's configurations by name (component-base's configz registry): what the process
# runs with, set once it is known.
_CONFIGZ: dict[str, Any] = {}


def set_configz(name: str, document: Any) -> None:
    """Serve ``document`` (JSON-serialisable) as configuration ``name`` on /configz."""
    _CONFIGZ[name] = document


class MetricsServer(RoutedServer):
    """Serves the agent's registry on /metrics; /proxyMode names the backend."""

    def __init__(self, host: str, port: int, metrics: AgentMetrics, proxy_mode: str) -> None:
        self._metrics = metrics
        self._mode = proxy_mode
        super().__init__(host, port, "metrics")

    def _route(self, path: str) -> Response:
        if path == "/metrics":
            body = generate_latest(self._metrics.registry)
            return Response(200, body, (("Content-Type", CONTENT_TYPE_LATEST),))
        if path == "/healthz":
            return Response(200, b"ok", (("Content-Type", "text/plain; charset=utf-8"),))
        if path == "/proxyMode":  # kube-proxy's name of the mode
            mode = {"nft": "nftables"}.get(self._mode, self._mode)
            return Response(200, mode.encode(), (("Content-Type", "text/plain"),))
        if path == "/configz":
            body = json.dumps(_CONFIGZ, sort_keys=True, separators=(",", ":")).encode()
            return Response(200, body, (("Content-Type", "application/json"),
                                        ("X-Content-Type-Options", "nosniff")))
        return Response(404, b"404 page not found\n", (("Content-Type", "text/plain"),))

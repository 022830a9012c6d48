"""/healthz and /livez as kube-proxy serves them on --healthz-bind-address."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from svcproxy.httpserve import Response, RoutedServer
from svcproxy.model import ServicePortKey
from svcproxy.sdk.health import HealthStatus, ProxyHealth
from svcproxy.sdk.metrics import AgentMetrics

REFUSED_SHOWN = 50  # refused service ports listed in /healthz (the count is always whole)
_HEADERS = (("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"))


def go_time(unix: float) -> str:
    """A Unix time as Go's time.Time.String() prints it in UTC (0 is Go's zero time)."""
    if unix <= 0:
        return "0001-01-01 00:00:00 +0000 UTC"
    moment = dt.datetime.fromtimestamp(unix, dt.UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    seconds = moment.strftime("%Y-%m-%d %H:%M:%S") + (f".{fraction}" if fraction else "")
    return f"{seconds} +0000 UTC"


def healthz_body(status: HealthStatus, healthy: bool,
                 refused: Mapping[ServicePortKey, str] | None = None,
                 details: Mapping[str, object] | None = None) -> bytes:
    """kube-proxy's /healthz body; lastUpdated is "now" while healthy, as kube-proxy does.

    With service ports the dataplane refused, ``refusedServicePorts`` says how many and
    lists the first ones with the kernel's error (the node stays healthy: the other
    services are programmed). ``details`` are the backend's own keys (e.g. ipvsFallback).
    """
    last = status.current_time if healthy else status.last_updated
    eligible = "true" if status.node_eligible else "false"
    detail = ""
    if refused:
        shown = [{"servicePort": f"{k.namespace}/{k.name}:{k.port_name}/{k.protocol.value}",
                  "error": refused[k]} for k in sorted(refused)[:REFUSED_SHOWN]]
        detail = ', "refusedServicePorts": ' + json.dumps(
            {"count": len(refused), "servicePorts": shown})
    for key, value in (details or {}).items():
        detail += f", {json.dumps(key)}: {json.dumps(value)}"
    return (
        f'{{"lastUpdated": "{go_time(last)}","currentTime": "{go_time(status.current_time)}", '
        f'"nodeEligible": {eligible}{detail}}}'
    ).encode()


def livez_body(status: HealthStatus) -> bytes:
    """kube-proxy's /livez body."""
    last = status.current_time if status.healthy else status.last_updated
    return (
        f'{{"lastUpdated": "{go_time(last)}","currentTime": "{go_time(status.current_time)}"}}'
    ).encode()


class HealthzServer(RoutedServer):
    """Serves /healthz (sync loop healthy and node eligible) and /livez (sync loop healthy)."""

    def __init__(
        self, host: str, port: int, health: ProxyHealth, metrics: AgentMetrics | None = None,
        details: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        self._health = health
        self._metrics = metrics
        self._details = details  # the agent's own /healthz keys (e.g. unknownNode)
        super().__init__(host, port, "healthz")

    def _route(self, path: str) -> Response:
        status = self._health.status()
        if path == "/healthz":
            healthy = status.healthy and status.node_eligible
            self._count(self._metrics.healthz_total if self._metrics else None, healthy)
            refused = self._metrics.refused() if self._metrics else None
            details = self._metrics.backend_details() if self._metrics else {}
            if self._details is not None:
                details = {**self._details(), **details}
            body = healthz_body(status, healthy, refused, details)
            return Response(200 if healthy else 503, body, _HEADERS)
        if path == "/livez":
            self._count(self._metrics.livez_total if self._metrics else None, status.healthy)
            return Response(200 if status.healthy else 503, livez_body(status), _HEADERS)
        return Response(404, b"404 page not found\n", (("Content-Type", "text/plain"),))

    @staticmethod
    def _count(counter: Counter | None, healthy: bool) -> None:
        if counter is not None:
            counter.labels(code="200" if healthy else "503").inc()

"""Honest readiness: NOT_SERVING until every source has listed everything.

gRPC health ("" and svcproxy.v1.NodeStateService) and HTTP ``/readyz`` say SERVING/200
only once the engine is synced (a Watch arriving earlier waits for the first complete
state). A source that has been failing to reach the apiserver for longer than
``--apiserver-lost-after`` is reported on the health name "apiserver" (NOT_SERVING),
in ``/readyz``'s body and in ``svcproxy_frontend_apiserver_lost_seconds``, while the
frontend keeps serving the last known state: every replica usually loses the apiserver
together, and the state they hold is still the best there is.
"""

from __future__ import annotations

import asyncio
import logging
import time

from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.access import auth_metrics
from svcproxy.httpserve import Response, RoutedServer, parse_bind_address

log = logging.getLogger(__name__)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
API_NAMES = ("", "svcproxy.v1.NodeStateService")
APISERVER = "apiserver"
POLL = 0.5


async def not_serving() -> health_aio.HealthServicer:
    """A health servicer saying NOT_SERVING for the API until told otherwise."""
    health = health_aio.HealthServicer()
    for name in API_NAMES:
        await health.set(name, NOT_SERVING)
    return health


class Readiness:
    """Keeps gRPC health and /readyz in step with the engine and the source."""

    def __init__(self, engine: Engine, lost_after: float = 60.0) -> None:
        self.engine = engine
        self.lost_after = lost_after
        self.health = health_aio.HealthServicer()
        self.source: object = None
        self.lost_for = 0.0
        self._http: _ReadyzServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def http_port(self) -> int:
        """The port /readyz is served on (0: not served)."""
        return self._http.port if self._http is not None else 0

    @property
    def ready(self) -> bool:
        return self.engine.synced.is_set()

    async def start(self, healthz_address: str = "") -> None:
        for name in API_NAMES:
            await self.health.set(name, NOT_SERVING)
        await self.health.set(APISERVER, NOT_SERVING)
        auth_metrics.READY.set(0)
        if healthz_address:
            host, port = parse_bind_address(healthz_address, 12092)
            self._http = _ReadyzServer(host, port, self)
            log.info("serving /readyz and /livez on %s", healthz_address)
        self._task = asyncio.ensure_future(self._follow())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._http is not None:
            self._http.close()

    async def _follow(self) -> None:
        await self.engine.synced.wait()
        for name in API_NAMES:
            await self.health.set(name, SERVING)
        auth_metrics.READY.set(1)
        log.info("ready: serving the complete state")
        lost = None
        while True:
            since = getattr(self.source, "failing_since", None)
            self.lost_for = time.monotonic() - since if since is not None else 0.0
            auth_metrics.APISERVER_LOST.set(self.lost_for)
            now_lost = self.lost_for > self.lost_after
            if now_lost != lost:
                lost = now_lost
                await self.health.set(APISERVER, NOT_SERVING if lost else SERVING)
                if lost:
                    log.error("the apiserver has been unreachable for %.0f s; serving the last "
                              "known state", self.lost_for)
            await asyncio.sleep(POLL)

    def readyz(self) -> Response:
        if not self.ready:
            return Response(503, b"not ready: the sources have not listed everything yet\n")
        if self.lost_for > self.lost_after:
            return Response(200, f"ok (the apiserver has been unreachable for "
                            f"{self.lost_for:.0f} s; serving the last known state)\n".encode())
        return Response(200, b"ok\n")


class _ReadyzServer(RoutedServer):
    def __init__(self, host: str, port: int, readiness: Readiness) -> None:
        self.readiness = readiness
        super().__init__(host, port, "readyz")

    def _route(self, path: str) -> Response:
        if path == "/readyz":
            return self.readiness.readyz()
        if path in ("/livez", "/healthz"):
            return Response(200, b"ok\n")
        return Response(404, b"not found\n")

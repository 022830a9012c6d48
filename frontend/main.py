"""Runs the frontend: a source, the engine, the gRPC server and /metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from svcproxy.collector import resume_collector_after_start
from svcproxy.frontend.edge.limits import ObjectLimits, allow_kubernetes_depth
from svcproxy.frontend.fleet.service import FleetService
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.changelog import DEFAULT_BOUNDS, ViewBounds
from svcproxy.frontend.runtime.gctuning import paused_until
from svcproxy.frontend.serving.access.auth import AuthConfig, check_listen
from svcproxy.frontend.serving.access.guard import CallGuard
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.frontend.serving.readiness import Readiness
from svcproxy.frontend.serving.server import NodeStateServicer, TLSFiles, start_server

if TYPE_CHECKING:
    from svcproxy.frontend.serving.workers import StreamWorkers
    from svcproxy.frontend.sources.apiserver_early import EarlySource
    from svcproxy.frontend.sources.manifests import ManifestLimits
    from svcproxy.sdk.credentials import ClientTLS, TokenFile

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FrontendOptions:
    listen: str = "127.0.0.1:12090"
    manifests: Path | None = None
    kubeconfig: str | None = None
    # kube-proxy's --master: the apiserver's address, over the kubeconfig's server.
    master: str = ""
    service_proxy_name: str = ""
    metrics_bind_address: str = "127.0.0.1:12091"
    tls: TLSFiles | None = None
    history: int = 20000
    # --history-max-bytes, --max-views (and how long a view nobody needs is kept).
    view_bounds: ViewBounds = DEFAULT_BOUNDS
    stream_workers: int = 1
    upstream: str | None = None
    upstream_credentials: grpc.ChannelCredentials | ClientTLS | None = None
    upstream_token: TokenFile | None = None
    # Who may call (None: nobody is authenticated, so only a local --listen is accepted).
    auth: AuthConfig | None = None
    healthz_bind_address: str = ""
    apiserver_lost_after: float = 60.0
    # Bounds on one object from any source, and on one manifest file (None: the
    # manifest source's defaults; its module is imported only when it is used).
    object_limits: ObjectLimits = ObjectLimits()
    manifest_limits: ManifestLimits | None = None
    # --max-streams, --max-streams-per-peer, --stream-write-timeout
    stream_limits: StreamLimits = field(default_factory=StreamLimits)
    # --lag-warning: a node behind the revision it is served for longer is LAGGING.
    lag_warning: float = 10.0


def _start_source(opts: FrontendOptions, engine: Engine, listing: EarlySource | None) -> object:
    """The source the options name, started (its module imported only then; the
    apiserver's may have been started before, ``listing``)."""
    if opts.manifests is not None:
        from svcproxy.frontend.sources.manifests import DEFAULT_MANIFEST_LIMITS, ManifestSource

        source = ManifestSource(opts.manifests, engine.submit_threadsafe,
                                limits=opts.manifest_limits or DEFAULT_MANIFEST_LIMITS)
        log.info("reading manifests from %s", opts.manifests)
    elif opts.upstream is not None:
        from svcproxy.frontend.sources.upstream import UpstreamSource

        source = UpstreamSource(opts.upstream, engine.submit_threadsafe,
                                opts.upstream_credentials, opts.upstream_token)
        log.info("following the cluster watch of the frontend at %s", opts.upstream)
    else:
        from svcproxy.frontend.sources.apiserver_early import start_listing

        listing = listing or start_listing(opts.kubeconfig, opts.master)
        listing.sink.connect(engine.submit_threadsafe)
        log.info("watching the apiserver (%s)",
                 ", ".join(filter(None, (opts.master, opts.kubeconfig))) or "in-cluster config")
        return listing.source
    source.start()
    return source


def source_name(opts: FrontendOptions) -> str:
    """The ``source`` label of the frontend's metrics."""
    if opts.manifests is not None:
        return "manifests"
    return "upstream" if opts.upstream is not None else "apiserver"


def start_metrics(address: str) -> None:
    if not address:
        return
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0")
    log.info("serving /metrics on %s", address)


class Frontend:
    """The running frontend; ``await start()``, then ``await stop()``."""

    def __init__(self, opts: FrontendOptions, listing: EarlySource | None = None) -> None:
        """``listing``: the apiserver source, started before the frontend was imported
        (``start_listing``), for the options' apiserver."""
        self.opts = opts
        self._listing = listing
        allow_kubernetes_depth()  # json and msgspec decode what the apiserver stores
        self.engine = Engine(proxy_name=opts.service_proxy_name, history_limit=opts.history,
                             bounds=opts.view_bounds)
        self.engine.store.intake = Intake(source_name(opts), opts.object_limits)
        self.port = 0
        self._server: object = None
        self._source: object = None
        self._collector: asyncio.Task[None] | None = None
        self.workers: StreamWorkers | None = None
        self.readiness = Readiness(self.engine, opts.apiserver_lost_after)
        certs = opts.tls is not None and opts.tls.client_ca is not None
        auth = opts.auth or AuthConfig(certs, allow_anonymous=check_listen(
            opts.listen, opts.tls is not None, certs, False, False))
        self.guard = CallGuard(auth)
        self.fleet = FleetService(self.engine, self.guard.epoch, opts.lag_warning)

    async def start(self) -> None:
        """The source first: its list requests are out (the apiserver answers them on its
        own) while the API server is set up."""
        self.engine.loop = asyncio.get_running_loop()
        self._collector = asyncio.create_task(paused_until(self.engine.synced))
        await self.readiness.start(self.opts.healthz_bind_address)
        self._source = self.readiness.source = _start_source(self.opts, self.engine,
                                                             self._listing)
        servicer = NodeStateServicer(self.engine, self.opts.stream_limits, self.fleet)
        self.fleet.start()
        self._server, self.port = await start_server(self.engine, self.opts.listen,
                                                      self.opts.tls, self.guard,
                                                      self.readiness.health, servicer)
        if self.opts.stream_workers > 1:
            from svcproxy.frontend.serving.workers import StreamWorkers, tcp_address

            self.workers = StreamWorkers(self.engine, self.opts.stream_workers,
                                         tcp_address(self.opts.listen, self.port),
                                         self.opts.tls, logging.getLogger().level,
                                         self.guard, servicer)
            self.workers.start()
        start_metrics(self.opts.metrics_bind_address)

    async def stop(self) -> None:
        self.fleet.stop()
        if self._collector is not None:
            self._collector.cancel()
        self.readiness.stop()
        if self._source is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, self._source.stop)  # type: ignore[attr-defined]
        if self.workers is not None:
            await self.workers.stop()
        if self._server is not None:
            await self._server.stop(grace=1)  # type: ignore[attr-defined]


async def run_frontend(opts: FrontendOptions, listing: EarlySource | None = None) -> int:
    """Serve until SIGINT/SIGTERM (``listing``: see ``Frontend``)."""
    from svcproxy.frontend.sources.apiserver import ApiserverConfigError

    try:
        frontend = Frontend(opts, listing)
        await frontend.start()
    except (ApiserverConfigError, FileNotFoundError, OSError, ValueError) as err:
        log.error("cannot start the frontend: %s", err)
        return 1
    resume = asyncio.create_task(_resume_collector_when(frontend.engine.synced))
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    resume.cancel()
    await frontend.stop()
    return 0


async def _resume_collector_when(synced: asyncio.Event) -> None:
    """End the collector's pause from the process start (``svcproxy.cli.main``) once the
    cluster's state is loaded (and frozen out of the collector)."""
    await synced.wait()
    resume_collector_after_start()

"""The node agent: one backend, its sync runner and the servers every backend shares."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import TypeVar

from svcproxy.collector import resume_collector_after_start
from svcproxy.httpserve import BIND_RETRY_INTERVAL, BindRetry
from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import Backend, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.conntrack_cli import ConntrackCleaner
from svcproxy.sdk.conntrack_netlink import Ctnetlink
from svcproxy.sdk.conntrack_reconciler import MIN_INTERVAL, ConntrackReconciler
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.healthz import HealthzServer
from svcproxy.sdk.metrics import AgentMetrics, node_families
from svcproxy.sdk.metrics_server import MetricsServer
from svcproxy.sdk.node_context import ContextResolver
from svcproxy.sdk.runner import AfterSync, SyncRunner
from svcproxy.sdk.service_health import ServiceHealthServer
from svcproxy.sdk.source import StateSource
from svcproxy.sdk.unknown_node import UnknownNode

log = logging.getLogger(__name__)

Address = tuple[str, int]
S = TypeVar("S", HealthzServer, MetricsServer)


def default_conntrack_cleaner(min_sync_period: float = MIN_INTERVAL
                              ) -> ConntrackReconciler | ConntrackCleaner | None:
    """The netlink conntrack reconciler, run at most once per max(``min_sync_period``, 1 s);
    when ctnetlink cannot be opened, the conntrack(8)-based cleaner of changes, or None
    (with a warning) without the tool."""
    try:
        Ctnetlink().close()
        return ConntrackReconciler(min_interval=max(MIN_INTERVAL, min_sync_period))
    except OSError as err:
        log.warning("ctnetlink unavailable (%s): stale UDP/SCTP flows are cleaned per change "
                    "with conntrack(8) only, not reconciled against the table", err)
    if shutil.which("conntrack") is None:
        log.warning(
            "conntrack(8) not found: stale UDP/SCTP flows will not be cleaned after endpoint "
            "changes (install the conntrack package)"
        )
        return None
    return ConntrackCleaner()


def programs_dataplane(backend: Backend) -> bool:
    """False for backends that program nothing (``dataplane = False``, e.g. dump): they get
    no conntrack cleanup and no health-check node ports."""
    return bool(getattr(backend, "dataplane", True))


class NodeAgent:
    """Wires runner, health, metrics, health-check node ports and conntrack cleanup.

    Binding the healthz or metrics address happens here and raises OSError
    when the address is taken; nothing stays open in that case. With ``retry_unbound``
    (kube-proxy's bindAddressHardFail false) the agent proxies on without that server and
    binds it again every ``bind_retry_interval`` s until it listens.
    """

    def __init__(
        self,
        source: StateSource,
        backend: Backend,
        config: NodeConfig,
        *,
        healthz_address: Address | None = None,
        metrics_address: Address | None = None,
        conntrack: ConntrackReconciler | ConntrackCleaner | None = None,
        health_check_node_ports: bool = True,
        retry_initial: float = 1.0,
        poll: float = 0.2,
        retry_unbound: bool = False,
        bind_retry_interval: float = BIND_RETRY_INTERVAL,
    ) -> None:
        self._retry_unbound, self._bind_retry_interval = retry_unbound, bind_retry_interval
        self.health = ProxyHealth(timeout=2 * config.sync_period)
        self.metrics = AgentMetrics(families=node_families(config.node_ips))
        self.metrics.attach_backend(backend)
        if hasattr(source, "on_mismatch"):
            source.on_mismatch = lambda _node: self.metrics.state_mismatches.inc()
        if hasattr(source, "on_undecodable"):
            source.on_undecodable = lambda _node: self.metrics.undecodable_ops.inc()
        # One node context for the backend (NodePort addresses, local-traffic detection...)
        # and the health-check node ports alike.
        self.context = ContextResolver.for_backend(config, backend)
        self.service_health = ServiceHealthServer(
            self.health, self.context.resolve(None).health_check_ips
        )
        self.unknown_node = UnknownNode(config.node_name, self.metrics.registry)
        hooks: list[AfterSync] = [lambda _old, _new, _changed: resume_collector_after_start(),
                                  self.unknown_node.after_sync]
        self.conntrack = conntrack
        if conntrack is not None:
            if isinstance(conntrack, ConntrackReconciler):
                conntrack.metrics = self.metrics
            hooks.append(conntrack.after_sync)
        if health_check_node_ports:
            hooks.append(self._sync_service_health)
        self.runner = SyncRunner(
            source,
            backend,
            health=self.health,
            sync_period=config.sync_period,
            min_sync_period=config.min_sync_period,
            metrics=self.metrics,
            after_sync=hooks,
            retry_initial=retry_initial,
            poll=poll,
            context=self.context,
        )
        self._healthz: HealthzServer | BindRetry[HealthzServer] | None = None
        self._metrics_server: MetricsServer | BindRetry[MetricsServer] | None = None
        try:
            if healthz_address is not None:
                self._healthz = self._listen(
                    lambda: HealthzServer(*healthz_address, self.health, self.metrics,
                                          self.unknown_node.details),
                    "healthz", healthz_address)
            if metrics_address is not None:
                self._metrics_server = self._listen(
                    lambda: MetricsServer(*metrics_address, self.metrics, backend.name),
                    "metrics", metrics_address)
        except OSError:
            self.close()
            raise

    def _listen(self, bind: Callable[[], S], name: str, address: Address) -> S | BindRetry[S]:
        try:
            return bind()
        except OSError as err:
            if not self._retry_unbound:
                raise
            host, port = address
            log.warning("Proxying without the %s server until %s can listen (%s): retrying "
                        "every %g s (bindAddressHardFail is false)", name,
                        f"[{host}]:{port}" if ":" in host else f"{host}:{port}", err,
                        self._bind_retry_interval)
            return BindRetry(bind, name, self._bind_retry_interval)

    @property
    def healthz(self) -> HealthzServer | None:
        """The healthz server once it listens."""
        server = self._healthz
        return server.server if isinstance(server, BindRetry) else server

    @property
    def metrics_server(self) -> MetricsServer | None:
        """The metrics server once it listens."""
        server = self._metrics_server
        return server.server if isinstance(server, BindRetry) else server

    def _sync_service_health(self, _old: NodeState | None, new: NodeState,
                             _changed: frozenset[ServicePortKey]) -> None:
        self.service_health.sync(new)

    def run(self) -> None:
        """Sync until ``stop``."""
        self.runner.run()

    def stop(self) -> None:
        self.runner.stop()

    def close(self) -> None:
        """Close every port the agent opened, and stop binding those still retried; no
        conntrack reconciliation after."""
        resume_collector_after_start()
        if isinstance(self.conntrack, ConntrackReconciler):
            self.conntrack.close()
        self.service_health.close()
        for server in (self._healthz, self._metrics_server):
            if server is not None:
                server.close()

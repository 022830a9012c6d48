"""Health-check node ports: one HTTP server per ETP=Local service, as kube-proxy runs them.

A cloud load balancer probes ``healthCheckNodePort`` on every node and sends
traffic only to nodes answering 200, i.e. nodes with a local ready endpoint.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from svcproxy.httpserve import BackgroundHTTPServer, Response, Route
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.health import ProxyHealth

log = logging.getLogger(__name__)

ServiceName = tuple[str, str]  # (namespace, name)


def health_check_ports(state: NodeState) -> dict[ServiceName, int]:
    """Services needing a health-check node port: externalTrafficPolicy Local with one set."""
    ports: dict[ServiceName, int] = {}
    for sps in state.services.values():
        svc = sps.service
        if svc.external_policy_local and svc.health_check_node_port:
            ports[(svc.key.namespace, svc.key.name)] = svc.health_check_node_port
    return ports


def local_ready_endpoints(state: NodeState) -> dict[ServiceName, int]:
    """Per service, the distinct ready endpoints on this node (over all its ports)."""
    ips: dict[ServiceName, set[str]] = {}
    for sps in state.services.values():
        name = (sps.key.namespace, sps.key.name)
        ready = {ip for ip, ep in sps.endpoints.items() if ep.is_local and ep.ready}
        ips.setdefault(name, set()).update(ready)
    return {name: len(found) for name, found in ips.items()}


def health_check_body(name: ServiceName, local_endpoints: int, proxy_healthy: bool) -> bytes:
    """kube-proxy's JSON body, byte for byte (tab indented)."""
    namespace, service = name
    healthy = "true" if proxy_healthy else "false"
    return (
        "{\n"
        '\t"service": {\n'
        f'\t\t"namespace": "{namespace}",\n'
        f'\t\t"name": "{service}"\n'
        "\t},\n"
        f'\t"localEndpoints": {local_endpoints},\n'
        f'\t"serviceProxyHealthy": {healthy}\n'
        "}"
    ).encode()


@dataclass(slots=True)
class _Instance:
    port: int
    servers: list[BackgroundHTTPServer]
    endpoints: int = 0


class ServiceHealthServer:
    """Opens, serves and closes health-check node ports as services come and go.

    ``addresses`` are the IPs to listen on (from --node-port-addresses); empty
    means every address. A port that cannot be bound is logged and retried at
    the next sync; it never stops the other ports.
    """

    def __init__(self, health: ProxyHealth, addresses: Sequence[str] = ()) -> None:
        self._health = health
        self._addresses = tuple(addresses) or ("",)
        self._lock = threading.Lock()
        self._services: dict[ServiceName, _Instance] = {}

    def sync(self, state: NodeState) -> None:
        """Match the open ports and their endpoint counts to ``state``."""
        self.sync_services(health_check_ports(state))
        self.sync_endpoints(local_ready_endpoints(state))

    def sync_services(self, wanted: dict[ServiceName, int]) -> None:
        with self._lock:
            for name, inst in list(self._services.items()):
                if wanted.get(name) != inst.port:
                    log.info("Closing health check node port %d of service %s/%s", inst.port, *name)
                    _close_all(inst.servers)
                    del self._services[name]
            for name, port in wanted.items():
                if name not in self._services:
                    servers = self._open(name, port)
                    if servers is not None:
                        self._services[name] = _Instance(port, servers)

    def sync_endpoints(self, counts: dict[ServiceName, int]) -> None:
        with self._lock:
            for name, inst in self._services.items():
                inst.endpoints = counts.get(name, 0)

    def open_ports(self) -> dict[ServiceName, int]:
        """The health-check node ports currently served."""
        with self._lock:
            return {name: inst.port for name, inst in self._services.items()}

    def close(self) -> None:
        with self._lock:
            for inst in self._services.values():
                _close_all(inst.servers)
            self._services.clear()

    def _open(self, name: ServiceName, port: int) -> list[BackgroundHTTPServer] | None:
        servers: list[BackgroundHTTPServer] = []
        for address in self._addresses:
            try:
                servers.append(BackgroundHTTPServer(address, port, self._route(name), "hc"))
            except OSError as err:
                log.error(
                    "Failed to start health check node port %s:%d for service %s/%s: %s "
                    "(load balancers will see this node as unhealthy; retrying at the next sync)",
                    address or "*", port, *name, err,
                )
                _close_all(servers)
                return None
        log.info("Opened health check node port %d for service %s/%s", port, *name)
        return servers

    def _route(self, name: ServiceName) -> Route:
        def route(_path: str) -> Response:
            with self._lock:
                inst = self._services.get(name)
                count = inst.endpoints if inst else 0
            healthy = self._health.is_healthy()
            headers = (
                ("Content-Type", "application/json"),
                ("X-Content-Type-Options", "nosniff"),
                ("X-Load-Balancing-Endpoint-Weight", str(count)),
            )
            status = 200 if count and healthy else 503
            return Response(status, health_check_body(name, count, healthy), headers)

        return route


def _close_all(servers: Iterable[BackgroundHTTPServer]) -> None:
    for server in servers:
        server.close()

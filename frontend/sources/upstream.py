"""The upstream source: another frontend's cluster-wide watch as this frontend's cluster.

``svcproxy frontend --upstream ADDR`` chains frontends: this one follows ADDR's
``WatchCluster`` stream with the SDK (resume, reconnect and reset included) and feeds
its engine the Services, EndpointSlices and Nodes rebuilt from it
(upstream_objects.py), so it serves every node exactly what ADDR serves, from its own
processes and machine. A tier of chained frontends spreads thousands of watching nodes
over machines while only one of them watches the apiserver.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from svcproxy.frontend.sources.events import Delete, Event, Replace, Upsert
from svcproxy.frontend.sources.upstream_objects import Obj, node_object, service_objects
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.credentials import ClientTLS, TokenFile

log = logging.getLogger(__name__)
Sink = Callable[[Sequence[Event]], None]
ServiceName = tuple[str, str]


class UpstreamSource:
    """Follows an upstream frontend; ``start()``, ``stop()`` like the other sources."""

    def __init__(self, target: str, sink: Sink,
                 credentials: grpc.ChannelCredentials | ClientTLS | None = None,
                 token: TokenFile | None = None) -> None:
        self.target = target
        self.sink = sink
        self.client = NodeStateClient(target, "", credentials=credentials, cluster=True,
                                      max_backoff=2.0, token=token)
        self._ports: dict[ServiceName, set[ServicePortKey]] = {}
        self._slices: dict[ServiceName, set[str]] = {}
        self._stop = threading.Event()
        self._lost_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="upstream", daemon=True)

    def start(self) -> None:
        self.client.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.client.stop()
        self._thread.join(timeout=5)

    @property
    def failing_since(self) -> float | None:
        """Since when (monotonic) the upstream has been unreachable, if it is."""
        return self._lost_at

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.client.connected:
                self._lost_at = None
            elif self._lost_at is None:
                self._lost_at = time.monotonic()
            if not self.client.wait(timeout=0.5):
                continue
            taken = self.client.take()
            if taken is not None:
                state, changes = taken
                self.sink(self.events(state, changes, self.client.nodes()))

    def events(self, state: NodeState, changes: Changes,
               nodes: dict[str, NodeInfo]) -> list[Event]:
        """The source events that bring the engine to ``state``."""
        if changes.full:
            log.info("upstream %s: full state at revision %d (%d service ports, %d nodes)",
                     self.target, state.revision, len(state.services), len(nodes))
            self._ports = {}
            for key in state.services:
                self._ports.setdefault((key.namespace, key.name), set()).add(key)
            self._slices = {}
            services, slices = [], []
            for name, keys in self._ports.items():
                svc, svc_slices = self._objects(name, [state.services[k] for k in keys])
                services.append(svc)
                slices += svc_slices
            return [Replace("Service", services), Replace("EndpointSlice", slices),
                    Replace("Node", [node_object(n) for n in nodes.values()])]
        out: list[Event] = []
        for name in {(k.namespace, k.name) for k in changes.services}:
            out += self._service_events(name, state, changes.services)
        if changes.node_changed:
            out.append(Replace("Node", [node_object(n) for n in nodes.values()]))
        return out

    def _service_events(self, name: ServiceName, state: NodeState,
                        changed: frozenset[ServicePortKey]) -> list[Event]:
        keys = self._ports.setdefault(name, set())
        keys |= {k for k in changed if (k.namespace, k.name) == name}
        keys -= {k for k in keys if k not in state.services}
        old_slices = self._slices.pop(name, set())
        out: list[Event] = []
        if keys:
            svc, slices = self._objects(name, [state.services[k] for k in keys])
            out += [Upsert("Service", svc)] + [Upsert("EndpointSlice", s) for s in slices]
        else:
            del self._ports[name]
            out.append(Delete("Service", name[0], name[1]))
        out += [Delete("EndpointSlice", name[0], s)
                for s in sorted(old_slices - self._slices.get(name, set()))]
        return out

    def _objects(self, name: ServiceName, records: list[ServicePortState]
                 ) -> tuple[Obj, list[Obj]]:
        svc, slices = service_objects(records)
        self._slices[name] = {s["metadata"]["name"] for s in slices}
        return svc, slices

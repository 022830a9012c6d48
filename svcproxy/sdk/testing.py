"""Test a backend without a cluster: the real frontend in-process, or a fake source.

``FakeCluster`` runs svcproxy's real frontend (the engine that computes each node's
state, and the gRPC API on a unix socket) in a thread of the test process, fed plain
Kubernetes objects (dicts or YAML) instead of an apiserver; a backend under test is
driven through the real client and the node agent's real sync runner::

    from svcproxy.sdk.testing import FakeCluster

    with FakeCluster() as cluster:
        cluster.apply(SERVICE_YAML, ENDPOINT_SLICE_YAML)
        with cluster.run(MyBackend(), "node-a") as running:
            running.wait_synced()        # every change so far is applied
            ...                          # check what the backend programmed
            cluster.delete(SERVICE_YAML)
            running.wait_synced()

``FakeSource`` is lower level: push ``NodeState`` values to the sync runner directly.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from svcproxy.loop_thread import LoopThread
from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient

__all__ = ["FakeCluster", "FakeSource", "RunningBackend", "objects_of"]

KINDS = ("Service", "EndpointSlice", "Node")
Objects = str | Mapping[str, Any] | Iterable[Mapping[str, Any]]


class FakeSource:
    """A state source for the node agent's sync runner, fed by hand: ``push`` a
    ``NodeState`` and the keys that changed; they accumulate until the runner takes
    them, as with ``NodeStateClient``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: NodeState | None = None
        self._keys: set[ServicePortKey] = set()
        self._triggers: list[float] = []
        self._node_changed = False
        self._full = True
        self._endpoint_changes = 0
        self.takes = 0

    def push(
        self,
        state: NodeState,
        changed: Iterable[ServicePortKey] = (),
        *,
        node_changed: bool = False,
        trigger_times: Iterable[float] = (),
        reset: bool = False,
    ) -> None:
        """A new consistent state; ``reset`` marks a stream reset (next take is full)."""
        with self._cond:
            changed = set(changed)
            self._state = state
            self._keys |= changed
            self._node_changed |= node_changed
            self._triggers.extend(trigger_times)
            self._full |= reset
            self._endpoint_changes += len(changed)
            self._cond.notify_all()

    def _has_changes(self) -> bool:
        return self._state is not None and (self._full or bool(self._keys) or self._node_changed)

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(self._has_changes, timeout)

    def take(self) -> tuple[NodeState, Changes] | None:
        with self._cond:
            if self._state is None:
                return None
            self.takes += 1
            full = self._full
            changes = Changes(
                services=frozenset(self._state.services) if full else frozenset(self._keys),
                node_changed=self._node_changed or full,
                full=full,
                reason="initial" if full else "changes",
                trigger_times=tuple(self._triggers),
            )
            self._keys.clear()
            self._triggers.clear()
            self._node_changed = self._full = False
            self._endpoint_changes = 0
            return self._state, changes

    def pending(self) -> tuple[int, int]:
        with self._cond:
            return len(self._keys), self._endpoint_changes


def objects_of(*docs: Objects) -> list[dict[str, Any]]:
    """Kubernetes objects from YAML text (several documents, ``List`` kinds) or dicts.

    Raises ValueError for anything that is not a Service, EndpointSlice or Node.
    """
    out: list[dict[str, Any]] = []
    for doc in docs:
        if isinstance(doc, str):
            out += objects_of(*[d for d in yaml.safe_load_all(doc) if d is not None])
        elif isinstance(doc, Mapping):
            if str(doc.get("kind", "")).endswith("List"):
                out += objects_of(*doc.get("items") or [])
            elif doc.get("kind") in KINDS:
                out.append(dict(doc))
            else:
                raise ValueError(f"kind {doc.get('kind')!r} is not one of {', '.join(KINDS)}")
        else:
            out += objects_of(*doc)
    return out


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    namespace = "" if obj["kind"] == "Node" else meta.get("namespace", "default")
    return obj["kind"], namespace, meta.get("name", "")


class FakeCluster:
    """The real frontend on a unix socket in this process, fed Kubernetes objects.

    Use it as a context manager (or ``start``/``close``). ``target`` is the address a
    client or a backend process connects to (``svcproxy backend NAME --api TARGET``).
    """

    def __init__(self, *objects: Objects, service_proxy_name: str = "") -> None:
        self._initial = objects_of(*objects)
        self._proxy_name = service_proxy_name
        self._dir = Path(tempfile.mkdtemp(prefix="svcproxy-fake-"))
        self.target = f"unix://{self._dir / 'api.sock'}"
        self._loop = LoopThread("svcproxy-fake-cluster")
        self._engine: Any = None
        self._server: Any = None
        self._clients: list[NodeStateClient] = []

    # ---- lifecycle -------------------------------------------------------
    def start(self) -> FakeCluster:
        """Serve the API; the objects given to the constructor are the initial list."""
        self._loop.start()
        self._loop.call(self._start(), 30)
        return self

    async def _start(self) -> None:
        from svcproxy.frontend.pipeline.engine import Engine
        from svcproxy.frontend.serving.server import start_server
        from svcproxy.frontend.sources.events import Replace

        self._engine = Engine(proxy_name=self._proxy_name)
        self._engine.loop = asyncio.get_running_loop()
        self._server, _ = await start_server(self._engine, self.target)
        self._engine.submit([Replace(kind, [o for o in self._initial if o["kind"] == kind])
                             for kind in KINDS])

    def close(self) -> None:
        """Stop every client handed out, the server and the thread; remove the socket."""
        for client in self._clients:
            client.stop()
        if self._loop.running:
            if self._server is not None:
                self._loop.call(self._server.stop(grace=0), 10)
            self._loop.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _on_loop(self, function: Any) -> Any:
        return self._loop.run(function, 30)

    # ---- the cluster's objects ------------------------------------------
    def apply(self, *objects: Objects) -> None:
        """Create or update objects (as ``kubectl apply``); published when this returns."""
        from svcproxy.frontend.sources.events import Upsert

        events = [Upsert(o["kind"], o) for o in objects_of(*objects)]
        self._on_loop(lambda: self._engine.submit(events))

    def delete(self, *objects: Objects) -> None:
        """Delete objects, named by their kind, namespace and name."""
        from svcproxy.frontend.sources.events import Delete

        events = [Delete(*_identity(o)) for o in objects_of(*objects)]
        self._on_loop(lambda: self._engine.submit(events))

    def replace(self, *objects: Objects) -> None:
        """Make these the cluster's only objects (a relist)."""
        from svcproxy.frontend.sources.events import Replace

        objs = objects_of(*objects)
        events = [Replace(k, [o for o in objs if o["kind"] == k]) for k in KINDS]
        self._on_loop(lambda: self._engine.submit(events))

    def revision(self, node_name: str) -> int:
        """The revision a client of ``node_name`` has once it has every change so far."""
        def read() -> int:
            view = self._engine.changelog.views.get(node_name)
            return view.revision if view is not None else self._engine.changelog.revision
        return int(self._on_loop(read))

    # ---- nodes -------------------------------------------------------------
    def client(self, node_name: str, *, start: bool = True) -> NodeStateClient:
        """A client of ``node_name``'s state (started unless ``start=False``); it is
        stopped when the cluster closes."""
        client = NodeStateClient(self.target, node_name)
        self._clients.append(client)
        if start:
            client.start()
        return client

    def wait_client(self, client: NodeStateClient, timeout: float = 10.0) -> None:
        """Wait until ``client`` has received every change made so far."""
        target = self.revision(client.node_name)
        _wait(lambda: client.revision >= target, timeout,
              lambda: f"client of {client.node_name} at revision {client.revision}, "
              f"not {target}")

    def state(self, node_name: str, timeout: float = 10.0) -> NodeState:
        """The state ``node_name`` is served now, received by a real client (for testing a
        backend's pure parts on the frontend's real decisions)."""
        client = NodeStateClient(self.target, node_name)
        client.start()
        try:
            self.wait_client(client, timeout)
            taken = client.take()
            assert taken is not None
            return taken[0]
        finally:
            client.stop()

    @contextmanager
    def run(self, backend: Backend, node_name: str, *, min_sync_period: float = 0.0,
            sync_period: float = 3600.0) -> Iterator[RunningBackend]:
        """Run ``backend`` as node ``node_name`` under the node agent's sync runner (in a
        thread) until the block ends."""
        running = RunningBackend(self, backend, node_name, min_sync_period, sync_period)
        try:
            yield running
        finally:
            running.stop()


class RunningBackend:
    """A backend synced by the real runner from a FakeCluster; see ``FakeCluster.run``."""

    def __init__(self, cluster: FakeCluster, backend: Backend, node_name: str,
                 min_sync_period: float, sync_period: float) -> None:
        from svcproxy.sdk.health import ProxyHealth
        from svcproxy.sdk.runner import SyncRunner

        self.cluster = cluster
        self.backend = backend
        self.node_name = node_name
        self.client = cluster.client(node_name)
        self.runner = SyncRunner(self.client, backend, health=ProxyHealth(2 * sync_period),
                                 sync_period=sync_period, min_sync_period=min_sync_period,
                                 retry_initial=0.05, poll=0.02)
        self._thread = threading.Thread(target=self.runner.run, name=f"sync-{node_name}",
                                        daemon=True)
        self._thread.start()

    @property
    def applied(self) -> NodeState | None:
        """The state the backend last applied successfully."""
        return self.runner.applied

    def wait_synced(self, timeout: float = 10.0) -> NodeState:
        """Wait until the backend has applied every change made so far; the state."""
        target = self.cluster.revision(self.node_name)

        def done() -> bool:
            applied = self.runner.applied
            return applied is not None and applied.revision >= target

        _wait(done, timeout, lambda: f"backend {self.backend.name} on {self.node_name} "
              f"applied revision {self.applied.revision if self.applied else None}, not "
              f"{target} (a failing sync is logged)")
        assert self.runner.applied is not None
        return self.runner.applied

    def stop(self) -> None:
        self.runner.stop()
        self._thread.join(10)
        self.client.stop()


def _wait(predicate: Any, timeout: float, describe: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout}s: {describe()}")
        time.sleep(0.01)

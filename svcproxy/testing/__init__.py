"""Test a backend against svcproxy's real frontend, in-process: needs the frontend.

``FakeCluster`` runs the real frontend (the engine that computes each node's state, and
the gRPC API on a unix socket) in a thread of the test process, fed plain Kubernetes
objects (dicts or YAML) instead of an apiserver; a backend under test is driven through
the SDK's real client and the node agent's real sync runner::

    from svcproxy.testing import FakeCluster

    with FakeCluster() as cluster:
        cluster.apply(SERVICE_YAML, ENDPOINT_SLICE_YAML)
        with cluster.run(MyBackend(), "node-a") as running:
            running.wait_synced()        # every change so far is applied
            ...                          # check what the backend programmed
            cluster.delete(SERVICE_YAML)
            running.wait_synced()

It is above the frontend (``svcproxy.frontend``), so the SDK does not import it; what
needs no frontend (``FakeSource``, ``RunningBackend``, ``objects_of``) is in
``svcproxy.sdk.testing``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.serving.server import start_server
from svcproxy.frontend.sources.events import Delete, Replace, Upsert
from svcproxy.loop_thread import LoopThread
from svcproxy.sdk import Backend, NodeState, NodeStateClient
from svcproxy.sdk.testing import KINDS, Objects, RunningBackend, _wait, objects_of

__all__ = ["FakeCluster", "RunningBackend", "objects_of"]


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
        events = [Upsert(o["kind"], o) for o in objects_of(*objects)]
        self._on_loop(lambda: self._engine.submit(events))

    def delete(self, *objects: Objects) -> None:
        """Delete objects, named by their kind, namespace and name."""
        events = [Delete(*_identity(o)) for o in objects_of(*objects)]
        self._on_loop(lambda: self._engine.submit(events))

    def replace(self, *objects: Objects) -> None:
        """Make these the cluster's only objects (a relist)."""
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

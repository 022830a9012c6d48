"""A running scenario lab: namespaces, echo pods, the real frontend and backend.

Tests write manifests, then poll with real traffic until the expected
behaviour shows up (``eventually``); nothing is restarted between changes.
In local mode the backend runs the frontend's computation itself, from the stand-in
apiserver holding the same objects as the manifests; the frontend still runs on the
manifests, so the two computations' states can be compared (``assert_same_state``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from tests.support.lab import manifests
from tests.support.lab.apiserver import LabApiserver
from tests.support.lab.client import Summary, probe, summarize
from tests.support.lab.echo import EchoServer
from tests.support.lab.netns import LabError
from tests.support.lab.nodestate import differences, node_state
from tests.support.lab.plan import SERVER_PORTS, LabSpec, standard_spec
from tests.support.lab.processes import (
    Process,
    backend_argv,
    frontend,
    local_backend_argv,
    wait_for_path,
)
from tests.support.lab.topology import Lab, Namespaces

from . import leftovers
from .backends import BackendCase
from .socket_level import SocketLevel

T = TypeVar("T")
NODE = "node1"
LOCAL_COLD_START = 90.0  # generous: the loaded machine has taken 20 s
CLEANUP_TIMEOUT = 60.0  # one ``--cleanup`` process, start-up included


@contextmanager
def scratch_netns(prefix: str = "spns") -> Iterator[str]:
    """A network namespace of its own (``Namespaces``, unique per run, loopback up),
    deleted afterwards (also on failure)."""
    spaces = Namespaces()
    try:
        yield spaces.add_ns(prefix)
    finally:
        spaces.destroy()


@functools.cache
def missing_requirements() -> str:
    """Why the lab cannot run here, or "" when it can (found once per session)."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    try:
        with scratch_netns("check"):
            pass
    except LabError as err:
        return f"cannot create network namespaces: {err}"
    return ""


@contextmanager
def netns_or_skip(prefix: str) -> Iterator[str]:
    """A scratch namespace for a test, or the test skipped with why there can be none."""
    why = missing_requirements()
    if why:
        pytest.skip(why)
    with scratch_netns(prefix) as name:
        yield name


class ScenarioLab:
    """The standard lab plus the frontend (root namespace) and one backend on node1."""

    def __init__(self, backend: BackendCase, spec: LabSpec | None = None) -> None:
        self.backend = backend
        self.lab = Lab(spec or standard_spec())
        self.dir = Path(tempfile.mkdtemp(prefix=f"sp{self.lab.tag}-"))
        self.manifests = self.dir / "manifests"
        self.socket = self.dir / "api.sock"
        self.servers: list[EchoServer] = []
        self.frontend: Process | None = None
        self.agent: Process | None = None
        self.apiserver: LabApiserver | None = None  # local mode's
        self.sockets: SocketLevel | None = None
        # node1's kernel objects before the backend first started (what --cleanup leaves).
        self.before_backend: set[leftovers.Item] = set()
        if backend.socket_level:
            on_node = {self.lab.ns(NODE)} | {self.lab.ns(p.name) for p in self.spec.pods
                                             if p.node.name == NODE}
            self.sockets = SocketLevel(self.dir, self.lab.tag, on_node)

    @property
    def spec(self) -> LabSpec:
        return self.lab.spec

    def start(self) -> ScenarioLab:
        self.manifests.mkdir()
        self.lab.build()
        if self.backend.local:
            self.apiserver = LabApiserver(self.lab.ns(NODE), self.dir)
        self.apply("nodes.yaml", [
            manifests.node(self.spec.node("node1"), zone="zone-a"),
            manifests.node(self.spec.node("node2"), zone="zone-b"),
        ])
        self.servers = [
            EchoServer(self.lab.ns(p.name), p.name, SERVER_PORTS).start() for p in self.spec.pods
        ]
        self.frontend = frontend(self.manifests, self.socket, self.dir / "frontend.log").start()
        wait_for_path(self.socket, process=self.frontend)
        if self.sockets is not None:
            self.sockets.start()
        self.before_backend = leftovers.snapshot(self.lab.ns(NODE))
        self.start_backend()
        return self

    def start_backend(self, *extra: str) -> None:
        """(Re)start the backend process on node1 with the case's flags plus ``extra``; in
        local mode, wait until its own frontend has caught up (its cold start is not the
        scenarios' to wait for)."""
        if self.agent is not None:
            self.agent.stop()
        self.agent = Process(self._backend_argv(*extra), self.dir / "backend.log",
                             env=self._backend_env()).start()
        if self.apiserver is not None:
            self.assert_same_state(timeout=LOCAL_COLD_START)

    def _backend_argv(self, *extra: str) -> list[str]:
        flags = (*self.backend.extra_args, *extra)
        if self.apiserver is not None:
            argv = local_backend_argv(self.lab.ns(NODE), self.backend.name,
                                      self.apiserver.kubeconfig, NODE, flags)
        else:
            argv = backend_argv(self.lab.ns(NODE), self.backend.name,
                                f"unix://{self.socket}", NODE, flags)
        if self.sockets is not None:
            argv = self.sockets.backend_argv(argv)
        return argv

    def _backend_env(self) -> dict[str, str | None]:
        """Local mode: nothing naming a frontend or in-cluster credentials, and the private
        directory of its frontend's socket under the lab's (``local_target``)."""
        if self.apiserver is None:
            return {}
        return {"SVCPROXY_API": None, "KUBERNETES_SERVICE_HOST": None,
                "TMPDIR": str(self.dir)}

    def run_backend_cleanup(self) -> subprocess.CompletedProcess[bytes]:
        """``svcproxy backend NAME --cleanup`` on node1 (the running one is stopped first)."""
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
        env = {k: v for k, v in {**os.environ, **self._backend_env()}.items() if v is not None}
        return subprocess.run(self._backend_argv("--cleanup"), capture_output=True,
                              timeout=CLEANUP_TIMEOUT, env=env)

    def stop(self) -> None:
        for proc in (self.agent, self.frontend):
            if proc is not None:
                proc.stop()
        if self.apiserver is not None:
            self.apiserver.close()
        for server in self.servers:
            server.stop()
        if self.sockets is not None:
            self.sockets.stop()
        self.lab.destroy()
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        parts = []
        for label, proc in (("backend", self.agent), ("frontend", self.frontend)):
            if proc is not None:
                parts.append(f"--- {label} log (tail) ---\n{proc.tail()}")
        return "\n".join(parts)

    # manifests

    def apply(self, filename: str, docs: Sequence[manifests.Doc]) -> None:
        manifests.write(self.manifests, filename, docs)
        if self.apiserver is not None:
            self.apiserver.apply(filename, list(docs))

    def delete(self, filename: str) -> None:
        manifests.remove(self.manifests, filename)
        if self.apiserver is not None:
            self.apiserver.delete(filename)

    # local mode

    def local_target(self) -> str:
        """The unix socket the running local-mode backend's own frontend serves."""
        found = sorted(self.dir.glob("svcproxy-local-*/api.sock"),
                       key=lambda p: p.stat().st_mtime)
        if not found:
            raise AssertionError(f"no local-mode frontend socket under {self.dir}\n{self.logs()}")
        return f"unix://{found[-1]}"

    def assert_same_state(self, timeout: float = 30.0) -> None:
        """The state the local-mode backend follows equals what the frontend serves node1
        from the same objects in split mode (polled until both have caught up)."""
        split = f"unix://{self.socket}"

        def same() -> None:
            try:
                lines = differences(node_state(split, NODE),
                                    node_state(self.local_target(), NODE))
            except grpc.RpcError as err:
                raise AssertionError(f"GetNodeState: {err}") from None
            assert not lines, "local mode (second) differs from split mode (first):\n" + (
                "\n".join(lines[:20]))

        self.eventually(same, timeout)

    # traffic

    def probe(
        self, client: str, proto: str, host: str, port: int, count: int = 1,
        timeout: float = 1.0,
    ) -> Summary:
        """``count`` attempts from ``client`` (a pod, a node or an external client)."""
        ns = self.lab.ns(client)
        if self.sockets is not None and self.sockets.handles(ns):
            return summarize(self.sockets.probe(ns, proto, host, port, count, timeout))
        return summarize(probe(ns, proto, host, port, count, timeout))

    def eventually(self, check: Callable[[], T], timeout: float = 20.0) -> T:
        """Retry ``check`` until it passes (returns without AssertionError)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return check()
            except AssertionError as err:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{err}\n{self.logs()}") from None
                if self.agent is not None and not self.agent.alive():
                    raise AssertionError(f"backend exited\n{self.logs()}") from None
                time.sleep(0.1)

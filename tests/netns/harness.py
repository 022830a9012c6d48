"""A running scenario lab: namespaces, echo pods, the real frontend and backend.

Tests write manifests, then poll with real traffic until the expected
behaviour shows up (``eventually``); nothing is restarted between changes.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from tests.lab import manifests
from tests.lab.client import Summary, probe, summarize
from tests.lab.echo import EchoServer
from tests.lab.plan import SERVER_PORTS, LabSpec, standard_spec
from tests.lab.processes import Process, backend_argv, frontend, wait_for_path
from tests.lab.topology import Lab

from .backends import BackendCase
from .socket_level import SocketLevel

T = TypeVar("T")
NODE = "node1"


@contextmanager
def scratch_netns(prefix: str = "spns") -> Iterator[str]:
    """An empty network namespace of its own, deleted afterwards (also on failure)."""
    name = f"{prefix}{os.getpid()}-{random.randrange(1 << 30):x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def missing_requirements() -> str:
    """Why the lab cannot run here, or "" when it can."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe_ns = f"spcheck{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe_ns], capture_output=True)
    if done.returncode != 0:
        return f"cannot create network namespaces: {done.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe_ns], capture_output=True)
    return ""


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
        self.sockets: SocketLevel | None = None
        if backend.socket_level:
            on_node = {self.lab.ns(NODE)} | {self.lab.ns(p.name) for p in self.spec.pods
                                             if p.node.name == NODE}
            self.sockets = SocketLevel(self.dir, self.lab.tag, on_node)

    @property
    def spec(self) -> LabSpec:
        return self.lab.spec

    def start(self) -> ScenarioLab:
        self.manifests.mkdir()
        manifests.write(self.manifests, "nodes.yaml", [
            manifests.node(self.spec.node("node1"), zone="zone-a"),
            manifests.node(self.spec.node("node2"), zone="zone-b"),
        ])
        self.lab.build()
        self.servers = [
            EchoServer(self.lab.ns(p.name), p.name, SERVER_PORTS).start() for p in self.spec.pods
        ]
        self.frontend = frontend(self.manifests, self.socket, self.dir / "frontend.log").start()
        wait_for_path(self.socket, process=self.frontend)
        if self.sockets is not None:
            self.sockets.start()
        self.start_backend()
        return self

    def start_backend(self, *extra: str) -> None:
        """(Re)start the backend process on node1 with the case's flags plus ``extra``."""
        if self.agent is not None:
            self.agent.stop()
        argv = backend_argv(
            self.lab.ns(NODE), self.backend.name, f"unix://{self.socket}", NODE,
            (*self.backend.extra_args, *extra),
        )
        if self.sockets is not None:
            argv = self.sockets.backend_argv(argv)
        self.agent = Process(argv, self.dir / "backend.log").start()

    def run_backend_cleanup(self) -> subprocess.CompletedProcess[bytes]:
        """``svcproxy backend NAME --cleanup`` on node1 (the running one is stopped first)."""
        if self.agent is not None:
            self.agent.stop()
        argv = backend_argv(
            self.lab.ns(NODE), self.backend.name, f"unix://{self.socket}", NODE,
            (*self.backend.extra_args, "--cleanup"),
        )
        if self.sockets is not None:
            argv = self.sockets.backend_argv(argv)
        return subprocess.run(argv, capture_output=True, timeout=60)

    def stop(self) -> None:
        for proc in (self.agent, self.frontend):
            if proc is not None:
                proc.stop()
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

    def delete(self, filename: str) -> None:
        manifests.remove(self.manifests, filename)

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

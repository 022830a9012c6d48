"""Local mode: no frontend address, a kubeconfig - the backend computes its node's state
in process (the real frontend on a private unix socket, followed through the SDK's client)
from a stand-in apiserver, and follows its changes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import pytest

from tests.frontend.sources.test_apiserver_source import endpoint_slice, node, service
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.lab.processes import stop
from tests.support.paths import REPO

SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]


# Bounds on waits that end as soon as what they wait for happens: local mode's cold start
# took 10-19 s at load 12 on the shared 2-core machine (1.2 s of CPU), as the scenario
# suite's LOCAL_COLD_START allows for.
COLD_START = 90.0
CHANGE = 30.0
STOP = 60.0
# Ephemeral ports: an empty address in the file is defaulted (kube-proxy's 127.0.0.1:10249
# and 0.0.0.0:10256), ports any other process on the machine may hold; the backend then
# exits at once ("Address already in use") and the test used to wait out its bound.
PORTS = "healthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: 127.0.0.1:0\n"


class Output:
    """A process's stdout lines as they come, and its stderr kept for failure messages
    (both pipes drained, so a full one never blocks the process)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: Queue[str] = Queue()
        self.stderr: list[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        self._pumps = [threading.Thread(target=self._pump, args=(proc.stdout, self.lines.put),
                                        daemon=True),
                       threading.Thread(target=self._pump,
                                        args=(proc.stderr, self.stderr.append), daemon=True)]
        for pump in self._pumps:
            pump.start()

    @staticmethod
    def _pump(stream: Any, put: Any) -> None:
        for line in stream:
            put(line)

    def next_with(self, text: str, timeout: float) -> dict:
        """The next stdout line holding ``text``; fails with the process's stderr if it
        exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    self.join()
                    raise AssertionError(f"exited ({self.proc.returncode}) before a line "
                                         f"with {text}:\n{''.join(self.stderr)}") from None
                continue
            if text in line:
                return json.loads(line)
        raise AssertionError(f"no line with {text} within {timeout}s:\n{''.join(self.stderr)}")

    def join(self) -> None:
        for pump in self._pumps:
            pump.join(10)


@contextmanager
def running(argv: list[str], **popen: Any) -> Iterator[Output]:
    """``argv`` started (without a frontend address or in-cluster settings in its
    environment) and its output followed; on leaving, stopped (SIGTERM, then SIGKILL if it
    has not exited within STOP), its output drained, and unless the block failed, checked
    to have exited 0."""
    proc = subprocess.Popen(argv, env=_local_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)
    out = Output(proc)
    try:
        yield out
    finally:
        stop(proc, STOP)
        out.join()
    assert proc.returncode == 0, "".join(out.stderr)


@contextmanager
def web_cluster(token: str | None) -> Iterator[FakeApiserver]:
    """A stand-in apiserver holding service web (endpoint 10.0.0.1) and node-a, closed on
    leaving (``token``: the one it accepts, None: it asks for none)."""
    fake = FakeApiserver(token=token)
    try:
        fake.create("Service", service("web"))
        fake.create("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.1"]))
        fake.create("Node", node("node-a"))
        yield fake
    finally:
        fake.close()


def _dump_config(path: Path, kubeconfig: Path) -> Path:
    """A KubeProxyConfiguration for the dump backend in local mode, written to ``path``."""
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\nmode: dump\n"
                    f"clientConnection: {{kubeconfig: {kubeconfig}}}\n" + PORTS)
    return path


def _local_env() -> dict[str, str]:
    """This environment without what would point the backend at a frontend or in-cluster."""
    return {k: v for k, v in os.environ.items()
            if k not in ("SVCPROXY_API", "KUBERNETES_SERVICE_HOST")}


def test_local_mode_follows_the_apiserver_without_a_frontend(tmp_path: Path) -> None:
    with web_cluster("s3cret") as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.conf", fake.url, "s3cret")
        conf = _dump_config(tmp_path / "config.conf", kubeconfig)
        with running([*SVCPROXY, "backend", f"--config={conf}",
                      "--hostname-override=node-a"]) as out:
            out.next_with("10.0.0.1", COLD_START)
            fake.update("EndpointSlice", endpoint_slice("web-abc", "web",
                                                        ["10.0.0.1", "10.0.0.7"]))
            out.next_with("10.0.0.7", CHANGE)
        assert "Local mode" in "".join(out.stderr)


@pytest.mark.parametrize("with_kubeconfig", [True, False])
def test_master_overrides_the_kubeconfigs_server_as_kube_proxy_does(
        tmp_path: Path, with_kubeconfig: bool) -> None:
    """kube-proxy's --master: the kubeconfig's server replaced (its credentials kept), or
    with no kubeconfig the apiserver reached at that address alone (no in-cluster)."""
    with web_cluster("s3cret" if with_kubeconfig else None) as fake:
        argv = [*SVCPROXY, "backend", "--proxy-mode=dump", "--hostname-override=node-a",
                "--healthz-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0",
                f"--master={fake.url}"]
        if with_kubeconfig:  # the kubeconfig's own server is dead
            dead = write_kubeconfig(tmp_path / "kubeconfig.conf", "http://127.0.0.1:1", "s3cret")
            argv.append(f"--kubeconfig={dead}")
        with running(argv) as out:
            out.next_with("10.0.0.1", COLD_START)
        stderr = "".join(out.stderr)
        assert "Local mode" in stderr and "--master" not in stderr.replace(fake.url, "")


def test_local_mode_lists_before_the_backend_is_set_up(tmp_path: Path) -> None:
    """As ``svcproxy frontend`` does: the apiserver's listing starts before the backend's
    set-up imports its modules (the node agent's last of them)."""
    with web_cluster("t") as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.conf", fake.url, "t")
        conf = _dump_config(tmp_path / "config.conf", kubeconfig)
        with running([sys.executable, "-X", "importtime", "-m", "svcproxy.cli", "backend",
                      f"--config={conf}", "--hostname-override=node-a", "-v=4"]) as out:
            out.next_with("10.0.0.1", COLD_START)
    lines = "".join(out.stderr).splitlines()
    connect = next(i for i, line in enumerate(lines) if "Starting new HTTP connection" in line)
    agent = next(i for i, line in enumerate(lines) if line.startswith("import time:")
                 and line.endswith(" svcproxy.sdk.node_agent"))
    assert connect < agent, "the backend's modules were imported before the listing began"


def test_local_mode_with_an_unusable_kubeconfig_exits_naming_it(tmp_path: Path) -> None:
    """The frontend starts before the backend is set up; its failure still ends the process
    with the reason, and its private socket directory is removed."""
    missing = tmp_path / "missing-kubeconfig"
    conf = _dump_config(tmp_path / "config.conf", missing)
    work = tmp_path / "tmp"
    work.mkdir()
    done = subprocess.run([*SVCPROXY, "backend", f"--config={conf}",
                           "--hostname-override=node-a"], env={**_local_env(), "TMPDIR": str(work)},
                          text=True, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert f"local mode: cannot watch the apiserver: cannot use --kubeconfig {missing}" in (
        done.stderr)
    assert not list(work.iterdir())


# Run in a fresh interpreter: what local mode's start-up imports, and what it leaves out.
START_IMPORTS = """
import json, sys
from pathlib import Path
from svcproxy.sdk.addresses import discover_node_ips
from svcproxy.frontend.main import Frontend, FrontendOptions
from svcproxy.frontend.sources.apiserver import load_api_client
from svcproxy.sdk.context import interface_addresses
discover_node_ips(), interface_addresses(("lo",))
Frontend(FrontendOptions(listen="unix:///nonexistent/api.sock", kubeconfig=sys.argv[1]))
load_api_client(sys.argv[1])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} |
                        {m for m in sys.modules if m.startswith(("kubernetes.", "svcproxy."))})))
"""


def test_local_start_imports_only_what_it_uses(tmp_path: Path) -> None:
    """The frontend's kubernetes client without the package's other subpackages, node
    addresses without pyroute2; no cryptography, TLS, stream workers, manifest or upstream
    source unless asked for."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, "http://127.0.0.1:1", "t")
    out = subprocess.run([sys.executable, "-c", START_IMPORTS, str(kubeconfig)], check=True,
                         capture_output=True, text=True, timeout=60,
                         cwd=REPO).stdout
    loaded = set(json.loads(out))
    assert {"kubernetes", "kubernetes.client", "kubernetes.config", "grpc"} <= loaded
    unused = {"pyroute2", "jsonschema", "kubernetes_validate", "websocket", "cryptography",
              "kubernetes.dynamic", "kubernetes.stream", "kubernetes.leaderelection",
              "kubernetes.informer", "svcproxy.frontend.sources.manifests",
              "svcproxy.frontend.sources.upstream", "svcproxy.frontend.serving.workers",
              "svcproxy.frontend.serving.access.tls"}
    assert not loaded & unused, f"imported at start: {sorted(loaded & unused)}"


# The frontend as a process (``svcproxy frontend``), its modules written out as it exits.
FRONTEND_PROCESS = """
import atexit, json, sys
from pathlib import Path
from svcproxy.cli import main
atexit.register(lambda: Path(sys.argv[1]).write_text(json.dumps(sorted(sys.modules))))
sys.exit(main(sys.argv[2:]))
"""
# What the kubernetes package's own __init__ would import and the frontend never uses
# (``kubernetes.utils`` it does: ``kubernetes.client.rest`` imports from it).
KUBERNETES_UNUSED = {"kubernetes.dynamic", "kubernetes.stream", "kubernetes.leaderelection",
                     "kubernetes.informer", "kubernetes_validate", "jsonschema", "websocket"}


def test_frontend_process_serves_the_apiserver_without_the_kubernetes_init(
        tmp_path: Path) -> None:
    """``svcproxy frontend`` imports the kubernetes client as local mode does (the package
    without its ``__init__``), and still lists, watches and serves a node's state."""
    from tests.support.churn import get_node_state

    modules = tmp_path / "modules.json"
    with web_cluster("t") as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t")
        target = f"unix://{tmp_path / 'api.sock'}"
        with running([sys.executable, "-c", FRONTEND_PROCESS, str(modules), "frontend",
                      f"--kubeconfig={kubeconfig}", f"--listen={target}",
                      "--metrics-bind-address="], cwd=REPO) as out:
            deadline = time.monotonic() + COLD_START
            while not any("frontend synced" in line for line in out.stderr):
                assert out.proc.poll() is None and time.monotonic() < deadline, \
                    "".join(out.stderr)
                time.sleep(0.05)
            endpoints = [ep for rec in get_node_state(target, "node-a").values()
                         for ep in rec.endpoints]
            fake.update("EndpointSlice", endpoint_slice("web-abc", "web",
                                                        ["10.0.0.1", "10.0.0.7"]))
            deadline = time.monotonic() + CHANGE
            while "10.0.0.7" not in str(get_node_state(target, "node-a")):
                assert time.monotonic() < deadline, "the watched change was not served"
                time.sleep(0.05)
    assert "10.0.0.1" in str(endpoints)
    loaded = set(json.loads(modules.read_text()))
    assert {"kubernetes.client", "kubernetes.config", "kubernetes.watch"} <= loaded
    assert not loaded & KUBERNETES_UNUSED, f"imported: {sorted(loaded & KUBERNETES_UNUSED)}"


def test_backend_version_is_read_only_when_asked_for() -> None:
    """``svcproxy backend --version`` (kube-proxy's flag) prints the installed version; the
    parser every start builds does not look it up."""
    from importlib.metadata import version

    from svcproxy.kubeproxy import cli as kubeproxy_cli

    done = subprocess.run([*SVCPROXY, "backend", "--version"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout == f"svcproxy {version('svcproxy')}\n"
    looked_up = []
    real = kubeproxy_cli.version_text
    kubeproxy_cli.version_text = lambda: looked_up.append(1) or real()  # type: ignore[assignment]
    try:
        kubeproxy_cli.build_parser().parse_known_args(["--hostname-override=a"])
    finally:
        kubeproxy_cli.version_text = real  # type: ignore[assignment]
    assert not looked_up


def test_frontend_asks_the_apiserver_before_setting_up_its_api_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source starts first: the list requests are out (the apiserver answers them on
    its own) while the gRPC server is set up, not after."""
    from svcproxy.frontend import main

    fake = FakeApiserver(token="t")
    try:
        fake.create("Node", node("node-a"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t")
        real, listed_first = main.start_server, []

        async def start_server(*args: Any, **kw: Any) -> Any:
            deadline = time.monotonic() + 10
            while not fake.list_requests and time.monotonic() < deadline:
                time.sleep(0.01)  # blocks the loop: only the source's own threads can ask
            listed_first.append(bool(fake.list_requests))
            return await real(*args, **kw)

        monkeypatch.setattr(main, "start_server", start_server)
        frontend = main.Frontend(main.FrontendOptions(
            listen=f"unix://{tmp_path / 'api.sock'}", kubeconfig=str(kubeconfig),
            metrics_bind_address=""))

        async def start_and_stop() -> None:
            await frontend.start()
            await frontend.stop()

        asyncio.run(start_and_stop())
        assert listed_first == [True]
    finally:
        fake.close()

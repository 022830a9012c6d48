"""Local mode: no frontend address, a kubeconfig - the backend computes its node's state
in process (the real frontend on a private unix socket, followed through the SDK's client)
from a stand-in apiserver, and follows its changes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import pytest

from tests.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.test_apiserver_source import endpoint_slice, node, service

SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]


def lines_of(proc: subprocess.Popen[str]) -> Queue[str]:
    out: Queue[str] = Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


def next_with(out: Queue[str], text: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except Empty:
            break
        if text in line:
            return json.loads(line)
    raise AssertionError(f"no line with {text} within {timeout}s")


def test_local_mode_follows_the_apiserver_without_a_frontend(tmp_path: Path) -> None:
    fake = FakeApiserver(token="s3cret")
    try:
        fake.create("Service", service("web"))
        fake.create("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.1"]))
        fake.create("Node", node("node-a"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.conf", fake.url, "s3cret")
        conf = tmp_path / "config.conf"
        conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                        "kind: KubeProxyConfiguration\nmode: dump\n"
                        f"clientConnection: {{kubeconfig: {kubeconfig}}}\n"
                        "healthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: ''\n")
        env = {k: v for k, v in os.environ.items()
               if k not in ("SVCPROXY_API", "KUBERNETES_SERVICE_HOST")}
        proc = subprocess.Popen([*SVCPROXY, "backend", f"--config={conf}",
                                 "--hostname-override=node-a"], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out = lines_of(proc)
            next_with(out, "10.0.0.1")
            fake.update("EndpointSlice", endpoint_slice("web-abc", "web",
                                                        ["10.0.0.1", "10.0.0.7"]))
            next_with(out, "10.0.0.7")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0
        assert proc.stderr is not None and "Local mode" in proc.stderr.read()
    finally:
        fake.close()


def test_local_mode_with_an_unusable_kubeconfig_exits_naming_it(tmp_path: Path) -> None:
    """The frontend starts before the backend is set up; its failure still ends the process
    with the reason, and its private socket directory is removed."""
    conf = tmp_path / "config.conf"
    missing = tmp_path / "missing-kubeconfig"
    conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\nmode: dump\n"
                    f"clientConnection: {{kubeconfig: {missing}}}\n"
                    "healthzBindAddress: ''\nmetricsBindAddress: ''\n")
    work = tmp_path / "tmp"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("SVCPROXY_API", "KUBERNETES_SERVICE_HOST")}
    done = subprocess.run([*SVCPROXY, "backend", f"--config={conf}",
                           "--hostname-override=node-a"], env={**env, "TMPDIR": str(work)},
                          text=True, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert f"local mode: cannot watch the apiserver: cannot use --kubeconfig {missing}" in (
        done.stderr)
    assert not list(work.iterdir())


# Run in a fresh interpreter: what local mode's start-up imports, and what it leaves out.
START_IMPORTS = """
import json, sys
from pathlib import Path
from svcproxy.agent.local_frontend import bare_kubernetes_package
bare_kubernetes_package()
from svcproxy.agent.addresses import discover_node_ips
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
                         cwd=Path(__file__).resolve().parents[1]).stdout
    loaded = set(json.loads(out))
    assert {"kubernetes", "kubernetes.client", "kubernetes.config", "grpc"} <= loaded
    unused = {"pyroute2", "jsonschema", "kubernetes_validate", "websocket", "cryptography",
              "kubernetes.dynamic", "kubernetes.stream", "kubernetes.leaderelection",
              "kubernetes.informer", "svcproxy.frontend.sources.manifests",
              "svcproxy.frontend.sources.upstream", "svcproxy.frontend.serving.workers",
              "svcproxy.frontend.serving.access.tls"}
    assert not loaded & unused, f"imported at start: {sorted(loaded & unused)}"


def test_backend_version_is_read_only_when_asked_for() -> None:
    """``svcproxy backend --version`` (kube-proxy's flag) prints the installed version; the
    parser every start builds does not look it up."""
    from importlib.metadata import version

    from svcproxy.agent import kubeproxy_cli

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

"""Local mode: no frontend address, a kubeconfig - the backend computes its node's state
in process (the real frontend on a private unix socket, followed through the SDK's client)
from a stand-in apiserver, and follows its changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue

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

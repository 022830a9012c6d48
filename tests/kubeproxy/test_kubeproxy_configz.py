"""kube-proxy's /configz on the metrics address: the effective configuration as JSON under
its group name, the same one --write-config-to writes."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path

import yaml

from tests.kubeproxy.test_kubeproxy_config import SVCPROXY, _free_port
from tests.support.lab.processes import stop


def _get(port: int, path: str) -> tuple[int, str, bytes]:
    """(status, content type, body); status 0 while nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    except OSError:
        return 0, "", b""
    finally:
        conn.close()


def test_configz_serves_what_write_config_to_writes(tmp_path: Path) -> None:
    metrics = _free_port()
    conf = tmp_path / "config.conf"
    conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\nmode: dump\nclusterCIDR: 10.0.0.0/8\n"
                    "iptables:\n  minSyncPeriod: 250ms\nconntrack:\n  maxPerCore: 0\n"
                    f"metricsBindAddress: 127.0.0.1:{metrics}\nhealthzBindAddress: ''\n")
    argv = [*SVCPROXY, "backend", f"--config={conf}", "--hostname-override=Node-A"]
    written = tmp_path / "effective.yaml"
    proc = subprocess.run([*argv, f"--write-config-to={written}"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "SVCPROXY_API": f"unix://{tmp_path}/no-frontend.sock"}
    backend = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _get(metrics, "/metrics")[0] != 200:
            assert backend.poll() is None, backend.stderr.read() if backend.stderr else ""
            time.sleep(0.2)
        status, kind, body = _get(metrics, "/configz")
    finally:
        stop(backend)
    assert status == 200, body
    assert kind == "application/json"
    served = json.loads(body)
    assert list(served) == ["kubeproxy.config.k8s.io"]
    assert served["kubeproxy.config.k8s.io"] == yaml.safe_load(written.read_text())
    assert served["kubeproxy.config.k8s.io"]["iptables"]["minSyncPeriod"] == "250ms"
    assert served["kubeproxy.config.k8s.io"]["hostnameOverride"] == "node-a"

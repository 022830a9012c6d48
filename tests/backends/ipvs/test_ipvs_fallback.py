"""Visible IPVS fallback: this kernel has no IPVS (the test checks that first), so the ipvs
backend runs the iptables backend and says so in its log, /metrics and /healthz; with
--ipvs-no-fallback it exits with the reason instead."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import subprocess
import sys

import pytest

from svcproxy.backends.ipvs import cli as ipvs_cli
from svcproxy.sdk.agent import add_agent_arguments, config_from_args
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource

SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]


@pytest.fixture(autouse=True)
def _no_ipvs() -> None:
    if not ipvs_cli.ipvs_available():
        pytest.fail("this kernel has IPVS: the fallback cannot be shown here")


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def test_fallback_is_logged_exported_and_in_healthz(caplog: pytest.LogCaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    ipvs_cli.add_arguments(parser)
    args = parser.parse_args(["--node-name", "node-a", "--node-ip", "192.0.2.10"])
    config = config_from_args(args)
    with caplog.at_level(logging.WARNING):
        backend = ipvs_cli.create(args, config)
    assert backend.name == "iptables"
    warnings = [r.getMessage() for r in caplog.records if "no IPVS" in r.getMessage()]
    assert len(warnings) == 1 and "Falling back to the iptables backend" in warnings[0]
    agent = NodeAgent(FakeSource(), backend, config, healthz_address=("127.0.0.1", 0),
                      metrics_address=("127.0.0.1", 0))
    try:
        assert agent.metrics_server is not None and agent.healthz is not None
        _, metrics = get(agent.metrics_server.port, "/metrics")
        line = next(x for x in metrics.splitlines() if x.startswith("svcproxy_ipvs_fallback{"))
        assert "no IPVS generic-netlink family" in line and line.endswith(" 1.0")
        assert get(agent.metrics_server.port, "/proxyMode")[1] == "iptables"
        _, body = get(agent.healthz.port, "/healthz")
        fallback = json.loads(body)["ipvsFallback"]
        assert fallback["runningMode"] == "iptables" and "no IPVS" in fallback["reason"]
    finally:
        agent.close()


@pytest.mark.parametrize("argv", [
    ["backend", "ipvs", "--ipvs-no-fallback"],
    ["backend", "--proxy-mode=ipvs", "--ipvs-no-fallback"],
])
def test_no_fallback_exits_with_the_reason(argv: list[str]) -> None:
    proc = subprocess.run([*SVCPROXY, *argv, "--api", "unix:///nonexistent",
                           "--hostname-override=node-a", "--healthz-bind-address=",
                           "--metrics-bind-address="], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "this kernel has no IPVS (no IPVS generic-netlink family" in proc.stderr
    assert "--ipvs-no-fallback" in proc.stderr

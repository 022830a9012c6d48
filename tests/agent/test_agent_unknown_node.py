"""A valid node name the frontend knows no Node for (a typo in --node-name) is said in the
log, on /metrics and in /healthz, through a real frontend and a real agent; the Node
appearing clears it."""

from __future__ import annotations

import http.client
import io
import json
import logging
from pathlib import Path

import pytest

from svcproxy.backends.dump.backend import DumpBackend
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from tests.support.examples import copy_examples
from tests.support.running_agent import running
from tests.support.waiting import wait_for

NODE_C = """apiVersion: v1
kind: Node
metadata: {name: node-c, labels: {topology.kubernetes.io/zone: zone-a}}
status: {addresses: [{type: InternalIP, address: 192.168.10.13}]}
"""


def get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_an_unknown_node_name_is_said_until_the_node_appears(
        frontend_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manifests = copy_examples(tmp_path)
    frontend = frontend_factory(manifests)
    client = NodeStateClient(frontend.opts.listen, "node-c")  # valid, and no such Node
    agent = NodeAgent(client, DumpBackend(io.StringIO()), NodeConfig("node-c"),
                      healthz_address=("127.0.0.1", 0), metrics_address=("127.0.0.1", 0),
                      health_check_node_ports=False, poll=0.02)
    assert agent.healthz is not None and agent.metrics_server is not None
    healthz, metrics = agent.healthz.port, agent.metrics_server.port

    def unknown() -> object:
        return json.loads(get(healthz, "/healthz")).get("unknownNode")

    client.start()
    try:
        with caplog.at_level(logging.WARNING, "svcproxy.sdk"), running(agent):
            wait_for(lambda: unknown() is not None, timeout=30)
            detail = unknown()
            assert isinstance(detail, dict) and detail["nodeName"] == "node-c"
            assert "check --node-name" in detail["message"]
            assert "svcproxy_node_unknown 1.0" in get(metrics, "/metrics")
            assert "the frontend knows no Node 'node-c': check --node-name" in caplog.text
            (manifests / "node-c.yaml").write_text(NODE_C)
            wait_for(lambda: unknown() is None, timeout=30)
            assert "svcproxy_node_unknown 0.0" in get(metrics, "/metrics")
    finally:
        client.stop()

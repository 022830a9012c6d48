"""/healthz, /livez and /metrics over real HTTP on loopback, driven by a running agent."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from svcproxy.httpserve import BackgroundHTTPServer, Response, parse_bind_address
from svcproxy.model import (
    Endpoint,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    TrafficPolicy,
)
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource
from tests.support.running_agent import running
from tests.support.waiting import wait_for

GO_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \+0000 UTC$")
KEY = ServicePortKey("default", "web", "http", Protocol.TCP)
LOCAL = ServicePortKey("default", "local", "", Protocol.TCP)


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def node_state(revision: int, endpoints: int, terminating: bool = False) -> NodeState:
    eps = {f"10.1.0.{i + 1}": Endpoint(f"10.1.0.{i + 1}", 8080, internal=True, external=True,
                                       cluster=True)
           for i in range(endpoints)}
    web = ServicePortState(ServicePort(KEY, cluster_ips=("10.96.0.1",), port=80,
                                       has_endpoints=bool(eps)), eps)
    remote = {"10.1.9.9": Endpoint("10.1.9.9", 80, is_local=False)}
    local = ServicePortState(
        ServicePort(LOCAL, type=ServiceType.NODE_PORT, cluster_ips=("10.96.0.2",), port=80,
                    node_port=30080, external_traffic_policy=TrafficPolicy.LOCAL,
                    has_endpoints=True), remote)
    return NodeState("node-a", revision, NodeInfo("node-a", terminating=terminating),
                     {KEY: web, LOCAL: local})


class GatedBackend(Backend):
    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.count = 0

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.gate.wait()
        self.count += 1


@dataclass
class Agent:
    source: FakeSource
    backend: GatedBackend
    agent: NodeAgent

    @property
    def healthz(self) -> int:
        assert self.agent.healthz is not None
        return self.agent.healthz.port

    @property
    def metrics(self) -> int:
        assert self.agent.metrics_server is not None
        return self.agent.metrics_server.port

    def metric(self, name: str, labels: str = "") -> float:
        text = get(self.metrics, "/metrics")[2].decode()
        pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
        found = re.search(pattern, text, re.MULTILINE)
        assert found, f"{name}{labels} not in /metrics"
        return float(found.group(1))


@pytest.fixture
def agent() -> Iterator[Callable[..., Agent]]:
    with ExitStack() as stack:
        def make(sync_period: float = 30.0) -> Agent:
            source, backend = FakeSource(), GatedBackend()
            config = NodeConfig("node-a", sync_period=sync_period, min_sync_period=0.0)
            node_agent = stack.enter_context(running(NodeAgent(
                source, backend, config, healthz_address=("127.0.0.1", 0),
                metrics_address=("127.0.0.1", 0), poll=0.02)))
            stack.callback(backend.gate.set)  # first: a blocked sync lets the agent stop
            return Agent(source, backend, node_agent)

        yield make


def test_healthz_and_livez_answer_like_kube_proxy(agent: Callable[..., Agent]) -> None:
    a = agent()
    a.source.push(node_state(1, 2))
    wait_for(lambda: a.backend.count == 1)
    for path in ("/healthz", "/livez"):
        status, headers, body = get(a.healthz, path)
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Content-Type-Options"] == "nosniff"
        doc = json.loads(body)
        assert GO_TIME.match(doc["lastUpdated"]) and GO_TIME.match(doc["currentTime"])
        assert doc["lastUpdated"] == doc["currentTime"]
    assert json.loads(get(a.healthz, "/healthz")[2])["nodeEligible"] is True
    assert "nodeEligible" not in json.loads(get(a.healthz, "/livez")[2])
    assert get(a.healthz, "/other")[0] == 404


def test_healthz_fails_while_updates_stall_and_recovers(agent: Callable[..., Agent]) -> None:
    a = agent(sync_period=0.25)
    a.source.push(node_state(1, 1))
    wait_for(lambda: a.backend.count == 1)
    a.backend.gate.clear()
    a.source.push(node_state(2, 2), [KEY])
    wait_for(lambda: get(a.healthz, "/healthz")[0] == 503)
    status, _, body = get(a.healthz, "/livez")
    assert status == 503
    doc = json.loads(body)
    assert doc["lastUpdated"] != doc["currentTime"], "stale lastUpdated is reported when failing"
    assert a.metric("kubeproxy_proxy_healthz_total", '{code="503"}') >= 1
    a.backend.gate.set()
    wait_for(lambda: get(a.healthz, "/healthz")[0] == 200)
    assert get(a.healthz, "/livez")[0] == 200


def test_terminating_node_fails_healthz_but_not_livez(agent: Callable[..., Agent]) -> None:
    a = agent()
    a.source.push(node_state(1, 1))
    wait_for(lambda: a.backend.count == 1)
    a.source.push(node_state(2, 1, terminating=True), node_changed=True)
    wait_for(lambda: get(a.healthz, "/healthz")[0] == 503)
    assert json.loads(get(a.healthz, "/healthz")[2])["nodeEligible"] is False
    assert get(a.healthz, "/livez")[0] == 200


FAMILY = '{ip_family="IPv4"}'  # kube-proxy labels its sync metrics by IP family


def test_metrics_move_as_syncs_happen(agent: Callable[..., Agent]) -> None:
    a = agent()
    status, headers, body = get(a.metrics, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in (
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "kubeproxy_network_programming_duration_seconds_bucket",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "kubeproxy_sync_proxy_rules_service_changes_total",
    ):
        assert name in body.decode()
    assert 'le="16.384"' in body.decode(), "kube-proxy's ExponentialBuckets(0.001, 2, 15)"
    assert a.metric("kubeproxy_sync_proxy_rules_duration_seconds_count", FAMILY) == 0

    a.source.push(node_state(1, 2))
    wait_for(lambda: a.backend.count == 1)
    wait_for(lambda: a.metric("kubeproxy_sync_proxy_rules_duration_seconds_count", FAMILY) == 1)
    assert a.metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count", FAMILY) == 1
    assert a.metric("kubeproxy_sync_proxy_rules_service_changes_total") == 2
    assert a.metric("kubeproxy_sync_proxy_rules_endpoint_changes_total") == 3
    assert a.metric("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                    '{ip_family="IPv4",traffic_policy="external"}') == 1
    first_sync = a.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds", FAMILY)
    assert abs(first_sync - time.time()) < 10

    a.source.push(node_state(2, 4), [KEY], trigger_times=[time.time() - 2.0])
    wait_for(lambda: a.metric("kubeproxy_sync_proxy_rules_duration_seconds_count", FAMILY) == 2)
    assert a.metric("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", FAMILY) == 1
    assert a.metric("kubeproxy_sync_proxy_rules_endpoint_changes_total") == 5
    assert a.metric("kubeproxy_sync_proxy_rules_service_changes_total") == 2
    assert a.metric("kubeproxy_network_programming_duration_seconds_count", FAMILY) == 1
    bucket = "kubeproxy_network_programming_duration_seconds_bucket"
    assert a.metric(bucket, '{ip_family="IPv4",le="1.0"}') == 0
    assert a.metric(bucket, '{ip_family="IPv4",le="3.0"}') == 1
    assert a.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds", FAMILY) >= first_sync
    queued = a.metric("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", FAMILY)
    assert queued >= first_sync


def test_pending_gauges_show_changes_waiting_for_a_stalled_sync(
    agent: Callable[..., Agent],
) -> None:
    a = agent()
    a.source.push(node_state(1, 1))
    wait_for(lambda: a.backend.count == 1)
    a.backend.gate.clear()
    a.source.push(node_state(2, 1), [KEY])
    wait_for(lambda: a.source.takes >= 2)  # its sync is under way, blocked at the gate
    a.source.push(node_state(3, 2), [KEY, LOCAL])
    wait_for(lambda: a.metric("kubeproxy_sync_proxy_rules_service_changes_pending") == 2)
    a.backend.gate.set()
    wait_for(lambda: a.metric("kubeproxy_sync_proxy_rules_service_changes_pending") == 0)


def test_metrics_port_serves_proxy_mode(agent: Callable[..., Agent]) -> None:
    a = agent()
    assert get(a.metrics, "/proxyMode")[2] == b"gated"
    assert get(a.metrics, "/healthz")[0] == 200


@pytest.mark.parametrize(("text", "expected"), [
    ("0.0.0.0:10256", ("0.0.0.0", 10256)), ("[::1]:9", ("::1", 9)), (":80", ("", 80)),
    ("127.0.0.1", ("127.0.0.1", 10256)), ("::", ("::", 10256)),
])
def test_bind_addresses_are_parsed_like_kube_proxy(text: str, expected: tuple[str, int]) -> None:
    assert parse_bind_address(text, 10256) == expected


def test_wildcard_address_serves_ipv4_and_ipv6_loopback() -> None:
    server = BackgroundHTTPServer("0.0.0.0", 0, lambda path: Response(200, path.encode()))
    try:
        assert get(server.port, "/x")[2] == b"/x"
        conn = http.client.HTTPConnection("::1", server.port, timeout=5)
        try:
            conn.request("GET", "/y")
            assert conn.getresponse().read() == b"/y"
        finally:
            conn.close()
    finally:
        server.close()

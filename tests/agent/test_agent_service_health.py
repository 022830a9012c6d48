"""Health-check node ports over real HTTP on loopback, following the agent's syncs."""

from __future__ import annotations

import http.client
import json
import logging
import socket
from collections.abc import Iterator

import pytest

from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    TrafficPolicy,
)
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.service_health import ServiceHealthServer, health_check_body
from svcproxy.sdk.testing import FakeSource
from tests.support import running_agent
from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int) -> tuple[int, dict[str, str], bytes] | None:
    """GET / on the port; None when nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    except ConnectionRefusedError:
        return None
    finally:
        conn.close()


def lb_service(name: str, hc_port: int, local_ready: int = 0, local_not_ready: int = 0,
               remote: int = 1, policy: TrafficPolicy = TrafficPolicy.LOCAL,
               ports: tuple[str, ...] = ("http",)) -> dict[ServicePortKey, ServicePortState]:
    eps: dict[str, Endpoint] = {}
    for i in range(local_ready):
        eps[f"10.1.0.{i + 1}"] = Endpoint(f"10.1.0.{i + 1}", 8080, is_local=True)
    for i in range(local_not_ready):
        eps[f"10.1.1.{i + 1}"] = Endpoint(f"10.1.1.{i + 1}", 8080, ready=False, serving=False,
                                          is_local=True)
    for i in range(remote):
        eps[f"10.2.0.{i + 1}"] = Endpoint(f"10.2.0.{i + 1}", 8080)
    result = {}
    for n, port_name in enumerate(ports):
        key = ServicePortKey("shop", name, port_name, Protocol.TCP)
        svc = ServicePort(key, type=ServiceType.LOAD_BALANCER, cluster_ips=("10.96.1.1",),
                          port=80 + n, node_port=30080 + n, external_traffic_policy=policy,
                          health_check_node_port=hc_port, has_endpoints=bool(eps))
        result[key] = ServicePortState(svc, eps)
    return result


def state(revision: int, *services: dict[ServicePortKey, ServicePortState]) -> NodeState:
    merged: dict[ServicePortKey, ServicePortState] = {}
    for s in services:
        merged.update(s)
    return NodeState("node-a", revision, None, merged)


class NullBackend(Backend):
    def __init__(self) -> None:
        self.count = 0

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.count += 1


@pytest.fixture
def running() -> Iterator[tuple[FakeSource, NodeAgent, NullBackend]]:
    source, backend = FakeSource(), NullBackend()
    config = NodeConfig("node-a", node_ips=("127.0.0.1", "192.0.2.99"),
                        node_port_addresses=("127.0.0.0/8",), min_sync_period=0.0)
    with running_agent.running(NodeAgent(source, backend, config, poll=0.02)) as agent:
        yield source, agent, backend


def push_and_wait(source: FakeSource, agent: NodeAgent, st: NodeState) -> None:
    source.push(st, st.services.keys())
    wait_for(lambda: agent.runner.applied is not None
             and agent.runner.applied.revision == st.revision)


def test_answers_200_with_local_endpoints_and_503_without(
    running: tuple[FakeSource, NodeAgent, NullBackend],
) -> None:
    source, agent, _ = running
    port = free_port()
    push_and_wait(source, agent, state(1, lb_service("cart", port, local_ready=0)))
    answer = probe(port)
    assert answer is not None
    status, headers, body = answer
    assert status == 503
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Load-Balancing-Endpoint-Weight"] == "0"
    assert json.loads(body) == {"service": {"namespace": "shop", "name": "cart"},
                                "localEndpoints": 0, "serviceProxyHealthy": True}

    push_and_wait(source, agent, state(2, lb_service("cart", port, local_ready=2,
                                                       local_not_ready=1)))
    answer = probe(port)
    assert answer is not None and answer[0] == 200
    assert answer[1]["X-Load-Balancing-Endpoint-Weight"] == "2"
    assert json.loads(answer[2])["localEndpoints"] == 2

    push_and_wait(source, agent, state(3, lb_service("cart", port, local_not_ready=2)))
    answer = probe(port)
    assert answer is not None and answer[0] == 503


def test_ports_open_and_close_as_services_change(
    running: tuple[FakeSource, NodeAgent, NullBackend],
) -> None:
    source, agent, _ = running
    p1, p2, p3 = free_port(), free_port(), free_port()
    push_and_wait(source, agent, state(1, lb_service("a", p1, 1),
                                         lb_service("b", p2, 1, ports=("http", "https"))))
    assert probe(p1) is not None and probe(p2) is not None
    assert agent.service_health.open_ports() == {("shop", "a"): p1, ("shop", "b"): p2}

    push_and_wait(source, agent, state(2, lb_service("b", p3, 1)))
    assert probe(p1) is None, "service a is gone: its port is closed"
    assert probe(p2) is None, "service b moved to another health check port"
    answer = probe(p3)
    assert answer is not None and answer[0] == 200

    push_and_wait(source, agent, state(3, lb_service("b", p3, 1,
                                                       policy=TrafficPolicy.CLUSTER)))
    assert probe(p3) is None, "externalTrafficPolicy Cluster needs no health check port"


def test_a_port_in_use_is_reported_and_does_not_stop_others(
    running: tuple[FakeSource, NodeAgent, NullBackend], caplog: pytest.LogCaptureFixture,
) -> None:
    source, agent, _ = running
    busy, ok = free_port(), free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", busy))
    squatter.listen()
    try:
        with caplog.at_level(logging.ERROR):
            push_and_wait(source, agent, state(1, lb_service("a", busy, 1),
                                                 lb_service("b", ok, 1)))
        assert f"health check node port 127.0.0.1:{busy}" in caplog.text
        assert "shop/a" in caplog.text
        answer = probe(ok)
        assert answer is not None and answer[0] == 200
        assert agent.service_health.open_ports() == {("shop", "b"): ok}
    finally:
        squatter.close()
    push_and_wait(source, agent, state(2, lb_service("a", busy, 1), lb_service("b", ok, 1)))
    answer = probe(busy)
    assert answer is not None and answer[0] == 200, "retried at the next sync"


def test_unhealthy_proxy_answers_503_even_with_local_endpoints() -> None:
    now = [1000.0]
    health = ProxyHealth(timeout=60, clock=lambda: now[0])
    server = ServiceHealthServer(health, ("127.0.0.1",))
    port = free_port()
    try:
        server.sync(state(1, lb_service("cart", port, local_ready=1)))
        answer = probe(port)
        assert answer is not None and answer[0] == 200
        health.queued()
        now[0] += 61
        answer = probe(port)
        assert answer is not None and answer[0] == 503
        assert json.loads(answer[2])["serviceProxyHealthy"] is False
        assert json.loads(answer[2])["localEndpoints"] == 1
    finally:
        server.close()
    assert probe(port) is None


def test_body_is_kube_proxys_byte_for_byte() -> None:
    assert health_check_body(("ns", "svc"), 3, True) == (
        b'{\n\t"service": {\n\t\t"namespace": "ns",\n\t\t"name": "svc"\n\t},\n'
        b'\t"localEndpoints": 3,\n\t"serviceProxyHealthy": true\n}'
    )

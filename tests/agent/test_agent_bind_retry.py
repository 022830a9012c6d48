"""bindAddressHardFail false: a healthz or metrics address that cannot listen is retried until
it can, as kube-proxy's serveHealthz / serveMetrics do every 5 s."""

from __future__ import annotations

import http.client
import io
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from svcproxy.backends.dump.backend import DumpBackend
from svcproxy.httpserve import BackgroundHTTPServer, BindRetry, Response
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource
from tests.support.lab.processes import stop
from tests.support.waiting import wait_for

SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]


def status(port: int, path: str) -> int:
    """The HTTP status of GET ``path`` on loopback, 0 when nothing answers (never raises)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def held_port() -> socket.socket:
    """A loopback port held by a listening socket of the test."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def retry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bind-retry")]


def test_a_taken_healthz_port_is_served_once_it_is_free(tmp_path: Path) -> None:
    """A real backend process: /metrics answers while the test holds the healthz port,
    /healthz answers 200 once the test lets it go (the retry interval shortened to 0.2 s)."""
    holder = held_port()
    healthz = holder.getsockname()[1]
    metrics = free_port()
    log_path = tmp_path / "backend.log"
    argv = [*SVCPROXY, "backend", "--proxy-mode=dump", "--cluster-cidr=10.0.0.0/8",
            f"--healthz-bind-address=127.0.0.1:{healthz}",
            f"--metrics-bind-address=127.0.0.1:{metrics}"]
    env = {**os.environ, "SVCPROXY_API": f"unix://{tmp_path}/no-frontend.sock",
           "SVCPROXY_BIND_RETRY_INTERVAL": "0.2"}
    with log_path.open("w") as log:
        backend = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: backend.poll() is not None or status(metrics, "/metrics") == 200,
                 timeout=60, interval=0.2)
        assert backend.poll() is None, log_path.read_text()
        assert status(holder.getsockname()[1], "/healthz") == 0  # the test's socket, no HTTP
        holder.close()
        # no frontend: never synced, so 503 is what a bound healthz says; any answer is it
        wait_for(lambda: backend.poll() is not None or status(healthz, "/healthz") != 0,
                 timeout=60, interval=0.1)
        assert backend.poll() is None, log_path.read_text()
        assert status(healthz, "/livez") in (200, 503)
    finally:
        stop(backend)
        holder.close()
    text = log_path.read_text()
    assert "Proxying without the healthz server" in text
    assert "healthz server is listening" in text


def test_the_retry_binds_once_free_and_close_leaves_no_thread_or_socket() -> None:
    holder = held_port()
    port = holder.getsockname()[1]

    def bind() -> BackgroundHTTPServer:
        return BackgroundHTTPServer("127.0.0.1", port, lambda _path: Response(200, b"ok"))

    retry = BindRetry(bind, "test", interval=0.05)
    try:
        assert retry.server is None and retry_threads()
        holder.close()
        wait_for(lambda: status(port, "/") == 200, timeout=30)
        assert retry.server is not None
    finally:
        retry.close()
        holder.close()
    assert not retry_threads()
    assert status(port, "/") == 0


def test_closing_while_retrying_leaves_no_thread() -> None:
    holder = held_port()
    port = holder.getsockname()[1]
    attempts: list[int] = []

    def bind() -> BackgroundHTTPServer:
        attempts.append(1)
        return BackgroundHTTPServer("127.0.0.1", port, lambda _path: Response(200))

    try:
        retry = BindRetry(bind, "test", interval=0.05)
        wait_for(lambda: len(attempts) >= 2, timeout=30)
        retry.close()
        assert not retry_threads() and retry.server is None
    finally:
        holder.close()


def test_an_agent_with_retry_unbound_proxies_on_and_closes_its_retries() -> None:
    """With retry_unbound the agent is built though its healthz address is taken; it serves
    /healthz once the port is free, and close leaves no retry thread nor the port open."""
    holder = held_port()
    port = holder.getsockname()[1]
    config = NodeConfig(node_name="n1", sync_period=30.0)
    agent = NodeAgent(FakeSource(), DumpBackend(io.StringIO()), config,
                      healthz_address=("127.0.0.1", port), health_check_node_ports=False,
                      retry_unbound=True, bind_retry_interval=0.05)
    try:
        assert agent.healthz is None
        holder.close()
        wait_for(lambda: status(port, "/livez") != 0, timeout=30)
        assert agent.healthz is not None and agent.healthz.port == port
    finally:
        agent.close()
        holder.close()
    assert not retry_threads()
    assert status(port, "/livez") == 0

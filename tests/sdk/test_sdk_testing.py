"""svcproxy.testing, svcproxy.sdk.testing and svcproxy.sdk.run: the real frontend
in-process, fed YAML."""

from __future__ import annotations

import threading

import pytest

from svcproxy.sdk import Backend, Changes, NodeState, NodeStateClient, ServicePortKey
from svcproxy.sdk.run import run
from svcproxy.sdk.testing import objects_of
from svcproxy.testing import FakeCluster
from tests.support.waiting import wait_for

WEB = """
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.5], conditions: {ready: true}, nodeName: node-a}
- {addresses: [10.244.2.5], conditions: {ready: true}, nodeName: node-b}
"""
NODE_A = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
          "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}
KEY = ServicePortKey("shop", "web", "http", "TCP")


class Recorder(Backend):
    """Keeps every sync; fails the syncs it is told to."""

    name = "recorder"

    def __init__(self, failures: int = 0) -> None:
        self.syncs: list[tuple[NodeState, Changes]] = []
        self.failures = failures

    def sync(self, state: NodeState, changes: Changes) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected failure")
        self.syncs.append((state, changes))


def endpoint_ips(state: NodeState) -> list[str]:
    return sorted(state.services[KEY].endpoints)


def test_objects_of_reads_yaml_lists_and_dicts() -> None:
    objs = objects_of(WEB, NODE_A, {"kind": "List", "items": [NODE_A]}, [NODE_A])
    assert [o["kind"] for o in objs] == ["Service", "EndpointSlice", "Node", "Node", "Node"]
    with pytest.raises(ValueError, match="ConfigMap"):
        objects_of({"kind": "ConfigMap", "metadata": {"name": "x"}})


def test_backend_follows_applied_and_deleted_objects() -> None:
    with FakeCluster(NODE_A) as cluster:
        cluster.apply(WEB)
        backend = Recorder()
        with cluster.run(backend, "node-a") as running:
            state = running.wait_synced()
            assert endpoint_ips(state) == ["10.244.1.5", "10.244.2.5"]
            assert state.node is not None and state.node.addresses == ("192.0.2.1",)
            assert backend.syncs[0][1].full
            assert state.services[KEY].endpoints["10.244.1.5"].is_local

            cluster.delete(WEB)
            state = running.wait_synced()
            assert KEY not in state.services
            last = backend.syncs[-1][1]
            assert not last.full and KEY in last.services


def test_a_failed_sync_is_retried_as_a_full_sync() -> None:
    with FakeCluster(WEB) as cluster, cluster.run(Recorder(failures=1), "node-a") as running:
        running.wait_synced()
        assert running.backend.syncs[0][1].reason == "retry"  # type: ignore[attr-defined]


def test_run_starts_a_client_that_was_not_started() -> None:
    """The newcomer's first program: run(backend, NodeStateClient(api, node))."""
    with FakeCluster(WEB) as cluster:
        backend, stop = Recorder(), threading.Event()
        client = NodeStateClient(cluster.target, "node-b")
        thread = threading.Thread(target=run, args=(backend, client, stop), daemon=True)
        thread.start()
        try:
            cluster.wait_client(client)
            cluster.apply(WEB.replace("10.244.2.5", "10.244.2.6"))
            cluster.wait_client(client)
            wait_for(lambda: backend.syncs and endpoint_ips(backend.syncs[-1][0])
                     == ["10.244.1.5", "10.244.2.6"])
            assert backend.syncs[0][1].full
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()
        assert client.stopped  # started by run, so stopped by run


def test_run_retries_a_failed_sync_without_a_new_change() -> None:
    with FakeCluster(WEB) as cluster:
        backend, stop = Recorder(failures=1), threading.Event()
        thread = threading.Thread(target=run, daemon=True,
                                  args=(backend, NodeStateClient(cluster.target, "n"), stop))
        thread.start()
        try:
            wait_for(lambda: backend.syncs)
            assert backend.syncs[0][1].full and backend.syncs[0][1].reason == "retry"
        finally:
            stop.set()
            thread.join(10)


def test_state_is_what_a_node_is_served() -> None:
    with FakeCluster(WEB, NODE_A) as cluster:
        on_a, on_b = cluster.state("node-a"), cluster.state("node-b")
        assert on_a.node is not None and on_a.node.name == "node-a" and on_b.node is None
        assert on_a.services[KEY].endpoints["10.244.1.5"].is_local
        assert not on_b.services[KEY].endpoints["10.244.1.5"].is_local
        cluster.apply(WEB.replace("port: 80,", "port: 81,"))
        assert cluster.state("node-a").services[KEY].service.port == 81

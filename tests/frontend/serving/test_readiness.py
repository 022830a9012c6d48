"""Honest readiness: nothing is served before the apiserver has been listed, and a lost
apiserver is reported while the last known state is still served."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from svcproxy.frontend.serving.access import auth_metrics
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.sources.test_apiserver_source import cluster_ip_service, endpoint_slice, node
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.waiting import wait_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    server = FakeApiserver(token="t")
    server.create("Node", node("n1"))
    server.create("Service", cluster_ip_service("web", "10.96.0.10"))
    server.create("EndpointSlice", endpoint_slice("web-abc", "web", ["10.0.0.1"]))
    yield server
    server.lists_open.set()
    server.close()


def health(fe, service: str = "") -> int:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(fe.opts.listen) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def readyz(fe) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    url = f"http://127.0.0.1:{fe.frontend.readiness.http_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_not_serving_and_no_snapshot_until_every_kind_is_listed(  # type: ignore[no-untyped-def]
        api: FakeApiserver, frontend_factory, tmp_path: Path) -> None:
    api.lists_open.clear()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "t")
    fe = frontend_factory(None, kubeconfig=str(kubeconfig), healthz_bind_address="127.0.0.1:0")
    assert health(fe) == NOT_SERVING
    assert health(fe, "svcproxy.v1.NodeStateService") == NOT_SERVING
    assert readyz(fe)[0] == 503
    assert auth_metrics.READY._value.get() == 0
    first: list[pb.WatchEvent] = []

    def watch() -> None:
        with grpc.insecure_channel(fe.opts.listen) as channel:
            call = pb_grpc.NodeStateServiceStub(channel).Watch(
                pb.WatchRequest(node_name="n1"), timeout=20)
            first.append(next(call))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    watcher.join(1.0)
    assert not first, "a Watch was answered before the frontend had synced"
    api.lists_open.set()
    watcher.join(15)
    (event,) = first
    names = {op.replace_service.service.key.name for op in event.ops
             if op.WhichOneof("op") == "replace_service"}
    assert names == {"web"} and not event.more
    wait_for(lambda: health(fe) == SERVING)
    assert readyz(fe) == (200, "ok\n")


def test_a_lost_apiserver_is_reported_while_the_state_is_served(  # type: ignore[no-untyped-def]
        api: FakeApiserver, frontend_factory, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "t")
    fe = frontend_factory(None, kubeconfig=str(kubeconfig), healthz_bind_address="127.0.0.1:0",
                          apiserver_lost_after=0.5)
    wait_for(lambda: health(fe) == SERVING, timeout=10)
    wait_for(lambda: health(fe, "apiserver") == SERVING)
    api.stop()
    wait_for(lambda: health(fe, "apiserver") == NOT_SERVING, timeout=10)
    status, body = readyz(fe)
    assert status == 200 and "apiserver has been unreachable" in body
    assert auth_metrics.APISERVER_LOST._value.get() > 0.5
    assert health(fe) == SERVING
    with grpc.insecure_channel(fe.opts.listen) as channel:
        state = pb_grpc.NodeStateServiceStub(channel).GetNodeState(
            pb.GetNodeStateRequest(node_name="n1"), timeout=5)
    assert [s.service.key.name for s in state.services] == ["web"]
    api.start()
    wait_for(lambda: health(fe, "apiserver") == SERVING, timeout=20)


def test_a_chained_frontend_reports_its_lost_upstream(frontend_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from svcproxy.frontend.main import FrontendOptions
    from tests.support.examples import copy_examples
    from tests.support.frontend import RunningFrontend

    up = RunningFrontend(FrontendOptions(manifests=copy_examples(tmp_path),
                                         listen=f"unix://{tmp_path}/up.sock",
                                         metrics_bind_address="")).start()
    down = frontend_factory(None, upstream=up.opts.listen, apiserver_lost_after=0.5)
    wait_for(lambda: health(down) == SERVING, timeout=20)
    wait_for(lambda: health(down, "apiserver") == SERVING)
    up.stop()
    wait_for(lambda: health(down, "apiserver") == NOT_SERVING, timeout=10)
    with grpc.insecure_channel(down.opts.listen) as channel:
        state = pb_grpc.NodeStateServiceStub(channel).GetNodeState(
            pb.GetNodeStateRequest(node_name="node-a"), timeout=5)
    assert state.services

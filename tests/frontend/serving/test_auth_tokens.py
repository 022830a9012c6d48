"""ServiceAccount tokens: reviewed by the stand-in apiserver through the official client
(TokenReview, then the token's pod), bound to the pod's node."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from svcproxy.frontend.serving.access import tokenreview
from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.credentials import TokenFile
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.waiting import wait_for

AUDIENCE = "svcproxy"
NS, SA = "svcproxy", "svcproxy-backend"
# Longer than any machine takes for a test's calls: the cache's expiry is reached by
# moving its clock (``clock``), not by waiting, so a slow machine cannot expire it early.
TTL = 30.0


class Clock:
    """The token cache's clock (``tokenreview.time``): real time plus what a test added."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(tokenreview, "time", moved)
    return moved


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    server = FakeApiserver(token="frontend-token")
    yield server
    server.close()


@pytest.fixture
def fe(frontend_factory, tmp_path: Path, api: FakeApiserver):  # type: ignore[no-untyped-def]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "frontend-token")
    return frontend_factory(copy_examples(tmp_path), auth=AuthConfig(
        token_audience=AUDIENCE, token_kubeconfig=str(kubeconfig), token_cache_ttl=TTL,
        cluster_readers=frozenset({"system:serviceaccounts:tools"})))


def pod(api: FakeApiserver, name: str, node: str) -> dict[str, Any]:
    return api.create("Pod", {"metadata": {"name": name, "namespace": NS},
                              "spec": {"nodeName": node}})


def call(fe, token: str | None, method: str, node: str = "node-a") -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    """One call with ``token``; returns its status (OK when it succeeds)."""
    return details(fe, token, method, node)[0]


def details(fe, token: str | None, method: str,  # type: ignore[no-untyped-def]
            node: str = "node-a") -> tuple[grpc.StatusCode, str]:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(fe.opts.listen) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        try:
            if method == "Watch":
                next(stub.Watch(pb.WatchRequest(node_name=node), metadata=metadata, timeout=5))
            elif method == "GetNodeState":
                stub.GetNodeState(pb.GetNodeStateRequest(node_name=node), metadata=metadata,
                                  timeout=5)
            else:
                stub.ListNodes(pb.ListNodesRequest(), metadata=metadata, timeout=5)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_pods_token_reads_its_node_only(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "backend-a", "node-a"))
    assert call(fe, token, "Watch") == grpc.StatusCode.OK
    assert call(fe, token, "GetNodeState") == grpc.StatusCode.OK
    code, message = details(fe, token, "GetNodeState", "node-b")
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert f"system:serviceaccount:{NS}:{SA}" in message and "only node node-a" in message
    assert call(fe, token, "ListNodes") == grpc.StatusCode.PERMISSION_DENIED
    assert call(fe, token, "Watch", "node-b") == grpc.StatusCode.PERMISSION_DENIED


def test_a_pod_on_another_node_reads_that_node_not_this_one(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "backend-b", "node-b"))
    assert call(fe, token, "Watch", "node-a") == grpc.StatusCode.PERMISSION_DENIED
    assert call(fe, token, "Watch", "node-b") == grpc.StatusCode.OK


def test_refused_tokens_are_unauthenticated(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    a = pod(api, "backend-a", "node-a")
    wrong = api.tokens.issue(NS, SA, audiences=("https://kubernetes.default.svc",), pod=a)
    expired = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=a, expires_in=-1)
    for token, why in ((None, "send a ServiceAccount token"), ("forged", "invalid bearer"),
                       (wrong, "invalid for the target audiences"), (expired, "expired")):
        code, message = details(fe, token, "Watch")
        assert code == grpc.StatusCode.UNAUTHENTICATED, token
        assert why in message, message


def test_a_token_stops_working_when_its_pod_is_deleted(fe, api: FakeApiserver,  # type: ignore[no-untyped-def]
                                                       clock: Clock) -> None:
    a = pod(api, "backend-a", "node-a")
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=a)
    assert call(fe, token, "Watch") == grpc.StatusCode.OK
    api.delete("Pod", a)
    clock.advance(TTL + 0.1)
    code, message = details(fe, token, "Watch")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "not found" in message


def test_a_replaced_pod_is_caught_by_its_uid(fe, api: FakeApiserver,  # type: ignore[no-untyped-def]
                                             clock: Clock) -> None:
    """Even when the apiserver does not check the binding, the frontend does: a new pod
    with the old one's name (on another node) does not inherit its token."""
    api.tokens.verify_pod_binding = False
    a = pod(api, "backend-a", "node-a")
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=a)
    assert call(fe, token, "Watch") == grpc.StatusCode.OK
    api.delete("Pod", a)
    pod(api, "backend-a", "node-b")
    clock.advance(TTL + 0.1)
    code, message = details(fe, token, "Watch", "node-b")
    assert code == grpc.StatusCode.UNAUTHENTICATED and "another pod has its name" in message


def test_node_name_extra_binds_without_reading_the_pod(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    api.tokens.node_name_extra = True
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "backend-b", "node-b"))
    assert call(fe, token, "GetNodeState", "node-b") == grpc.StatusCode.OK
    assert call(fe, token, "GetNodeState", "node-a") == grpc.StatusCode.PERMISSION_DENIED


def test_cluster_readers_by_group_and_reviews_are_cached(fe, api: FakeApiserver,  # type: ignore[no-untyped-def]
                                                         clock: Clock) -> None:
    token = api.tokens.issue("tools", "inspector", audiences=(AUDIENCE,))
    assert call(fe, token, "ListNodes") == grpc.StatusCode.OK
    reviews = api.tokens.reviews
    for _ in range(5):
        assert call(fe, token, "GetNodeState", "node-b") == grpc.StatusCode.OK
    assert api.tokens.reviews == reviews
    clock.advance(TTL + 0.1)
    assert call(fe, token, "ListNodes") == grpc.StatusCode.OK
    assert api.tokens.reviews == reviews + 1


def test_the_sdk_sends_the_token_file_and_rereads_it(fe, api: FakeApiserver,  # type: ignore[no-untyped-def]
                                                     tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "b-a", "node-a")))
    token = TokenFile(path)
    client = NodeStateClient(fe.opts.listen, "node-a", token=token, max_backoff=0.2)
    client.start()
    try:
        wait_for(client.has_changes, timeout=10)
    finally:
        client.stop()
    rotated = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "b-b", "node-a"))
    path.write_text(rotated + "\n")
    assert token.metadata() == (("authorization", f"Bearer {rotated}"),)


def test_grpcurl_with_and_without_a_token(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from tests.support.grpcurl import GRPCURL
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed")
    token = api.tokens.issue(NS, SA, audiences=(AUDIENCE,), pod=pod(api, "backend-a", "node-a"))
    sock = fe.opts.listen.removeprefix("unix://")

    def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GRPCURL, "-plaintext", "-unix", *args[:-1], sock, args[-1]],
                              capture_output=True, text=True, timeout=20)

    bearer = ("-H", f"authorization: Bearer {token}")
    # Reflection needs an authenticated caller; health (below) does not.
    assert "code = Unauthenticated" in grpcurl("list").stderr
    assert "svcproxy.v1.NodeStateService" in grpcurl(*bearer, "list").stdout
    with grpc.insecure_channel(fe.opts.listen) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                           timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    get = "svcproxy.v1.NodeStateService/GetNodeState"
    assert grpcurl(*bearer, "-d", '{"node_name":"node-a"}', get).returncode == 0
    denied = grpcurl(*bearer, "-d", '{"node_name":"node-b"}', get).stderr
    assert "Code: PermissionDenied" in denied and "only node node-a" in denied


def test_the_backend_cli_sends_its_token_file(fe, api: FakeApiserver, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    def backend(token: str) -> subprocess.Popen[str]:
        path = tmp_path / f"token-{len(token)}-{time.monotonic_ns()}"
        path.write_text(token)
        return subprocess.Popen(
            [sys.executable, "-m", "svcproxy.cli", "backend", "dump", "--api", fe.opts.listen,
             "--node-name", "node-a", "--api-token-file", str(path), "--min-sync-period", "0",
             "--healthz-bind-address", "", "--metrics-bind-address", ""],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    ours = backend(api.tokens.issue(NS, SA, audiences=(AUDIENCE,),
                                    pod=pod(api, "backend-a", "node-a")))
    theirs = backend(api.tokens.issue(NS, SA, audiences=(AUDIENCE,),
                                      pod=pod(api, "backend-b", "node-b")))
    try:
        assert ours.stdout is not None
        state = json.loads(ours.stdout.readline())
        assert state["node"]["name"] == "node-a" and state["services"]
        assert theirs.stderr is not None
        refused = ""
        deadline = time.monotonic() + 30
        while "PERMISSION_DENIED" not in refused and time.monotonic() < deadline:
            line = theirs.stderr.readline()
            if not line:
                break
            refused += line
    finally:
        for proc in (ours, theirs):
            proc.terminate()
        theirs.communicate(timeout=10)
        ours.communicate(timeout=10)
    assert "PERMISSION_DENIED" in refused

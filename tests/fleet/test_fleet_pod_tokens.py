"""Who may wait for the fleet: a pod, by its own audience-bound token reviewed by the
stand-in apiserver through the official client, only for its own addresses; a cluster
reader for anything; the real ``svcproxy wait`` with --api-token-file."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

# Imported here: the official client's models take seconds on a loaded machine, more than
# the frontend's start may (its token reviewer imports them).
import svcproxy.frontend.serving.access.tokenreview  # noqa: F401
from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.fleet_lab import SVCPROXY

AUDIENCE = "svcproxy"
POD_IP, OTHER_IP = "10.244.1.10", "10.244.1.11"


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    server = FakeApiserver(token="frontend-token")
    yield server
    server.close()


@pytest.fixture
def fe(frontend_factory, tmp_path: Path, api: FakeApiserver):  # type: ignore[no-untyped-def]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "frontend-token")
    return frontend_factory(copy_examples(tmp_path), auth=AuthConfig(
        token_audience=AUDIENCE, token_kubeconfig=str(kubeconfig), token_cache_ttl=0.3,
        cluster_readers=frozenset({"system:serviceaccounts:tools"})))


def web_pod(api: FakeApiserver, name: str = "web-1", ip: str = POD_IP) -> dict[str, Any]:
    return api.create("Pod", {"metadata": {"name": name, "namespace": "shop"},
                              "spec": {"nodeName": "node-a"},
                              "status": {"podIP": ip, "podIPs": [{"ip": ip}]}})


def waited(fe, token: str, **asked: str) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(fe.opts.listen) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        try:
            progress = list(stub.WaitFleet(pb.WaitFleetRequest(**asked), timeout=10,
                                           metadata=(("authorization", f"Bearer {token}"),)))
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
    assert progress and progress[-1].done
    return grpc.StatusCode.OK, ""


def test_a_pod_waits_only_for_its_own_addresses(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    token = api.tokens.issue("shop", "web", audiences=(AUDIENCE,), pod=web_pod(api))
    assert waited(fe, token, endpoint_gone=POD_IP) == (grpc.StatusCode.OK, "")
    assert waited(fe, token, endpoint_gone=f"{POD_IP}:8080")[0] == grpc.StatusCode.OK
    assert waited(fe, token, endpoint_ready=POD_IP)[0] == grpc.StatusCode.OK
    code, said = waited(fe, token, endpoint_gone=OTHER_IP)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert f"pod shop/web-1 may wait only for its own addresses ({POD_IP})" in said
    code, said = waited(fe, token, service="shop/web")
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not for a Service" in said


def test_a_token_of_no_pod_and_a_replaced_pod_wait_for_nothing(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    podless = api.tokens.issue("shop", "web", audiences=(AUDIENCE,))
    code, said = waited(fe, podless, endpoint_gone=POD_IP)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "own pod-bound" in said
    old = web_pod(api, "web-2", OTHER_IP)
    token = api.tokens.issue("shop", "web", audiences=(AUDIENCE,), pod=old)
    api.tokens.verify_pod_binding = False  # the apiserver still says yes; the uid says no
    api.delete("Pod", old)
    web_pod(api, "web-2", OTHER_IP)  # another pod, same name, another uid
    code, _ = waited(fe, token, endpoint_gone=OTHER_IP)
    assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def test_a_cluster_reader_waits_for_anything_and_the_cli_sends_its_token(
        fe, api: FakeApiserver, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reader = api.tokens.issue("tools", "ops", audiences=(AUDIENCE,))
    assert waited(fe, reader, endpoint_gone=OTHER_IP)[0] == grpc.StatusCode.OK
    assert waited(fe, reader, service="shop/web")[0] == grpc.StatusCode.OK
    token_file = tmp_path / "token"
    token_file.write_text(api.tokens.issue("shop", "web", audiences=(AUDIENCE,),
                                           pod=web_pod(api)))
    base = [SVCPROXY, "wait", "--api", fe.opts.listen, "--api-token-file", str(token_file),
            "--timeout", "20s"]
    ok = subprocess.run([*base, "--endpoint-gone", POD_IP], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    denied = subprocess.run([*base, "--endpoint-gone", OTHER_IP], capture_output=True,
                            text=True, timeout=60)
    assert denied.returncode == 2 and "PERMISSION_DENIED" in denied.stderr, denied.stderr

"""Who may wait for the fleet: a pod, by its own audience-bound token reviewed by the
stand-in apiserver through the official client, only for its own addresses; a cluster
reader for anything; the real ``svcproxy wait`` with --api-token-file. Only the node
agents' ServiceAccounts (--node-service-accounts) are node identities: a workload's
token is refused Watch, GetNodeState and Report, by raw calls and by the real backend."""

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
from svcproxy.frontend.serving.access.auth import AuthConfig, parse_node_service_accounts
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.fleet_lab import SVCPROXY
from tests.support.paths import REPO
from tests.support.waiting import wait_for

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


def agent_pod(api: FakeApiserver, name: str = "backend-a") -> dict[str, Any]:
    return api.create("Pod", {"metadata": {"name": name, "namespace": "svcproxy"},
                              "spec": {"nodeName": "node-a"},
                              "status": {"podIP": "192.0.2.2", "podIPs": [{"ip": "192.0.2.2"}]}})


Status = tuple[grpc.StatusCode, str]


def node_calls(target: str, token: str, node: str = "node-a") -> dict[str, Status]:
    """Watch, GetNodeState and Report for ``node`` with ``token``: each one's status."""
    bearer = (("authorization", f"Bearer {token}"),)
    got: dict[str, Status] = {}
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        calls = {
            "Watch": lambda: next(stub.Watch(pb.WatchRequest(node_name=node), timeout=10,
                                             metadata=bearer)),
            "GetNodeState": lambda: stub.GetNodeState(
                pb.GetNodeStateRequest(node_name=node), timeout=10, metadata=bearer),
            "Report": lambda: stub.Report(pb.NodeReport(node_name=node, backend="x"),
                                          timeout=10, metadata=bearer),
        }
        for method, call in calls.items():
            try:
                call()
                got[method] = (grpc.StatusCode.OK, "")
            except grpc.RpcError as err:
                got[method] = (err.code(), err.details() or "")
    return got


def test_a_workload_pods_token_is_no_node_identity(fe, api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    workload = api.tokens.issue("shop", "web", audiences=(AUDIENCE,), pod=web_pod(api))
    for method, (code, said) in node_calls(fe.opts.listen, workload).items():
        assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code, said)
        assert "pod shop/web-1" in said and "--node-service-accounts" in said, said
        assert "may only WaitFleet for its own pod's addresses" in said
    assert waited(fe, workload, endpoint_gone=POD_IP) == (grpc.StatusCode.OK, "")
    # The agents' ServiceAccount (deploy/'s) on the same node is that node.
    agent = api.tokens.issue("svcproxy", "svcproxy-backend", audiences=(AUDIENCE,),
                             pod=agent_pod(api))
    assert {m: c for m, (c, _) in node_calls(fe.opts.listen, agent).items()} == {
        "Watch": grpc.StatusCode.OK, "GetNodeState": grpc.StatusCode.OK,
        "Report": grpc.StatusCode.OK}
    assert node_calls(fe.opts.listen, agent, "node-b")["Report"][0] == \
        grpc.StatusCode.PERMISSION_DENIED


def test_a_real_backend_with_a_workload_token_is_refused(fe, api: FakeApiserver,
                                                         tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    token_file = tmp_path / "workload-token"
    token_file.write_text(api.tokens.issue("shop", "web", audiences=(AUDIENCE,),
                                           pod=web_pod(api)))
    log = tmp_path / "backend.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [SVCPROXY, "backend", "dump", "--api", fe.opts.listen, "--node-name", "node-a",
             "--api-token-file", str(token_file), "--min-sync-period", "0",
             "--healthz-bind-address", "", "--metrics-bind-address", ""],
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: "PERMISSION_DENIED" in log.read_text(errors="replace"), timeout=60)
        assert "--node-service-accounts" in log.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(20)
    assert fleet_nodes(fe, api) == {}, "nothing of node-a was served or reported"


def fleet_nodes(fe, api: FakeApiserver) -> dict[str, pb.FleetNode]:  # type: ignore[no-untyped-def]
    """The fleet as a cluster reader reads it."""
    reader = api.tokens.issue("tools", "ops", audiences=(AUDIENCE,))
    with grpc.insecure_channel(fe.opts.listen) as channel:
        answer = pb_grpc.NodeStateServiceStub(channel).GetFleet(
            pb.GetFleetRequest(), timeout=10,
            metadata=(("authorization", f"Bearer {reader}"),))
    return {n.node_name: n for n in answer.nodes}


def test_node_service_accounts_names_the_agents(frontend_factory, tmp_path: Path,
                                                api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "frontend-token")
    fe = frontend_factory(copy_examples(tmp_path), auth=AuthConfig(
        token_audience=AUDIENCE, token_kubeconfig=str(kubeconfig), token_cache_ttl=0.3,
        node_service_accounts=parse_node_service_accounts("shop:web")))
    web = api.tokens.issue("shop", "web", audiences=(AUDIENCE,), pod=web_pod(api))
    assert {c for c, _ in node_calls(fe.opts.listen, web).values()} == {grpc.StatusCode.OK}
    agent = api.tokens.issue("svcproxy", "svcproxy-backend", audiences=(AUDIENCE,),
                             pod=agent_pod(api))
    assert node_calls(fe.opts.listen, agent)["Watch"][0] == grpc.StatusCode.PERMISSION_DENIED



def test_the_default_node_service_accounts_are_those_deploy_runs_agents_as() -> None:
    import yaml

    from svcproxy.cli import _frontend_auth, build_parser

    accounts = set()
    for path in sorted((REPO / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "DaemonSet":
                spec = doc["spec"]["template"]["spec"]
                accounts.add(f"system:serviceaccount:{doc['metadata']['namespace']}:"
                             f"{spec['serviceAccountName']}")
    assert len(accounts) == 2  # svcproxy's DaemonSets' and kubeadm's kube-proxy's
    flags = ["frontend", "--manifests", "m", "--token-audience", AUDIENCE]
    assert _frontend_auth(build_parser().parse_args(flags), None).node_service_accounts == \
        accounts == AuthConfig().node_service_accounts
    none = _frontend_auth(build_parser().parse_args([*flags, "--node-service-accounts="]),
                          None)
    assert none.node_service_accounts == frozenset()
    for bad in ("svcproxy", "svcproxy:", ":backend", "Svcproxy:backend", "a:b:c",
                "system:serviceaccount:svcproxy:svcproxy-backend"):
        with pytest.raises(SystemExit, match="is not NAMESPACE:NAME"):
            _frontend_auth(build_parser().parse_args([*flags, "--node-service-accounts",
                                                      bad]), None)


def test_the_same_rules_through_stream_workers(frontend_factory, tmp_path: Path,
                                               api: FakeApiserver) -> None:  # type: ignore[no-untyped-def]
    from tests.frontend.serving.test_stream_workers import own_connection, serving_pids

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "frontend-token")
    fe = frontend_factory(copy_examples(tmp_path), listen="127.0.0.1:0", stream_workers=2,
                          auth=AuthConfig(token_audience=AUDIENCE,
                                          token_kubeconfig=str(kubeconfig)))
    workers = fe.frontend.workers
    # The worker process starts (and imports the official client) under load: a minute.
    wait_for(lambda: len(workers.pids) == 1 and workers.pids[0] is not None, timeout=60)
    bearer = (("authorization", "Bearer " + api.tokens.issue(
        "shop", "web", audiences=(AUDIENCE,), pod=web_pod(api))),)
    target = f"127.0.0.1:{fe.frontend.port}"
    channels: list[grpc.Channel] = []
    try:
        # Connections until the worker holds one (the kernel spreads them; at most 40).
        while len(channels) < 40 and not (channels and set(workers.pids) & serving_pids(
                fe.frontend.port)):
            channels.append(own_connection(target))
            grpc.channel_ready_future(channels[-1]).result(timeout=60)
        assert set(workers.pids) & serving_pids(fe.frontend.port), "no connection on the worker"
        for channel in channels:
            stub = pb_grpc.NodeStateServiceStub(channel)
            own = list(stub.WaitFleet(pb.WaitFleetRequest(endpoint_gone=POD_IP), timeout=60,
                                      metadata=bearer))
            assert own[-1].done
            with pytest.raises(grpc.RpcError) as other:
                list(stub.WaitFleet(pb.WaitFleetRequest(endpoint_gone=OTHER_IP), timeout=30,
                                    metadata=bearer))
            assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as watch:
                next(stub.Watch(pb.WatchRequest(node_name="node-a"), timeout=30,
                                metadata=bearer))
            assert watch.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        for channel in channels:
            channel.close()

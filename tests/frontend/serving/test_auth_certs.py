"""Mutual TLS identities against the real server: who may call what, with the exact status.

Certificates are made here with ``cryptography``: the frontend's CA, a rogue CA, node
certificates as kubelet's are named, a non-node identity and a cluster reader. Every
call of the API is made by each, through the Python client and through grpcurl.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from svcproxy.frontend.serving.access import auth_metrics
from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.frontend.serving.server import TLSFiles
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.credentials import ClientTLS
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples
from tests.support.grpcurl import GRPCURL
from tests.support.pki import CA, Issued
from tests.support.waiting import wait_for

OK = grpc.StatusCode.OK
DENIED = grpc.StatusCode.PERMISSION_DENIED
REFUSED = grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails: no call is made
CALLS = ("Watch node-a", "Watch node-b", "GetNodeState node-a", "GetNodeState node-b",
         "ListNodes", "WatchCluster", "Health", "Reflection")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued | Path]:
    d = tmp_path_factory.mktemp("pki")
    ca, rogue = CA(d, "ca"), CA(d, "rogue")
    return {
        "ca": ca.file,
        "server": ca.issue("server", "svcproxy-frontend", server=True),
        "node-a": ca.issue("node-a", "system:node:node-a", ("system:nodes",)),
        "rogue": rogue.issue("rogue", "system:node:node-a", ("system:nodes",)),
        "attacker": ca.issue("attacker", "attacker", ("developers",)),
        "not-in-group": ca.issue("not-in-group", "system:node:node-b"),
        "reader": ca.issue("reader", "tools", ("svcproxy:cluster-readers",)),
    }


@pytest.fixture
def fe(frontend_factory, tmp_path: Path, pki):  # type: ignore[no-untyped-def]
    server = pki["server"]
    return frontend_factory(
        copy_examples(tmp_path), listen="localhost:0",
        tls=TLSFiles(server.cert, server.key, pki["ca"]),
        auth=AuthConfig(client_certs=True,
                        cluster_readers=frozenset({"svcproxy:cluster-readers"})))


def code_of(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    try:
        call()
        return OK
    except grpc.RpcError as err:
        return err.code()


def every_call(target: str, creds: grpc.ChannelCredentials) -> dict[str, grpc.StatusCode]:
    """The status of each call of the API made with ``creds``."""
    with grpc.secure_channel(target, creds) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        calls = {
            "Watch node-a": lambda: next(stub.Watch(pb.WatchRequest(node_name="node-a"),
                                                    timeout=5)),
            "Watch node-b": lambda: next(stub.Watch(pb.WatchRequest(node_name="node-b"),
                                                    timeout=5)),
            "GetNodeState node-a": lambda: stub.GetNodeState(
                pb.GetNodeStateRequest(node_name="node-a"), timeout=5),
            "GetNodeState node-b": lambda: stub.GetNodeState(
                pb.GetNodeStateRequest(node_name="node-b"), timeout=5),
            "ListNodes": lambda: stub.ListNodes(pb.ListNodesRequest(), timeout=5),
            "WatchCluster": lambda: next(stub.WatchCluster(pb.ClusterWatchRequest(),
                                                           timeout=5)),
            "Health": lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5),
            "Reflection": lambda: next(reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)),
        }
        return {name: code_of(call) for name, call in calls.items()}


def client_creds(pki, who: str | None) -> grpc.ChannelCredentials:  # type: ignore[no-untyped-def]
    ca = pki["ca"].read_bytes()
    if who is None:
        return grpc.ssl_channel_credentials(ca)
    key, cert = pki[who].pem()
    return grpc.ssl_channel_credentials(ca, key, cert)


EXPECTED = {
    None: dict.fromkeys(CALLS, REFUSED),
    "rogue": dict.fromkeys(CALLS, REFUSED),
    "node-a": {**dict.fromkeys(CALLS, DENIED), "Watch node-a": OK,
               "GetNodeState node-a": OK, "Health": OK, "Reflection": OK},
    "attacker": {**dict.fromkeys(CALLS, DENIED), "Health": OK, "Reflection": OK},
    "not-in-group": {**dict.fromkeys(CALLS, DENIED), "Health": OK, "Reflection": OK},
    "reader": dict.fromkeys(CALLS, OK),
}


@pytest.mark.parametrize("who", list(EXPECTED))
def test_each_identity_gets_exactly_its_calls(fe, pki, who: str | None) -> None:  # type: ignore[no-untyped-def]
    got = every_call(f"localhost:{fe.frontend.port}", client_creds(pki, who))
    assert got == EXPECTED[who]


def test_a_refusal_names_the_identity_and_what_it_may_read(fe, pki) -> None:  # type: ignore[no-untyped-def]
    before = auth_metrics.REFUSALS.labels("PERMISSION_DENIED", "GetNodeState")._value.get()
    with grpc.secure_channel(f"localhost:{fe.frontend.port}",
                             client_creds(pki, "node-a")) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetNodeState(pb.GetNodeStateRequest(node_name="node-b"), timeout=5)
    assert err.value.code() == DENIED
    assert "node node-a 'system:node:node-a'" in err.value.details()
    assert "may read only node node-a's state" in err.value.details()
    after = auth_metrics.REFUSALS.labels("PERMISSION_DENIED", "GetNodeState")._value.get()
    assert after == before + 1


def test_the_sdk_says_why_it_is_refused_and_keeps_retrying(  # type: ignore[no-untyped-def]
        fe, pki, caplog: pytest.LogCaptureFixture) -> None:
    """A backend given another node's name (or a certificate of the wrong node) logs the
    frontend's message - who it is and what it may read - with what to do, and retries:
    the operator can fix the credentials or the authorization without a restart."""
    node_a = pki["node-a"]
    client = NodeStateClient(f"localhost:{fe.frontend.port}", "node-b", max_backoff=0.2,
                             credentials=ClientTLS(pki["ca"], node_a.cert, node_a.key))
    with caplog.at_level(logging.WARNING, "svcproxy.sdk.client"):
        client.start()
        try:
            wait_for(lambda: len(refusals(caplog)) >= 2, timeout=30)
            assert not client.stopped and client.error is None and not client.has_changes()
        finally:
            client.stop()
    said = refusals(caplog)[0]
    assert "PERMISSION_DENIED" in said
    assert "node node-a 'system:node:node-a'" in said
    assert "may read only node node-a's state" in said
    assert "give it the credentials" in said and "retrying" in said


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "watch of node-b" in r.getMessage() and "refused this caller" in r.getMessage()]


def grpcurl(fe, pki, who: str | None, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    flags = ["-cacert", str(pki["ca"])]
    if who is not None:
        flags += ["-cert", str(pki[who].cert), "-key", str(pki[who].key)]
    return subprocess.run([GRPCURL, *flags, "-max-time", "3", *args[:-1],
                           f"localhost:{fe.frontend.port}", args[-1]],
                          capture_output=True, text=True, timeout=20)


GRPCURL_CALLS = {
    "GetNodeState node-a": ("-d", '{"node_name":"node-a"}',
                            "svcproxy.v1.NodeStateService/GetNodeState"),
    "GetNodeState node-b": ("-d", '{"node_name":"node-b"}',
                            "svcproxy.v1.NodeStateService/GetNodeState"),
    "ListNodes": ("svcproxy.v1.NodeStateService/ListNodes",),
    "Health": ("grpc.health.v1.Health/Check",),
    "Reflection": ("list",),
}


@pytest.mark.parametrize("who", ["node-a", "attacker", "reader", "rogue", None])
def test_grpcurl_gets_the_same_answers(fe, pki, who: str | None) -> None:  # type: ignore[no-untyped-def]
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed")
    refused = EXPECTED[who]["Health"] == REFUSED
    for call, args in GRPCURL_CALLS.items():
        if refused and call != "Health":
            continue  # each refused handshake costs grpcurl its whole -max-time
        out = grpcurl(fe, pki, who, *args)
        expected = EXPECTED[who][call]
        if expected == OK:
            assert out.returncode == 0, (call, out.stderr)
        elif expected == DENIED:
            assert "Code: PermissionDenied" in out.stderr, (call, out.stderr)
        else:
            assert out.returncode != 0 and "Code:" not in out.stderr, (call, out.stderr)
    if who == "node-a":
        state = json.loads(grpcurl(fe, pki, who, *GRPCURL_CALLS["GetNodeState node-a"]).stdout)
        assert state["node"]["name"] == "node-a"


def test_stream_workers_enforce_the_same_rules(frontend_factory, tmp_path: Path, pki,  # type: ignore[no-untyped-def]
                                               capfd: pytest.CaptureFixture[str]) -> None:
    from tests.support.waiting import wait_for

    server = pki["server"]
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0", stream_workers=2,
                          tls=TLSFiles(server.cert, server.key, pki["ca"]),
                          auth=AuthConfig(client_certs=True))
    wait_for(lambda: len(fe.frontend.workers.pids) == 1, timeout=20)
    counter = auth_metrics.REFUSALS.labels("PERMISSION_DENIED", "GetNodeState")
    before = counter._value.get()
    connections = 12
    for _ in range(connections):  # the kernel spreads connections over both processes
        with grpc.secure_channel(f"localhost:{fe.frontend.port}", client_creds(pki, "node-a"),
                                 options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = pb_grpc.NodeStateServiceStub(channel)
            assert code_of(lambda: stub.GetNodeState(  # noqa: B023
                pb.GetNodeStateRequest(node_name="node-b"), timeout=5)) == DENIED
            assert code_of(lambda: next(stub.Watch(  # noqa: B023
                pb.WatchRequest(node_name="node-a"), timeout=5))) == OK
            status = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
    # The worker refused some of them itself, and shipped its count here.
    wait_for(lambda: counter._value.get() == before + connections, timeout=10)
    assert "[worker 1]: refused GetNodeState" in capfd.readouterr().err


def test_svcproxy_certs_makes_a_working_pki(frontend_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from svcproxy.cli import main

    d = tmp_path / "pki"
    assert main(["certs", str(d), "--node", "node-a", "--identity", "tools"]) == 0
    assert not (d / "ca.key").exists() and (d / "node-a.key").stat().st_mode & 0o077 == 0
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(d / "frontend.crt", d / "frontend.key", d / "ca.crt"),
                          auth=AuthConfig(client_certs=True, cluster_readers=frozenset({"tools"})))
    ca = (d / "ca.crt").read_bytes()

    def creds(who: str) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(ca, (d / f"{who}.key").read_bytes(),
                                            (d / f"{who}.crt").read_bytes())

    node = every_call(f"localhost:{fe.frontend.port}", creds("node-a"))
    assert node == EXPECTED["node-a"]
    assert every_call(f"localhost:{fe.frontend.port}", creds("tools")) == EXPECTED["reader"]

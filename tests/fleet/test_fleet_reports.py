"""Nodes report what they applied: the real frontend, real node agents in processes of
their own (``svcproxy backend dump``, a backend refusing a Service through the agent's
``run_agent``), GetFleet over real gRPC; authorization with real node certificates;
hostile reports refused alone."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import grpc
import pytest

from svcproxy.frontend.fleet import metrics as fleet_metrics
from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.frontend.serving.server import TLSFiles
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples, web_slice
from tests.support.fleet_lab import agents, fleet, nodes, wait_state
from tests.support.fleet_refusing_backend import REASON
from tests.support.pki import CA
from tests.support.waiting import wait_for

THREE = ("node-a", "node-b", "node-c")


def served_now(fe, node: str) -> int:  # type: ignore[no-untyped-def]
    return int(fe._loop.run(lambda: fe.engine.changelog.view(node).revision, 10))


def test_three_nodes_report_what_they_applied(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    with agents(api, tmp_path) as started:
        for node in THREE:
            started.start(node)
        for node in THREE:
            wait_state(api, node, pb.NODE_APPLIED)
        fe.submit([Upsert("EndpointSlice", web_slice(3))])
        for node in THREE:
            target = served_now(fe, node)
            got = wait_state(api, node, pb.NODE_APPLIED, applied_revision=target)
            assert got.served_revision == target and got.connected
            assert got.applied_digest == got.served_digest
            assert got.backend == "dump" and got.backend_version
            assert got.lag_revisions == 0 and not got.refused
        answer = fleet(api)
        assert answer.nodes_by_state["NODE_APPLIED"] == 3
        assert [n.node_name for n in answer.nodes] == list(THREE)


def web_progress(api: str) -> set[tuple[str, int, int]]:
    """Service web's http port and its endpoint 10.244.0.3: (name, nodes, applied)."""
    progress = fleet(api, pb.GetFleetRequest(namespace="shop", service="web")).services
    http = next(p for p in progress if p.service.port_name == "http")
    return {("http", http.nodes, http.applied_nodes)} | {
        (e.ip, e.nodes, e.applied_nodes) for e in http.endpoints if e.ip == "10.244.0.3"}


def cluster_latency() -> tuple[float, float]:
    """(count, sum) of svcproxy_frontend_cluster_programming_latency_seconds."""
    samples = {s.name: s.value for s in fleet_metrics.CLUSTER_LATENCY.collect()[0].samples}
    return (samples["svcproxy_frontend_cluster_programming_latency_seconds_count"],
            samples["svcproxy_frontend_cluster_programming_latency_seconds_sum"])


def test_a_stopped_backend_lags_and_recovers_and_one_that_does_not_report_is_unknown(
        frontend_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="svcproxy.frontend.fleet.service")
    fe = frontend_factory(copy_examples(tmp_path), lag_warning=0.5)
    api = fe.opts.listen
    silent = NodeStateClient(api, "node-c")  # an SDK client that never reports
    silent.start()
    try:
        with agents(api, tmp_path) as started:
            started.start("node-a")
            started.start("node-b")
            wait_state(api, "node-a", pb.NODE_APPLIED)
            wait_state(api, "node-b", pb.NODE_APPLIED)
            wait_state(api, "node-c", pb.NODE_UNKNOWN, connected=True)
            started.pause("node-b")
            count, total = cluster_latency()
            fe.submit([Upsert("EndpointSlice", web_slice(3))])
            lagging = wait_state(api, "node-b", pb.NODE_LAGGING)
            assert lagging.lag_revisions >= 1 and lagging.lag_seconds > 0.5
            assert lagging.applied_revision < lagging.served_revision
            assert fleet_metrics.LAGGING._value.get() == 1
            wait_state(api, "node-a", pb.NODE_APPLIED, applied_revision=served_now(fe, "node-a"))
            # Applied on node-a, not yet everywhere: the cluster's latency is not known yet.
            assert cluster_latency() == (count, total)
            assert web_progress(api) == {("http", 2, 1), ("10.244.0.3", 2, 1)}
            now = nodes(api)
            assert now["node-a"].state == pb.NODE_APPLIED
            # As long unapplied as node-b, and never failed: it does not report.
            assert now["node-c"].state == pb.NODE_UNKNOWN
            assert any("node node-b is lagging" in r.getMessage() for r in caplog.records)
            started.resume("node-b")
            wait_state(api, "node-b", pb.NODE_APPLIED,
                       applied_revision=served_now(fe, "node-b"))
            assert any("node node-b recovered" in r.getMessage() for r in caplog.records)
            wait_for(lambda: fleet_metrics.LAGGING._value.get() == 0)
            # Once node-b applied it: one observation, at least node-b's stop long.
            after_count, after_total = cluster_latency()
            assert after_count == count + 1 and after_total - total > 0.5
            assert web_progress(api) == {("http", 2, 2), ("10.244.0.3", 2, 2)}
    finally:
        silent.stop()


def test_a_refused_service_port_is_shown(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    with agents(api, tmp_path) as started:
        started.start("node-a", (sys.executable, "-m", "tests.support.fleet_refusing_backend",
                                 "web"))
        got = wait_state(api, "node-a", pb.NODE_APPLIED, refused_count=2)
        # Asked while node-a is connected: a node that left is counted nowhere.
        progress = fleet(api, pb.GetFleetRequest(namespace="shop", service="web")).services
    assert {(r.service.name, r.service.port_name) for r in got.refused} == {
        ("web", "http"), ("web", "metrics")}
    assert {r.reason for r in got.refused} == {REASON}
    assert got.backend == "refusing"
    assert [(p.service.port_name, p.nodes, p.applied_nodes, p.refused_nodes)
            for p in progress] == [("http", 1, 1, 1), ("metrics", 1, 1, 1)]
    held = {(e.ip, e.nodes, e.applied_nodes) for e in progress[0].endpoints}
    assert {"10.244.1.10", "10.244.2.10"} <= {ip for ip, _, _ in held}
    assert {(nodes, applied) for _, nodes, applied in held} == {(1, 1)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d, "ca")
    return {"ca": ca.file, "server": ca.issue("server", "svcproxy-frontend", server=True),
            "node-a": ca.issue("node-a", "system:node:node-a", ("system:nodes",)),
            "reader": ca.issue("reader", "tools", ("svcproxy:cluster-readers",))}


def creds(pki, who: str) -> grpc.ChannelCredentials:  # type: ignore[no-untyped-def]
    key, cert = pki[who].pem()
    return grpc.ssl_channel_credentials(pki["ca"].read_bytes(), key, cert)


def report_code(target: str, credentials: grpc.ChannelCredentials | None,
                report: pb.NodeReport) -> tuple[grpc.StatusCode, str]:
    channel = (grpc.secure_channel(target, credentials) if credentials
               else grpc.insecure_channel(target))
    with channel:
        try:
            pb_grpc.NodeStateServiceStub(channel).Report(report, timeout=10)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_node_certificate_reports_only_for_its_own_node(frontend_factory, tmp_path,
                                                          pki) -> None:  # type: ignore[no-untyped-def]
    server = pki["server"]
    fe = frontend_factory(copy_examples(tmp_path), listen="localhost:0",
                          tls=TLSFiles(server.cert, server.key, pki["ca"]),
                          auth=AuthConfig(client_certs=True, cluster_readers=frozenset(
                              {"svcproxy:cluster-readers"})))
    target = f"localhost:{fe.frontend.port}"
    node_a = creds(pki, "node-a")
    assert report_code(target, node_a, pb.NodeReport(node_name="node-a", backend="x")) == (
        grpc.StatusCode.OK, "")
    code, said = report_code(target, node_a, pb.NodeReport(node_name="node-b", backend="x"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "report only for it" in said and "node-b" in said
    with pytest.raises(grpc.RpcError) as err:
        fleet(target, credentials=node_a)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    seen = {n.node_name: n for n in fleet(target, credentials=creds(pki, "reader")).nodes}
    assert list(seen) == ["node-a"] and seen["node-a"].backend == "x"


def test_hostile_reports_are_refused_alone(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    epoch, revision = fe.frontend.guard.epoch, fe.engine.changelog.revision
    good = pb.NodeReport(node_name="node-a", revision=revision, epoch=epoch, backend="good",
                         details={"kept": "yes"})
    assert report_code(api, None, good)[0] == grpc.StatusCode.OK
    key = pb.ServicePortKey(namespace="shop", name="web", protocol=pb.TCP)
    many = pb.NodeReport(node_name="node-a", refused_count=65, refused=[
        pb.RefusedServicePort(service=key, reason="x")] * 65)
    long_reason = pb.NodeReport(node_name="node-a", refused_count=1, refused=[
        pb.RefusedServicePort(service=key, reason="x" * 513)])
    hostile = {
        "refused": (many, grpc.StatusCode.INVALID_ARGUMENT, "more than 64"),
        "reason": (long_reason, grpc.StatusCode.INVALID_ARGUMENT, "longer than 512"),
        "details": (pb.NodeReport(node_name="node-a", details={str(i): "" for i in range(17)}),
                    grpc.StatusCode.INVALID_ARGUMENT, "more than 16"),
        "ahead": (pb.NodeReport(node_name="node-a", revision=revision + 10**9, epoch=epoch),
                  grpc.StatusCode.INVALID_ARGUMENT, "ahead of this frontend"),
        "epoch": (pb.NodeReport(node_name="node-a", revision=revision, epoch="another"),
                  grpc.StatusCode.FAILED_PRECONDITION, "epoch 'another'"),
        "name": (pb.NodeReport(node_name="Not_A_Node"), grpc.StatusCode.INVALID_ARGUMENT,
                 "not a Kubernetes node name"),
        "huge": (pb.NodeReport(node_name="node-a", details={"k": "v" * (80 << 10)}),
                 grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
    }
    for what, (report, code, said) in hostile.items():
        got, details = report_code(api, None, report)
        assert got == code and said in details, (what, got, details)
    # A flood from one node is cut at its rate; another node's report still goes through.
    codes = [report_code(api, None, good)[0] for _ in range(30)]
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    other = pb.NodeReport(node_name="node-b", revision=revision, epoch=epoch, backend="b")
    assert report_code(api, None, other)[0] == grpc.StatusCode.OK
    seen = nodes(api)
    assert seen["node-a"].backend == "good" and dict(seen["node-a"].details) == {"kept": "yes"}
    assert seen["node-b"].backend == "b"


def test_a_node_reporting_another_digest_disagrees_until_it_agrees(
        frontend_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="svcproxy.frontend.fleet.service")
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    client = NodeStateClient(api, "node-c")  # watches; its reports are made by hand
    client.start()
    try:
        served = wait_state(api, "node-c", pb.NODE_UNKNOWN, connected=True)
        epoch = fe.frontend.guard.epoch
        wrong = pb.NodeReport(node_name="node-c", revision=served.served_revision,
                              epoch=epoch, digest=served.served_digest ^ 1, backend="x")
        assert report_code(api, None, wrong)[0] == grpc.StatusCode.OK
        got = wait_state(api, "node-c", pb.NODE_DISAGREEING)
        assert got.applied_digest != got.served_digest
        assert any("node node-c is disagreeing" in r.getMessage() for r in caplog.records)
        right = pb.NodeReport(node_name="node-c", revision=served.served_revision,
                              epoch=epoch, digest=served.served_digest, backend="x")
        assert report_code(api, None, right)[0] == grpc.StatusCode.OK
        wait_state(api, "node-c", pb.NODE_APPLIED)
        assert any("node node-c recovered" in r.getMessage() for r in caplog.records)
    finally:
        client.stop()


def test_get_fleet_pages_and_filters(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    names = [f"node-{i}" for i in range(5)]
    for name in names:
        assert report_code(api, None, pb.NodeReport(node_name=name))[0] == grpc.StatusCode.OK
    seen, token = [], ""
    while True:
        page = fleet(api, pb.GetFleetRequest(page_size=2, page_token=token))
        assert len(page.nodes) <= 2 and page.nodes_by_state["NODE_DISCONNECTED"] == 5
        seen += [n.node_name for n in page.nodes]
        token = page.next_page_token
        if not token:
            break
    assert seen == names
    assert [n.node_name for n in fleet(api, pb.GetFleetRequest(node_name="node-3")).nodes] == [
        "node-3"]
    only = fleet(api, pb.GetFleetRequest(states=[pb.NODE_APPLIED])).nodes
    assert not only
    for bad in (pb.GetFleetRequest(page_size=-1), pb.GetFleetRequest(node_name="Bad_Name"),
                pb.GetFleetRequest(service="Web"), pb.GetFleetRequest(namespace="shop")):
        with pytest.raises(grpc.RpcError) as err:
            fleet(api, bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

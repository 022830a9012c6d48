"""WatchFleet and WaitFleet with --stream-workers: whichever process takes the client's
connection serves them (the main process runs them, a worker writes them), a refusal
comes back with its status, and a client that leaves ends its stream in the main
process too."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk import run
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.serving.test_stream_workers import own_connection, serving_pids
from tests.support.examples import copy_examples, web_slice
from tests.support.fleet_lab import wait_state
from tests.support.frontend import RunningFrontend
from tests.support.waiting import wait_for

CONNECTIONS = 16
GONE = "10.244.1.10"  # an endpoint of web that web_slice(2) no longer has


class Quiet(Backend):
    name = "quiet"

    def sync(self, state: NodeState, changes: Changes) -> None:
        pass


@pytest.fixture
def frontend(frontend_factory, tmp_path: Path) -> RunningFrontend:  # type: ignore[no-untyped-def]
    fe = frontend_factory(copy_examples(tmp_path), listen="127.0.0.1:0", stream_workers=2)
    workers = fe.frontend.workers
    assert workers is not None
    wait_for(lambda: len(workers.pids) == 1 and workers.pids[0] is not None, timeout=30)
    return fe


@pytest.fixture
def node_a(frontend: RunningFrontend) -> Iterator[str]:
    """node-a watching and reporting (the SDK's smallest loop); the API's address."""
    api = f"127.0.0.1:{frontend.frontend.port}"
    stop = threading.Event()
    thread = threading.Thread(target=run.run, args=(Quiet(), NodeStateClient(api, "node-a"),
                                                   stop), kwargs={"report_min_interval": 0.05})
    thread.start()
    try:
        wait_state(api, "node-a", pb.NODE_APPLIED)
        yield api
    finally:
        stop.set()
        thread.join(20)


def subscribers(frontend: RunningFrontend) -> int:
    """Fleet streams the main process runs now."""
    fleet = frontend.frontend.fleet
    return int(frontend._loop.run(lambda: len(fleet._subscribers), 10))


def test_every_process_serves_watch_fleet_and_wait_fleet(frontend: RunningFrontend,
                                                         node_a: str) -> None:
    workers = frontend.frontend.workers
    assert workers is not None
    channels = [own_connection(node_a) for _ in range(CONNECTIONS)]
    try:
        stubs = [pb_grpc.NodeStateServiceStub(ch) for ch in channels]
        watches = [s.WatchFleet(pb.WatchFleetRequest(node_name="node-a"), timeout=60)
                   for s in stubs]
        waits = [s.WaitFleet(pb.WaitFleetRequest(endpoint_gone=GONE), timeout=60)
                 for s in stubs]
        firsts = [next(w) for w in watches]
        assert all(f.full and [n.node_name for n in f.nodes] == ["node-a"] for f in firsts)
        behind = [next(w) for w in waits]
        assert all(not p.done and list(p.nodes_behind) == ["node-a"] for p in behind)
        assert set(workers.pids) & serving_pids(frontend.frontend.port), \
            "no connection on the worker"
        before = firsts[0].nodes[0].applied_revision
        frontend.submit([Upsert("EndpointSlice", web_slice(2))])
        for wait in waits:  # done once node-a applied the removal, on every connection
            assert list(wait)[-1].done
        for watch in watches:  # and each stream saw node-a apply it
            for update in watch:
                if update.nodes and update.nodes[0].applied_revision > before:
                    break
            watch.cancel()
        wait_for(lambda: subscribers(frontend) == 0, timeout=20)
    finally:
        for ch in channels:
            ch.close()


def test_a_refusal_and_a_client_leaving_through_a_worker(frontend: RunningFrontend,
                                                         node_a: str) -> None:
    channels = [own_connection(node_a) for _ in range(CONNECTIONS)]
    try:
        for ch in channels:
            stub = pb_grpc.NodeStateServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.WaitFleet(pb.WaitFleetRequest(endpoint_gone=GONE, service="shop/web"),
                                    timeout=30))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "set exactly one of" in (err.value.details() or "")
        waits = [pb_grpc.NodeStateServiceStub(ch).WaitFleet(
            pb.WaitFleetRequest(endpoint_gone=GONE), timeout=60) for ch in channels]
        assert all(not next(w).done for w in waits)
        wait_for(lambda: subscribers(frontend) == CONNECTIONS, timeout=20)
        for wait in waits:
            wait.cancel()
        wait_for(lambda: subscribers(frontend) == 0, timeout=20)
    finally:
        for ch in channels:
            ch.close()

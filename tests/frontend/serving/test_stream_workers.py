"""--stream-workers: several processes serve the API's port and every client gets the
same stream, whichever process took its connection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from svcproxy.frontend.serving.workers import StreamWorkers
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import WEB, copy_examples, read_batch, web_slice
from tests.support.frontend import RunningFrontend
from tests.support.waiting import wait_for

CONNECTIONS = 24


def own_connection(target: str) -> grpc.Channel:
    """A channel with a TCP connection of its own (gRPC shares them otherwise)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def serving_pids(port: int) -> set[int]:
    """The processes holding accepted connections on ``port``."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return {int(part.split("pid=")[1].split(",")[0]) for part in out.split()
            if "pid=" in part}


def endpoints_of_web(events: list[pb.WatchEvent]) -> set[str]:
    replaced = [op.replace_service for ev in events for op in ev.ops
                if op.WhichOneof("op") == "replace_service"
                and op.replace_service.service.key.name == "web"
                and op.replace_service.service.key.port_name == "http"]
    return {e.ip for e in replaced[-1].endpoints}


@pytest.fixture
def frontend(tmp_path: Path) -> Iterator[RunningFrontend]:
    from svcproxy.frontend.main import FrontendOptions

    fe = RunningFrontend(FrontendOptions(manifests=copy_examples(tmp_path),
                                         listen="127.0.0.1:0", metrics_bind_address="",
                                         stream_workers=2)).start()
    try:
        yield fe
    finally:
        fe.stop()


def started_workers(frontend: RunningFrontend) -> StreamWorkers:
    """The frontend's stream workers, once the one worker process is up."""
    workers = frontend.frontend.workers
    assert workers is not None
    wait_for(lambda: len(workers.pids) == 1 and workers.pids[0] is not None, timeout=30)
    return workers


def watch_all(target: str, count: int, since: int = 0
              ) -> tuple[list[grpc.Channel], list[Iterator[pb.WatchEvent]]]:
    channels = [own_connection(target) for _ in range(count)]
    calls = [pb_grpc.NodeStateServiceStub(ch).Watch(
        pb.WatchRequest(node_name="node-a", since_revision=since)) for ch in channels]
    return channels, calls


def close(channels: list[grpc.Channel], calls: list[Iterator[pb.WatchEvent]]) -> None:
    for call in calls:
        call.cancel()  # type: ignore[attr-defined]
    for ch in channels:
        ch.close()


def test_clients_on_every_process_get_the_same_snapshot_and_changes(
        frontend: RunningFrontend) -> None:
    target = f"127.0.0.1:{frontend.frontend.port}"
    workers = started_workers(frontend)
    channels, calls = watch_all(target, CONNECTIONS)
    try:
        snapshots = [read_batch(c) for c in calls]
        pids = serving_pids(frontend.frontend.port)
        assert os.getpid() in pids and set(workers.pids) & pids, (
            f"connections should be spread over the main process and the worker: {pids}")
        assert {s[-1].revision for s in snapshots} == {frontend.engine.changelog.revision}
        assert all(endpoints_of_web(s) == {"10.244.1.10", "10.244.1.11", "10.244.2.10"}
                   for s in snapshots)

        frontend.submit([Upsert("EndpointSlice", web_slice(2))])
        batches = [read_batch(c) for c in calls]
        assert {b[-1].revision for b in batches} == {frontend.engine.changelog.revision}
        assert len({b"".join(ev.SerializeToString() for ev in b) for b in batches}) == 1, (
            "every process must send the very same batch")
        assert not any(ev.reset for b in batches for ev in b)
    finally:
        close(channels, calls)


def lag_count() -> float:
    """Batches sent to clients, as the main process's /metrics counts them."""
    value = REGISTRY.get_sample_value("svcproxy_frontend_client_lag_batches_count")
    return value or 0.0


def test_metrics_count_every_process_clients(frontend: RunningFrontend) -> None:
    target = f"127.0.0.1:{frontend.frontend.port}"
    workers = started_workers(frontend)
    channels, calls = watch_all(target, CONNECTIONS)
    try:
        for c in calls:
            read_batch(c)
        assert set(workers.pids) & serving_pids(frontend.frontend.port), "no client on the worker"
        before = lag_count()
        frontend.submit([Upsert("EndpointSlice", web_slice(2))])
        for c in calls:
            read_batch(c)
        wait_for(lambda: lag_count() == before + CONNECTIONS, timeout=10)
    finally:
        close(channels, calls)


def test_resume_and_unary_calls_on_any_process(frontend: RunningFrontend) -> None:
    target = f"127.0.0.1:{frontend.frontend.port}"
    started_workers(frontend)
    first = own_connection(target)
    call = pb_grpc.NodeStateServiceStub(first).Watch(pb.WatchRequest(node_name="node-a"))
    rev = read_batch(call)[-1].revision
    call.cancel()
    first.close()
    frontend.submit([Upsert("EndpointSlice", web_slice(4))])

    channels, calls = watch_all(target, CONNECTIONS, since=rev)
    try:
        missed = [read_batch(c) for c in calls]
        assert not any(ev.reset for b in missed for ev in b), "resuming must not reset"
        assert all(b[-1].revision == frontend.engine.changelog.revision for b in missed)
        kinds = {op.WhichOneof("op") for b in missed for ev in b for op in ev.ops}
        assert kinds <= {"set_service", "set_endpoint", "delete_endpoint"}
    finally:
        close(channels, calls)

    states = []
    for _ in range(CONNECTIONS):
        with own_connection(target) as ch:
            states.append(pb_grpc.NodeStateServiceStub(ch).GetNodeState(
                pb.GetNodeStateRequest(node_name="node-a"), timeout=10))
    assert len({s.SerializeToString() for s in states}) == 1
    assert states[0].revision == frontend.engine.changelog.revision


def test_a_dead_worker_is_restarted_and_its_clients_resume(frontend: RunningFrontend) -> None:
    target = f"127.0.0.1:{frontend.frontend.port}"
    workers = started_workers(frontend)
    clients = [NodeStateClient(target, "node-a", max_backoff=0.3) for _ in range(16)]
    for c in clients:
        c.start()
    try:
        wait_for(lambda: all(c.has_changes() for c in clients), timeout=20)
        for c in clients:
            c.take()
        (old,) = workers.pids
        assert old in serving_pids(frontend.frontend.port), "no client on the worker"
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: workers.pids and workers.pids[0] not in (None, old), timeout=20)
        frontend.submit([Upsert("EndpointSlice", web_slice(1))])

        def converged(c: NodeStateClient) -> Callable[[], bool]:
            return lambda: c.revision == frontend.engine.changelog.revision
        for c in clients:
            wait_for(converged(c), timeout=20)
            state, _ = c.take()  # type: ignore[misc]
            assert set(state.services[WEB].endpoints) == {"10.244.0.1"}
        assert all(c.resets == 0 for c in clients), "the history is the main process's"
    finally:
        for c in clients:
            c.stop()


def test_stream_workers_need_a_tcp_address(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests",
         str(copy_examples(tmp_path)), "--listen", f"unix://{tmp_path}/api.sock",
         "--stream-workers", "2", "--metrics-bind-address", ""],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--stream-workers needs a TCP --listen address" in proc.stderr


def test_cluster_watch_on_any_process(frontend: RunningFrontend) -> None:
    target = f"127.0.0.1:{frontend.frontend.port}"
    started_workers(frontend)
    channels = [own_connection(target) for _ in range(CONNECTIONS)]
    calls = [pb_grpc.NodeStateServiceStub(ch).WatchCluster(pb.ClusterWatchRequest())
             for ch in channels]
    try:
        snapshots = [read_batch(c) for c in calls]
        assert len({b"".join(ev.SerializeToString() for ev in s) for s in snapshots}) == 1
        nodes = {op.set_node.name for ev in snapshots[0] for op in ev.ops
                 if op.WhichOneof("op") == "set_node"}
        assert nodes == {"node-a", "node-b"}
        frontend.submit([Upsert("EndpointSlice", web_slice(5))])
        batches = [read_batch(c) for c in calls]
        assert len({b"".join(ev.SerializeToString() for ev in b) for b in batches}) == 1
        assert batches[0][-1].revision == frontend.engine.changelog.revision
    finally:
        close(channels, calls)

"""The SDK acts on the statuses the proto documents, over real gRPC with a real frontend:
INVALID_ARGUMENT for a resume is "watch again from 0", for a watch from 0 it is fatal."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from svcproxy.convert import node_from_pb, state_from_pb
from svcproxy.sdk import Backend, Changes, NodeState, run
from svcproxy.sdk.client import NodeStateClient, WatchRefused
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import WEB, copy_examples
from tests.support.waiting import wait_for

AN_HOUR_US = 3600 * 10**6


def served(target: str, node: str) -> pb.NodeState:
    with grpc.insecure_channel(target) as channel:
        return pb_grpc.NodeStateServiceStub(channel).GetNodeState(
            pb.GetNodeStateRequest(node_name=node), timeout=20)


def test_a_resume_ahead_of_the_frontend_without_epoch_watches_again_from_0(
        frontend_factory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = copy_examples(tmp_path)
    listen = f"unix://{tmp_path / 'restarted.sock'}"
    first = frontend_factory(d, listen=listen)
    client = NodeStateClient(listen, "node-a", max_backoff=0.5)
    client.start()
    try:
        wait_for(client.has_changes, timeout=30)
        client.take()
        first.stop()
        wait_for(lambda: not client.connected, timeout=30)
        # A revision that frontend never handed out, held without an epoch (as from a
        # frontend that announced none, or a restart whose clock is an hour behind).
        client.epoch = None
        client.revision += AN_HOUR_US
        ahead = client.revision
        web = d / "web.yaml"
        text = web.read_text()
        web.write_text(text[: text.index("- addresses: [10.244.2.10]")])
        (d / "api.yaml").unlink()
        with caplog.at_level(logging.WARNING, "svcproxy.sdk.client"):
            frontend_factory(d, listen=listen)
            wait_for(lambda: client.resets == 1 and client.has_changes(), timeout=60)
        state, changes = client.take()  # type: ignore[misc]
        server = served(listen, "node-a")
        assert state.revision == server.revision < ahead
        assert dict(state.services) == {r.key: r for r in map(state_from_pb, server.services)}
        assert state.node == node_from_pb(server.node)
        assert set(state.services[WEB].endpoints) == {"10.244.1.10", "10.244.1.11"}
        # Handed out as a reset's snapshot is: only what differs.
        assert not changes.full and {k.name for k in changes.services} == {"web", "api"}
        assert client.error is None and not client.stopped and client.mismatches == 0
        refused = [r.getMessage() for r in caplog.records if "refused to resume" in r.getMessage()]
        assert len(refused) == 1 and str(ahead) in refused[0] and "ahead" in refused[0]
    finally:
        client.stop()


def refused_name(error: WatchRefused | None) -> None:
    assert isinstance(error, WatchRefused)
    assert error.node_name == "Bad_Name" and "not a Kubernetes node name" in error.details
    assert "'Bad_Name'" in str(error) and "INVALID_ARGUMENT" in str(error)


def test_an_invalid_node_name_stops_the_client_with_the_error(frontend_factory,
                                                              tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(fe.opts.listen, "Bad_Name", max_backoff=0.5)
    seen: list[WatchRefused] = []
    client.on_error = seen.append
    client.start()
    try:
        wait_for(lambda: client.stopped, timeout=60)
        refused_name(client.error)
        assert seen == [client.error]
        assert not client.wait(0) and list(client.updates(0)) == []
    finally:
        client.stop()


class Unused(Backend):
    name = "unused"

    def sync(self, state: NodeState, changes: Changes) -> None:
        raise AssertionError("no state for an invalid node name")


def test_run_raises_the_refusal(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    give_up = threading.Event()
    timer = threading.Timer(60, give_up.set)  # without the refusal, run would never end
    timer.start()
    try:
        with pytest.raises(WatchRefused) as refused:
            run.run(Unused(), NodeStateClient(fe.opts.listen, "Bad_Name"), give_up)
    finally:
        timer.cancel()
    refused_name(refused.value)


def test_a_backend_exits_naming_the_flag(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcproxy.cli", "backend", "dump", "--api", fe.opts.listen,
         "--node-name", "Bad_Name", "--min-sync-period", "0",
         "--healthz-bind-address", "", "--metrics-bind-address", ""],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert out == ""
    assert "'Bad_Name'" in err and "not a Kubernetes node name" in err
    assert "--hostname-override" in err

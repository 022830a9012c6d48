"""Highly available frontends: a node moves to another replica when its stream breaks,
and the reset that follows costs its dataplane nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc

from svcproxy.frontend.admission.epoch import EPOCH_KEY
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient, server_epoch
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import WEB, copy_examples, web_slice
from tests.support.lab.processes import frontend
from tests.support.waiting import wait_for


def test_kill_9_of_the_replica_in_use_moves_the_node_to_the_other(tmp_path: Path) -> None:
    d = copy_examples(tmp_path)
    socks = [tmp_path / "a.sock", tmp_path / "b.sock"]
    procs = [frontend(d, s, tmp_path / f"{s.stem}.log").start() for s in socks]
    client = NodeStateClient([f"unix://{s}" for s in socks], "node-a", max_backoff=5.0)
    try:
        wait_for(lambda: all(s.exists() for s in socks), timeout=20)
        client.start()
        wait_for(client.has_changes, timeout=20)
        state, _ = client.take()  # type: ignore[misc]
        assert len(state.services[WEB].endpoints) == 3
        used = client.target
        killed = time.monotonic()
        in_use = procs[[f"unix://{s}" for s in socks].index(used)].popen
        assert in_use is not None
        in_use.send_signal(signal.SIGKILL)
        # During the outage one web pod goes away; the other replica sees it.
        web = d / "web.yaml"
        text = web.read_text()
        web.write_text(text[: text.index("- addresses: [10.244.2.10]")])
        wait_for(lambda: client.connected and client.target != used and client.has_changes(),
                 timeout=10, interval=0.005)
        moved = time.monotonic() - killed
        state, changes = client.take()  # type: ignore[misc]
        assert moved < 2.0, f"failover took {moved:.2f}s"
        assert client.resets == 1  # the other replica's revisions are not ours
        assert not changes.full and {k.name for k in changes.services} == {"web"}
        assert set(state.services[WEB].endpoints) == {"10.244.1.10", "10.244.1.11"}
    finally:
        client.stop()
        for proc in procs:
            proc.stop()


def first_batch(sock: Path, since: int = 0,
                epoch: str | None = None) -> tuple[pb.WatchEvent, str | None]:
    metadata = ((EPOCH_KEY, epoch),) if epoch else ()
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        call = pb_grpc.NodeStateServiceStub(channel).Watch(
            pb.WatchRequest(node_name="node-a", since_revision=since), metadata=metadata,
            timeout=10)
        event = next(call)
        epoch = server_epoch(call)
        call.cancel()
    return event, epoch


def test_a_revision_of_another_replica_is_a_reset_even_when_it_looks_valid(  # type: ignore[no-untyped-def]
        frontend_factory, tmp_path: Path) -> None:
    d = copy_examples(tmp_path)
    a, b = frontend_factory(d), frontend_factory(d)
    sock_a = Path(a.opts.listen.removeprefix("unix://"))
    sock_b = Path(b.opts.listen.removeprefix("unix://"))
    event_a, epoch_a = first_batch(sock_a)
    event_b, epoch_b = first_batch(sock_b)
    assert epoch_a and epoch_b and epoch_a != epoch_b
    b.submit([Upsert("EndpointSlice", web_slice(5))])
    # B's own revision with B's epoch resumes with what was missed...
    resumed, _ = first_batch(sock_b, event_b.revision, epoch_b)
    assert not resumed.reset and resumed.revision == event_b.revision + 1
    # ...the very same number from A's epoch is A's revision, not B's: a reset.
    foreign, _ = first_batch(sock_b, event_b.revision, epoch_a)
    assert foreign.reset and foreign.ops

"""A stream the frontend ends for reading nothing is ended for its client too: real
clients that never read (a tiny flow-control window, nothing consumed) over TCP, and
over a unix socket, each see their call end with UNAVAILABLE once
--stream-write-timeout and the grace have passed, and the address's slots are free
again for as many new streams."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from svcproxy.frontend.main import FrontendOptions
from svcproxy.frontend.serving import hangup, limits
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.serving.test_stream_limits import SMALL_WINDOW, bulk
from tests.support.examples import copy_examples, read_batch
from tests.support.frontend import RunningFrontend
from tests.support.waiting import wait_for

STREAMS = 100  # --max-streams-per-peer's default


@pytest.fixture
def tcp_frontend(tmp_path: Path) -> Iterator[RunningFrontend]:
    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen="127.0.0.1:0", metrics_bind_address="",
        stream_limits=StreamLimits(write_timeout=0.5, max_streams_per_peer=STREAMS))).start()
    try:
        fe.submit(bulk(300, 10))  # a snapshot past a 64 KiB window
        yield fe
    finally:
        fe.stop()


def all_accepted(target: str, count: int, closed_too: bool = False) -> bool:
    """Whether ``count`` new Watch streams from 127.0.0.1 are all accepted and served
    (each cancelled after its first batch); ``closed_too``: a connection closed by a
    hang-up still under way (unix sockets: all of them) is a "not yet" too."""
    with grpc.insecure_channel(target) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        watches = [api.Watch(pb.WatchRequest(node_name="node-b")) for _ in range(count)]
        try:
            return all(read_batch(w) for w in watches)
        except grpc.RpcError as err:
            refused = {grpc.StatusCode.RESOURCE_EXHAUSTED}
            if closed_too:
                refused.add(grpc.StatusCode.UNAVAILABLE)
            assert err.code() in refused, err
            return False
        finally:
            for watch in watches:
                watch.cancel()


def unread_watches(target: str, count: int) -> tuple[list[grpc.Channel], list[Any],
                                                     list[threading.Event]]:
    """``count`` Watch calls, each on its own connection, none ever read; an event each,
    set when its call ends."""
    channels, calls, ended = [], [], []
    for _ in range(count):
        ch = grpc.insecure_channel(target, options=SMALL_WINDOW)
        call = pb_grpc.NodeStateServiceStub(ch).Watch(pb.WatchRequest(node_name="node-a"))
        event = threading.Event()
        call.add_done_callback(lambda _c, e=event: e.set())
        channels.append(ch)
        calls.append(call)
        ended.append(event)
    return channels, calls, ended


def test_unread_streams_end_for_their_clients_and_free_their_slots(tcp_frontend) -> None:
    fe = tcp_frontend
    target = f"127.0.0.1:{fe.frontend.port}"
    stalled = limits.STALLED._value.get()
    closed = limits.HUNG_UP._value.get()
    channels, calls, ended = unread_watches(target, STREAMS)
    try:
        wait_for(lambda: limits.STALLED._value.get() >= stalled + STREAMS, timeout=60)
        # The client is told: every call ends (no read, no cancel of its own).
        wait_for(lambda: all(e.is_set() for e in ended), timeout=30)
        assert {c.code() for c in calls} == {grpc.StatusCode.UNAVAILABLE}
        wait_for(lambda: limits.HUNG_UP._value.get() == closed + STREAMS)  # one each
        # As many new streams from the same address are accepted (once the frontend
        # has seen the ended calls finish: a moment after their clients did).
        wait_for(lambda: all_accepted(target, STREAMS), timeout=30, interval=0.2)
    finally:
        for ch in channels:
            ch.close()


def test_remote_of_a_peer() -> None:
    assert hangup.remote_of("ipv4:10.0.0.1:4242") == ("10.0.0.1", 4242)
    assert hangup.remote_of("ipv6:[fd00::1]:4242") == ("fd00::1", 4242)
    assert hangup.remote_of("ipv6:[::ffff:10.0.0.1]:80") == ("10.0.0.1", 80)
    assert hangup.remote_of("unix:") == hangup.UNIX
    assert hangup.remote_of("unix:/run/svcproxy.sock") == hangup.UNIX
    assert hangup.remote_of("dns:x") is None


@pytest.fixture
def unix_frontend(tmp_path: Path) -> Iterator[RunningFrontend]:
    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen=f"unix://{tmp_path / 'api.sock'}",
        metrics_bind_address="",
        stream_limits=StreamLimits(write_timeout=0.5, max_streams_per_peer=UNIX_STREAMS)),
    ).start()
    try:
        fe.submit(bulk(300, 10))  # a snapshot past a 64 KiB window
        yield fe
    finally:
        fe.stop()


UNIX_STREAMS = 20  # every unix client is one peer ("unix:") to the per-peer cap


def test_unread_streams_over_a_unix_socket_end_and_free_their_slots(
        unix_frontend: RunningFrontend, tmp_path: Path) -> None:
    """gRPC tells unix socket clients apart by nothing: their connections are closed,
    so a client that never reads sees its call end and the slots are free again."""
    target = f"unix://{tmp_path / 'api.sock'}"
    stalled = limits.STALLED._value.get()
    closed = limits.HUNG_UP._value.get()
    channels, calls, ended = unread_watches(target, UNIX_STREAMS)
    try:
        wait_for(lambda: limits.STALLED._value.get() >= stalled + UNIX_STREAMS, timeout=60)
        wait_for(lambda: all(e.is_set() for e in ended), timeout=30)
        assert {c.code() for c in calls} == {grpc.StatusCode.UNAVAILABLE}
        assert limits.HUNG_UP._value.get() >= closed + UNIX_STREAMS
        # As many new streams are accepted (once the frontend saw the ended calls finish).
        wait_for(lambda: all_accepted(target, UNIX_STREAMS, closed_too=True), timeout=30,
                 interval=0.2)
    finally:
        for ch in channels:
            ch.close()

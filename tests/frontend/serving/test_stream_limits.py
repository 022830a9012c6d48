"""What one client may cost the frontend, over real gRPC: a stream that does not read holds
one message and is ended after --stream-write-timeout (the SDK resumes), caps on streams
answer RESOURCE_EXHAUSTED, unary calls stay fast meanwhile, invalid requests are refused."""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import _SUBDOMAIN, check_node_name
from svcproxy.frontend.publication.wire import MESSAGE_BYTES
from svcproxy.frontend.serving import limits
from svcproxy.frontend.serving.limits import StreamLimits, peer_address
from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk import client as sdk_client
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples, read_batch
from tests.support.objects import endpoint, service, slice_
from tests.support.waiting import wait_for

# A client that takes in at most HTTP/2's initial 64 KiB window per stream while it does
# not read (no bandwidth probing to grow it), each channel its own connection.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535),
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_receive_message_length", 64 << 20)]


def bulk(services: int, endpoints: int, ns: str = "bulk") -> list[Upsert]:
    """``services`` Services with ``endpoints`` endpoints each on node-a."""
    out = []
    for s in range(services):
        ip = f"10.97.{s // 250}.{s % 250 + 1}"
        out.append(Upsert("Service", service(f"s{s}", ns=ns, ip=ip, target=8080)))
        eps = [endpoint(ip_of(s * endpoints + e), node="node-a") for e in range(endpoints)]
        out.append(Upsert("EndpointSlice", slice_(f"s{s}-x", f"s{s}", eps, ns=ns)))
    return out


def ip_of(i: int) -> str:
    return f"10.{100 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"


def big_service(ip_base: int, count: int, port: int = 8080) -> list[Upsert]:
    """Service bulk/big with ``count`` endpoints on node-a, target port ``port``."""
    eps = [endpoint(f"10.{ip_base}.{i // 250}.{i % 250 + 1}", node="node-a")
           for i in range(count)]
    return [Upsert("Service", service("big", ns="bulk", ip="10.98.0.1", target=port)),
            Upsert("EndpointSlice", slice_("big-x", "big", eps, ns="bulk", port=port))]


def channel(fe: Any, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    return grpc.insecure_channel(fe.opts.listen, options=options or SMALL_WINDOW)


def refusal(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        for _ in result if not isinstance(result, pb.NodeState) else ():
            pass
    return err.value


# ---- bounded memory -------------------------------------------------------------

def test_snapshot_is_encoded_as_it_is_written_in_small_messages(frontend_factory,
                                                                tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    fe.submit(bulk(300, 10))
    engine = fe.engine
    msgs = engine.snapshots.snapshot(engine.changelog.view("node-a"))
    assert not isinstance(msgs, list)  # a generator: one message at a time
    sizes = [len(m) for m in msgs]
    assert len(sizes) >= 3 and max(sizes) <= MESSAGE_BYTES + 1024
    msgs = engine.snapshots.snapshot(engine.changelog.view("node-a"))
    events = [pb.WatchEvent.FromString(m) for m in msgs]
    assert [e.more for e in events] == [True] * (len(events) - 1) + [False]


def test_streams_that_do_not_read_hold_one_message_and_unary_stays_fast(frontend_factory,
                                                                         tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    fe.submit(bulk(500, 20))
    snapshot = sum(len(m) for m in fe.engine.snapshots.snapshot(fe.engine.changelog.view("node-a")))
    assert snapshot > 6 * MESSAGE_BYTES
    streams = 30
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        # Every stream on one connection: its window fills, and no stream reads.
        with channel(fe) as ch:
            api = pb_grpc.NodeStateServiceStub(ch)
            calls = [api.Watch(pb.WatchRequest(node_name="node-a")) for _ in range(streams)]
            wait_for(lambda: watchers(fe, "node-a") == streams)
            time.sleep(1.0)
            held = tracemalloc.get_traced_memory()[0] - before
            with channel(fe) as other:
                unary = pb_grpc.NodeStateServiceStub(other)
                took = []
                for _ in range(5):
                    start = time.monotonic()
                    state = unary.GetNodeState(pb.GetNodeStateRequest(node_name="node-a"),
                                               timeout=10)
                    took.append(time.monotonic() - start)
            for call in calls:
                call.cancel()
    finally:
        tracemalloc.stop()
    assert len(state.services) > 500
    # Whole snapshots per stream would be streams x snapshot (> 12 MB); each holds the
    # message it writes, its list of (shared) ops and gRPC's objects.
    per_stream = held / streams
    assert per_stream < min(snapshot / 4, 6 * MESSAGE_BYTES), (per_stream, snapshot)
    assert sorted(took)[2] < 1.0, took


def watchers(fe: Any, node: str) -> int:
    """Streams the frontend counts on ``node``'s view (0 before the view exists)."""
    view = fe.engine.changelog.views.get(node)
    return view.watchers if view is not None else 0


# ---- the write timeout ---------------------------------------------------------------

def test_stream_not_read_is_ended_with_unavailable(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path),
                          stream_limits=StreamLimits(write_timeout=0.5))
    fe.submit(bulk(300, 10))
    ended = limits.STALLED._value.get()
    with channel(fe) as ch:
        call = pb_grpc.NodeStateServiceStub(ch).Watch(pb.WatchRequest(node_name="node-a"))
        wait_for(lambda: limits.STALLED._value.get() > ended, timeout=10)
        wait_for(lambda: watchers(fe, "node-a") == 0)  # the handler is gone
        with pytest.raises(grpc.RpcError) as err:
            for _ in call:
                pass
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "--stream-write-timeout" in err.value.details()
    assert "resume" in err.value.details()


def test_reading_client_is_never_ended(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path),
                          stream_limits=StreamLimits(write_timeout=1.0))
    fe.submit(bulk(300, 10))
    ended = limits.STALLED._value.get()
    with channel(fe) as ch:
        call = pb_grpc.NodeStateServiceStub(ch).Watch(pb.WatchRequest(node_name="node-a"))
        # (a timeout of 1 s: this client decodes the snapshot in Python, paused at times
        # on a loaded machine)
        read_batch(call)
        for n in range(3):  # idle longer than the timeout between batches
            time.sleep(1.1)
            fe.submit(big_service(200, 10 + n))
            read_batch(call)
        call.cancel()
    assert limits.STALLED._value.get() == ended


def test_sdk_stalled_is_ended_and_resumes_from_its_revision(frontend_factory, tmp_path,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(sdk_client, "CHANNEL_OPTIONS", SMALL_WINDOW)
    fe = frontend_factory(copy_examples(tmp_path),
                          stream_limits=StreamLimits(write_timeout=0.5))
    fe.submit(bulk(20, 2) + big_service(200, 1000))
    client = NodeStateClient(fe.opts.listen, "node-a")
    client.start()
    try:
        wait_for(client.has_changes)
        client.take()
        ended = limits.STALLED._value.get()
        port = 8080
        with client._cond:  # the SDK's reader blocks on its next batch: it stops reading
            deadline = time.monotonic() + 20
            while limits.STALLED._value.get() == ended:  # ~60 KiB a change: the window fills
                assert time.monotonic() < deadline, "the stream was never ended"
                port += 1
                fe.submit(big_service(200, 1000, port=port))
                time.sleep(0.1)
        resets = client.resets
        with channel(fe) as ch:
            want = pb_grpc.NodeStateServiceStub(ch).GetNodeState(
                pb.GetNodeStateRequest(node_name="node-a", service="big"))

        def caught_up() -> bool:
            taken = client.take()
            if taken is None:
                return False
            state = taken[0]
            big = [s for k, s in state.services.items() if k.name == "big"]
            return (state.revision >= want.revision and len(big) == 1
                    and {e.port for e in big[0].endpoints.values()} == {port})

        wait_for(caught_up, timeout=15)
        assert client.resets == resets  # resumed from its revision, no snapshot
    finally:
        client.stop()


# ---- caps ----------------------------------------------------------------------------

def test_streams_beyond_the_per_peer_cap_are_refused(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path),
                          stream_limits=StreamLimits(max_streams_per_peer=2))
    with channel(fe) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        first = api.Watch(pb.WatchRequest(node_name="node-a"))
        second = api.WatchCluster(pb.ClusterWatchRequest())
        read_batch(first)
        read_batch(second)
        err = refusal(lambda: api.Watch(pb.WatchRequest(node_name="node-b"), timeout=5))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-streams-per-peer" in err.details()
        assert err.details().startswith("the unix socket's clients have already 2 open")
        first.cancel()

        def admitted() -> bool:
            try:
                read_batch(api.Watch(pb.WatchRequest(node_name="node-b"), timeout=2))
                return True
            except grpc.RpcError:
                return False

        wait_for(admitted)  # the slot is free once gRPC has finished the call
        second.cancel()


def test_streams_beyond_the_total_cap_are_refused(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path), stream_limits=StreamLimits(max_streams=1))
    with channel(fe) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        first = api.Watch(pb.WatchRequest(node_name="node-a"))
        read_batch(first)
        err = refusal(lambda: api.WatchCluster(pb.ClusterWatchRequest(), timeout=5))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-streams" in err.details() and "retry" in err.details()
        first.cancel()


def test_peer_address() -> None:
    assert peer_address("ipv4:10.0.0.1:4242") == "10.0.0.1"
    assert peer_address("ipv6:[fd00::1]:4242") == "fd00::1"
    assert peer_address("unix:/run/x.sock") == "unix"


# ---- invalid requests ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "Node-A", "-a", "a-", "a..b", "a_b", "a" * 254,
                                  "node a", "nöde"])
def test_invalid_node_names_are_refused(frontend_factory, tmp_path, name: str) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    with channel(fe) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        for call in (lambda: api.Watch(pb.WatchRequest(node_name=name), timeout=5),
                     lambda: api.GetNodeState(pb.GetNodeStateRequest(node_name=name),
                                              timeout=5)):
            err = refusal(call)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert "node_name" in err.details()


def test_revision_ahead_of_the_frontend_is_refused(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    ahead = fe.engine.changelog.revision + 10**9
    with channel(fe) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        for call in (lambda: api.Watch(pb.WatchRequest(node_name="node-a",
                                                        since_revision=ahead), timeout=5),
                     lambda: api.WatchCluster(pb.ClusterWatchRequest(since_revision=ahead),
                                              timeout=5)):
            err = refusal(call)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "ahead" in err.details() and "since_revision 0" in err.details()
        # The frontend's own revision is fine.
        ok = api.Watch(pb.WatchRequest(node_name="node-a",
                                       since_revision=fe.engine.changelog.revision))
        threading.Timer(0.5, ok.cancel).start()
        with pytest.raises(grpc.RpcError) as err:
            for _ in ok:
                pass
        assert err.value.code() == grpc.StatusCode.CANCELLED


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_node_name_check_accepts_exactly_dns1123_subdomains(name: str) -> None:
    valid = len(name) <= 253 and _SUBDOMAIN.fullmatch(name) is not None and name.isascii()
    try:
        check_node_name("Watch", name)
        accepted = True
    except Refused as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        accepted = False
    assert accepted == valid


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}",
                     fullmatch=True))
def test_kubernetes_node_names_are_accepted(name: str) -> None:
    check_node_name("Watch", name)


def test_stream_workers_share_the_caps_and_feed_snapshots_by_message(tmp_path) -> None:
    from svcproxy.frontend.main import FrontendOptions
    from tests.frontend.serving.test_stream_workers import own_connection
    from tests.support.frontend import RunningFrontend

    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen="127.0.0.1:0", metrics_bind_address="",
        stream_workers=2, stream_limits=StreamLimits(max_streams_per_peer=3))).start()
    try:
        fe.submit(bulk(300, 10))
        wait_for(lambda: fe.frontend.workers is not None and len(fe.frontend.workers.pids) == 1)
        target = f"127.0.0.1:{fe.frontend.port}"
        want = fe.records().keys()
        admitted, refused, channels, calls = 0, [], [], []
        for _ in range(8):  # own connections: the kernel spreads them over both processes
            ch = own_connection(target)
            channels.append(ch)
            call = pb_grpc.NodeStateServiceStub(ch).Watch(pb.WatchRequest(node_name="node-a"))
            calls.append(call)  # open until the end
            try:
                batch = read_batch(call)
            except grpc.RpcError as err:
                refused.append(err)
                continue
            admitted += 1
            assert len(batch) >= 3  # a snapshot of several messages
            got = {op.replace_service.service.key.name for ev in batch for op in ev.ops
                   if op.HasField("replace_service")}
            assert got == {k.name for k in want}
        assert admitted == 3
        assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        for ch in channels:
            ch.close()
    finally:
        fe.stop()


def exposed(sample: str, **labels: str) -> float:
    """A sample's value in the frontend's exposition (its /metrics text), 0 if absent."""
    text = generate_latest(REGISTRY).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and s.labels == labels:
                return s.value
    return 0.0


def test_stream_workers_counts_are_in_the_main_process_metrics(tmp_path) -> None:
    from svcproxy.frontend.main import FrontendOptions
    from tests.frontend.serving.test_stream_workers import serving_pids
    from tests.support.frontend import RunningFrontend

    streams, extra = 16, 8
    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen="127.0.0.1:0", metrics_bind_address="",
        stream_workers=2, stream_limits=StreamLimits(write_timeout=0.5,
                                                     max_streams_per_peer=streams))).start()
    channels: list[grpc.Channel] = []
    try:
        fe.submit(bulk(300, 10))
        workers = fe.frontend.workers
        wait_for(lambda: workers is not None and len(workers.pids) == 1, timeout=30)
        target = f"127.0.0.1:{fe.frontend.port}"
        counted = {"stalled": exposed("svcproxy_frontend_watch_stalled_total"),
                   "invalid": exposed("svcproxy_frontend_invalid_requests_total",
                                      method="Watch"),
                   "refused": exposed("svcproxy_frontend_watch_refused_total", cap="peer")}

        def watch(name: str) -> Any:
            ch = grpc.insecure_channel(target, options=SMALL_WINDOW)  # its own connection
            channels.append(ch)
            return pb_grpc.NodeStateServiceStub(ch).Watch(pb.WatchRequest(node_name=name))

        stalled = [watch("node-a") for _ in range(streams)]  # none reads: each stalls
        ended = [threading.Event() for _ in stalled]
        for call, event in zip(stalled, ended, strict=True):
            call.add_done_callback(lambda _c, e=event: e.set())
        wait_for(lambda: watchers(fe, "node-a") == streams, timeout=20)
        assert set(workers.pids) & serving_pids(fe.frontend.port), "no stream on the worker"
        wait_for(lambda: exposed("svcproxy_frontend_watch_stalled_total")
                 == counted["stalled"] + streams, timeout=20)
        # The process serving them closes their connections: each client is told.
        wait_for(lambda: all(e.is_set() for e in ended), timeout=20)
        assert {c.code() for c in stalled} == {grpc.StatusCode.UNAVAILABLE}

        invalid = [refusal(lambda: watch("Not_A_Node")) for _ in range(extra)]
        assert {e.code() for e in invalid} == {grpc.StatusCode.INVALID_ARGUMENT}
        # Their slots are free again (in the main process, which counts them for every
        # process): as many streams that read are admitted, and hold their slots.
        slots = workers._servicer.slots
        wait_for(lambda: fe._loop.run(lambda: slots.per_peer.get("127.0.0.1", 0), 10) == 0,
                 timeout=20)
        reading = [watch("node-a") for _ in range(streams)]
        for call in reading:
            read_batch(call)
        beyond = [refusal(lambda: watch("node-b")) for _ in range(extra)]
        assert {e.code() for e in beyond} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        wait_for(lambda: exposed("svcproxy_frontend_invalid_requests_total", method="Watch")
                 == counted["invalid"] + extra, timeout=10)
        assert exposed("svcproxy_frontend_watch_refused_total",
                       cap="peer") == counted["refused"] + extra
        for call in reading:
            call.cancel()
    finally:
        for ch in channels:
            ch.close()
        fe.stop()


# ---- unary answers not read --------------------------------------------------------

def unread_answer(ch: grpc.Channel, node: str) -> Any:
    """GetNodeState whose answer this client does not read: called as a stream that is
    never iterated, so HTTP/2 flow control leaves the answer with the frontend."""
    return ch.unary_stream("/svcproxy.v1.NodeStateService/GetNodeState")(
        pb.GetNodeStateRequest(node_name=node).SerializeToString(), timeout=30)


def test_unary_answers_not_read_are_bounded_per_peer(frontend_factory, tmp_path) -> None:
    """Each GetNodeState answer (up to 3 MiB) stays in the frontend until its client reads
    it: 300 unread answers took a frontend from 160 MB to 980 MB, with no cap at all."""
    fe = frontend_factory(copy_examples(tmp_path), stream_limits=StreamLimits(
        answer_bytes_per_peer=512 << 10))
    fe.submit(bulk(300, 10))
    with channel(fe) as ch:
        size = pb_grpc.NodeStateServiceStub(ch).GetNodeState(
            pb.GetNodeStateRequest(node_name="node-a")).ByteSize()
    assert 100 << 10 < size < 512 << 10
    before = exposed("svcproxy_frontend_unary_refused_total", cap="peer")
    channels = [channel(fe) for _ in range(3)]
    try:
        calls = [unread_answer(channels[i % 3], "node-a") for i in range(12)]
        held = (512 << 10) // size + 1  # answers one peer may leave unread at most

        def decided() -> bool:  # every call answered or refused, each refusal counted
            done = sum(c.done() for c in calls)
            return done >= len(calls) - held and exposed(
                "svcproxy_frontend_unary_refused_total", cap="peer") == before + done
        wait_for(decided, timeout=20)
        refused = [c for c in calls if c.done()]
        assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "read" in refused[0].details()
        for c in calls:
            c.cancel()

        def answered() -> bool:  # once the unread answers are gone
            try:
                with channel(fe) as ch:
                    return bool(pb_grpc.NodeStateServiceStub(ch).GetNodeState(
                        pb.GetNodeStateRequest(node_name="node-a"), timeout=10).services)
            except grpc.RpcError:
                return False
        wait_for(answered, timeout=20)
    finally:
        for ch in channels:
            ch.close()

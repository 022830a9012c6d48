"""What one client may cost the frontend in unary calls, over real gRPC: a client address
calling beyond --unary-qps-per-peer is refused (counted, logged once), across stream
workers too; a request larger than gRPC's receive limit is counted and logged."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import grpc
import pytest

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.serving.access.auth import AuthConfig
from svcproxy.frontend.serving.limits import (
    MAX_REFUSAL_DELAY,
    PeerLog,
    StreamLimits,
    UnaryRates,
)
from svcproxy.frontend.serving.server import MAX_REQUEST_BYTES
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.serving.test_stream_limits import SMALL_WINDOW, bulk, exposed
from tests.support.examples import copy_examples
from tests.support.waiting import wait_for

# No refill during a test: a peer has exactly ``burst`` calls.
NO_REFILL = 1e-6


def calls(target: str, count: int, node: str = "node-a") -> list[grpc.StatusCode]:
    """``count`` GetNodeState calls, each on its own connection: their status codes."""
    codes = []
    for _ in range(count):
        with grpc.insecure_channel(target, options=SMALL_WINDOW) as ch:
            try:
                pb_grpc.NodeStateServiceStub(ch).GetNodeState(
                    pb.GetNodeStateRequest(node_name=node), timeout=20)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "--unary-qps-per-peer" in err.details()
                    assert "retry in" in err.details() and "Watch" in err.details()
    return codes


def test_calls_beyond_the_rate_per_peer_are_refused(frontend_factory, tmp_path,
                                                    caplog) -> None:
    fe = frontend_factory(copy_examples(tmp_path), stream_limits=StreamLimits(
        unary_qps_per_peer=NO_REFILL, unary_burst_per_peer=5))
    fe.submit(bulk(20, 2))
    before = exposed("svcproxy_frontend_unary_refused_total", cap="rate")
    with caplog.at_level(logging.WARNING, "svcproxy.frontend.serving.limits"):
        codes = calls(fe.opts.listen, 9)
    assert codes == [grpc.StatusCode.OK] * 5 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 4
    assert exposed("svcproxy_frontend_unary_refused_total", cap="rate") == before + 4
    logged = [r for r in caplog.records if "--unary-qps-per-peer" in r.getMessage()]
    assert len(logged) == 1  # once per peer and minute, not per call


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="needs ::1 beside 127.0.0.1")
def test_the_rate_is_per_client_address(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path), listen="[::]:0", auth=AuthConfig(),
                          stream_limits=StreamLimits(unary_qps_per_peer=NO_REFILL,
                                                     unary_burst_per_peer=2))
    fe.submit(bulk(20, 2))
    port = fe.frontend.port
    assert calls(f"127.0.0.1:{port}", 3)[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert calls(f"[::1]:{port}", 2) == [grpc.StatusCode.OK] * 2


def test_the_rate_holds_across_stream_workers(tmp_path) -> None:
    """Unary calls to a worker are answered by the main process, which counts them."""
    from svcproxy.frontend.main import FrontendOptions
    from tests.support.frontend import RunningFrontend

    fe = RunningFrontend(FrontendOptions(
        manifests=copy_examples(tmp_path), listen="127.0.0.1:0", metrics_bind_address="",
        stream_workers=2, stream_limits=StreamLimits(unary_qps_per_peer=NO_REFILL,
                                                     unary_burst_per_peer=6))).start()
    try:
        fe.submit(bulk(20, 2))
        wait_for(lambda: fe.frontend.workers is not None and len(fe.frontend.workers.pids) == 1,
                 timeout=30)
        # Own connections: the kernel spreads them over both processes; with a count per
        # process up to 12 would be answered.
        codes = calls(f"127.0.0.1:{fe.frontend.port}", 16)
        assert codes.count(grpc.StatusCode.OK) == 6
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 10
    finally:
        fe.stop()


def test_token_bucket_refills_at_the_rate_and_forgets_full_buckets() -> None:
    now = [0.0]
    rates = UnaryRates(2.0, 3, clock=lambda: now[0])
    for _ in range(3):
        rates.admit("a")
    with pytest.raises(Exception, match="unary-qps-per-peer"):
        rates.admit("a")
    rates.admit("b")  # another address has its own bucket
    now[0] += 0.5  # one call's worth
    rates.admit("a")
    with pytest.raises(Refused, match="retry in 0.50 s") as refused:
        rates.admit("a")
    assert refused.value.delay == pytest.approx(0.5)  # held back until it could be answered
    rates.charge("b", 0.1)  # a call that took 100 ms counts as 1 + 4
    assert rates.buckets["b"][0] == pytest.approx(3 - 1 - 4)
    now[0] += 61  # full again: forgotten at the next sweep
    rates.admit("c")
    assert set(rates.buckets) == {"c"}
    assert UnaryRates(0, 1).admit("a") is None  # 0: no limit


def test_peer_log_says_once_per_interval_how_many_it_left_out(caplog) -> None:
    now = [0.0]
    peers = PeerLog(10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "svcproxy.frontend.serving.limits"):
        for _ in range(5):
            peers.warn("a", "refused %s", "a")
        peers.warn("b", "refused %s", "b")
        now[0] = 11.0
        peers.warn("a", "refused %s", "a")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "4 more since the last line" in lines[2]


def oversized(target: str, method: str, size: int) -> grpc.RpcError:
    """A request of ``size`` bytes (a valid GetNodeStateRequest: its node_name is long)."""
    data = pb.GetNodeStateRequest(node_name="a" * size).SerializeToString()
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as ch:
        call = ch.unary_unary(f"/svcproxy.v1.NodeStateService/{method}")
        with pytest.raises(grpc.RpcError) as err:
            call(data, timeout=20)
    return err.value


def test_requests_over_the_receive_limit_are_counted_and_logged(frontend_factory, tmp_path,
                                                                caplog) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    before = {m: exposed("svcproxy_frontend_invalid_requests_total", method=m)
              for m in ("GetNodeState", "ListNodes")}
    with caplog.at_level(logging.WARNING, "svcproxy.frontend.serving.limits"):
        refused = [oversized(fe.opts.listen, "GetNodeState", MAX_REQUEST_BYTES + 1000)
                   for _ in range(3)]
        refused.append(oversized(fe.opts.listen, "ListNodes", 4 << 20))
    assert {e.code() for e in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}

    def counted() -> bool:
        return [exposed("svcproxy_frontend_invalid_requests_total", method=m) - before[m]
                for m in before] == [3, 1]
    wait_for(counted)
    logged = [r.getMessage() for r in caplog.records if "did not arrive" in r.getMessage()]
    assert len(logged) == 1 and "GetNodeState" in logged[0]  # once per client address
    with grpc.insecure_channel(fe.opts.listen) as ch:  # the frontend serves on
        assert pb_grpc.NodeStateServiceStub(ch).ListNodes(pb.ListNodesRequest(), timeout=10)


def test_a_unary_call_with_no_request_is_refused(frontend_factory, tmp_path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    before = exposed("svcproxy_frontend_invalid_requests_total", method="ListNodes")
    with grpc.insecure_channel(fe.opts.listen) as ch:
        call = ch.stream_unary("/svcproxy.v1.NodeStateService/ListNodes")
        with pytest.raises(grpc.RpcError) as err:
            call(iter(()), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no request message" in err.value.details()
    assert exposed("svcproxy_frontend_invalid_requests_total", method="ListNodes") == before + 1


def test_a_refusal_for_the_rate_is_held_back(frontend_factory, tmp_path) -> None:
    """A client that retries at once waits for each refusal (a lower bound on time: a
    loaded machine only makes it longer)."""
    fe = frontend_factory(copy_examples(tmp_path), stream_limits=StreamLimits(
        unary_qps_per_peer=NO_REFILL, unary_burst_per_peer=1))
    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        api.ListNodes(pb.ListNodesRequest(), timeout=20)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            api.ListNodes(pb.ListNodesRequest(), timeout=20)
        took = time.monotonic() - start
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert took >= MAX_REFUSAL_DELAY * 0.95


@pytest.mark.parametrize("flag, value", [
    ("--unary-qps-per-peer", "-1"), ("--unary-qps-per-peer", "nan"),
    ("--unary-qps-per-peer", "inf"), ("--unary-burst-per-peer", "0"),
    ("--stream-write-timeout", "-1"), ("--stream-write-timeout", "nan"),
    ("--stream-write-timeout", "inf")])
def test_hostile_limit_values_stop_the_frontend_naming_the_flag(tmp_path, flag: str,
                                                                value: str) -> None:
    """Refused before anything starts (inf too: 0 is "no limit", and inf would reach the
    token bucket as NaN arithmetic)."""
    sock = tmp_path / "api.sock"
    done = subprocess.run(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests", str(tmp_path),
         "--listen", f"unix://{sock}", "--metrics-bind-address", "", f"{flag}={value}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert flag in done.stderr
    if flag.startswith("--unary"):
        other = ({"--unary-qps-per-peer", "--unary-burst-per-peer"} - {flag}).pop()
        assert other not in done.stderr
    assert not sock.exists()

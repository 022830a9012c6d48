"""Malformed and careless requests over real gRPC: each is refused alone with
INVALID_ARGUMENT and a message saying what to send, counted, and never logged as a
traceback (a client could otherwise fill the frontend's log)."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest

from svcproxy.frontend.main import FrontendOptions
from tests.conftest import RunningFrontend, wait_for
from tests.test_stream import copy_examples
from tests.test_stream_limits import exposed
from tests.test_stream_workers import own_connection

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

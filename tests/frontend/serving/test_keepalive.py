"""A quiet watch stays open: the frontend accepts the keepalive pings the SDK's nodes send.

gRPC's default server policy lets a client ping only every 5 minutes on a connection
with no data and answers a third early ping with GOAWAY too_many_pings: a node whose
watch had no change for a while lost it, and the next change waited for its reconnect.
The SDK keeps pinging a quiet watch (to notice a frontend gone without a reset); the
test pings faster than it does (every 6 s instead of 30 s) against a real server and
checks that the stream still delivers after several pings without data (on the old
policy: GOAWAY after the fourth ping).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from svcproxy.frontend.serving.server import serve_api
from svcproxy.sdk.client import CHANNEL_OPTIONS

PING_MS = 6000
QUIET_S = 31  # five pings without data


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, asyncio.AbstractEventLoop,
                                             health.aio.HealthServicer]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    target = f"unix://{tmp_path / 'api.sock'}"
    servicer = health.aio.HealthServicer()
    started = asyncio.run_coroutine_threadsafe(serve_api(
        grpc.method_handlers_generic_handler("svcproxy.test.Nothing", {}), target,
        health_servicer=servicer), loop)
    grpc_server, _port = started.result(30)
    asyncio.run_coroutine_threadsafe(servicer.set("", health_pb2.HealthCheckResponse.SERVING),
                                     loop).result(10)
    try:
        yield target, loop, servicer
    finally:
        asyncio.run_coroutine_threadsafe(grpc_server.stop(None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_quiet_stream_outlives_the_clients_keepalive_pings(server) -> None:  # noqa: ANN001
    target, loop, servicer = server
    options = [(k, PING_MS if k == "grpc.keepalive_time_ms" else v) for k, v in CHANNEL_OPTIONS]
    with grpc.insecure_channel(target, options=options) as channel, \
            ThreadPoolExecutor(1) as pool:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        following = pool.submit(next, stream)
        with pytest.raises(TimeoutError):  # the quiet time: nothing to say, nothing said
            following.result(QUIET_S)
        asyncio.run_coroutine_threadsafe(
            servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING), loop).result(10)
        assert following.result(10).status == health_pb2.HealthCheckResponse.NOT_SERVING
        stream.cancel()

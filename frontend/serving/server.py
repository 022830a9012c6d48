"""The gRPC server (grpc.aio): Watch, WatchCluster, GetNodeState, ListNodes.

Reflection and the standard health service are on, so grpcurl can list,
describe and call everything. Watch streams are sent as pre-serialised bytes
(see publication/wire.py); each stream is its own coroutine reading shared history from
its own cursor, so a slow client never delays another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from svcproxy.frontend.admission.refusals import INVALID, Refused
from svcproxy.frontend.admission.validation import Malformed, check_since, invalid, parse
from svcproxy.frontend.fleet.service import FleetService
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.changelog import TooManyViews
from svcproxy.frontend.publication.views import CLUSTER_VIEW, NodeView
from svcproxy.frontend.serving.access.guard import CallGuard
from svcproxy.frontend.serving.limits import (
    AnswerBudget,
    RefusalDelay,
    StallWatch,
    StreamLimits,
    StreamSlots,
    UnaryRates,
    WriteClock,
    peer_address,
)
from svcproxy.frontend.serving.oversized import RequestSizeInterceptor
from svcproxy.frontend.serving.pages import PAGE_BYTES, NodeStatePages
from svcproxy.frontend.serving.reflection import enable_reflection
from svcproxy.frontend.serving.stream import Messages, WatchServicer, write_stream
from svcproxy.v1 import nodestate_pb2 as pb

log = logging.getLogger(__name__)
SERVICE = "svcproxy.v1.NodeStateService"


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None


class NodeStateServicer(WatchServicer):
    def __init__(self, engine: Engine, limits: StreamLimits | None = None,
                 fleet: FleetService | None = None) -> None:
        self.engine = engine
        # What every node applied (Report, GetFleet, WatchFleet, WaitFleet).
        self.fleet = fleet or FleetService(engine, "")
        self.limits = limits or StreamLimits()
        self.slots = StreamSlots(self.limits)
        self.stalls = StallWatch(self.limits.write_timeout)
        self.pages = NodeStatePages(engine)
        self.answers = AnswerBudget(self.limits.answer_bytes_per_peer,
                                    self.limits.answer_bytes_total, PAGE_BYTES)
        self.rates = UnaryRates(self.limits.unary_qps_per_peer,
                                self.limits.unary_burst_per_peer)
        self.delays = RefusalDelay()

    def start_stream(self, name: str, since: int, peer: str) -> tuple[NodeView, int, Messages]:
        """Admit one stream of ``peer`` (its address; its slot is the caller's to release):
        the view it watches, its cursor and first messages; Refused when over a cap
        (streams, views) or ``since`` is ahead of this frontend."""
        check_since("WatchCluster" if name == CLUSTER_VIEW else "Watch", since,
                    self.engine.changelog.revision)
        self.slots.acquire(peer)
        try:
            view = self.engine.changelog.watch(name)
        except TooManyViews as err:
            self.slots.release(peer)
            raise Refused("RESOURCE_EXHAUSTED", str(err)) from None
        cursor, first = self.engine.snapshots.catch_up(view, since)
        return view, cursor, first

    async def stream(self, name: str, since: int, context: grpc.aio.ServicerContext,
                     clock: WriteClock) -> None:
        engine = self.engine
        await engine.synced.wait()
        peer = context.peer()
        address = peer_address(peer)
        view, cursor, first = self.start_stream(name, since, address)
        context.add_done_callback(lambda _: self.slots.release(address))
        log.info("watch from %s for %s since revision %d", peer, name or "<cluster>", since)

        async def resync(cursor: int) -> tuple[int, Messages]:
            return engine.snapshots.catch_up(view, cursor)

        try:
            await write_stream(context, view, cursor, first, resync, clock)
        finally:
            engine.changelog.unwatch(view)
            log.info("watch from %s for %s ended", peer, name or "<cluster>")

    def answer(self, method: str, request: Any, peer: str) -> bytes:
        """A unary call's serialised answer for ``peer`` (its address, whichever process
        it called); Refused beyond the peer's rate, for an invalid request, or before
        the first complete state (a partial one would pass for the cluster's)."""
        self.rates.admit(peer)
        if not self.engine.synced.is_set():
            raise Refused("UNAVAILABLE", (
                "this frontend has not listed every Service, EndpointSlice and Node yet "
                "(its health is NOT_SERVING): retry with backoff, or ask a ready replica"))
        start = time.thread_time()
        try:
            if method == "GetNodeState":
                return self.pages.answer(request)
            if method == "Report":
                return self.fleet.report(request)
            if method == "GetFleet":
                return self.fleet.get_fleet(request)
            return self.pages.nodes(request)
        finally:
            self.rates.charge(peer, time.thread_time() - start)

    async def GetNodeState(self, request: pb.GetNodeStateRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("GetNodeState", request, context)

    async def ListNodes(self, request: pb.ListNodesRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("ListNodes", request, context)

    async def Report(self, request: pb.NodeReport,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("Report", request, context)

    async def GetFleet(self, request: pb.GetFleetRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> bytes:
        return await self._unary("GetFleet", request, context)

    async def WatchFleet(self, request: pb.WatchFleetRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> None:
        await self._fleet_stream(self.fleet.watch, request, context)

    async def WaitFleet(self, request: pb.WaitFleetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> None:
        await self._fleet_stream(self.fleet.wait, request, context)

    async def _fleet_stream(self, messages: Callable[[Any], Any], request: Any,
                            context: grpc.aio.ServicerContext) -> None:
        """Write a fleet stream's messages once the frontend has synced; it holds one of
        its peer's stream slots, as a Watch does (a flood of waits is bounded too)."""
        await self.engine.synced.wait()
        peer = peer_address(context.peer())
        try:
            self.slots.acquire(peer)
            try:
                async for msg in messages(request):
                    await context.write(msg)
            finally:
                self.slots.release(peer)
        except Refused as err:
            await err.abort(context)

    async def _unary(self, method: str, request: Any,
                     context: grpc.aio.ServicerContext) -> bytes:
        peer = peer_address(context.peer())
        try:
            self.answers.admit(peer)
            return self.answers.hold(context, peer, self.answer(method, request, peer))
        except Refused as err:
            await self.delays.hold(peer, err)
            await err.abort(context)
            raise


def _identity(data: bytes) -> bytes:
    return data


class Servicer(Protocol):
    """What the API's handler calls: the main process's servicer or a stream worker's."""

    async def Watch(self, request: pb.WatchRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> None: ...

    async def WatchCluster(self, request: pb.ClusterWatchRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> None: ...

    async def GetNodeState(self, request: Any,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> Any: ...

    async def ListNodes(self, request: Any,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> Any: ...

    async def Report(self, request: Any,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> Any: ...

    async def GetFleet(self, request: Any,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> Any: ...

    async def WatchFleet(self, request: pb.WatchFleetRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> None: ...

    async def WaitFleet(self, request: pb.WaitFleetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> None: ...


REQUESTS: dict[str, type[Message]] = {
    "Watch": pb.WatchRequest, "WatchCluster": pb.ClusterWatchRequest,
    "GetNodeState": pb.GetNodeStateRequest, "ListNodes": pb.ListNodesRequest,
    "Report": pb.NodeReport, "GetFleet": pb.GetFleetRequest,
    "WatchFleet": pb.WatchFleetRequest, "WaitFleet": pb.WaitFleetRequest}
# The server-streaming methods (the others are unary).
STREAMING = frozenset({"Watch", "WatchCluster", "WatchFleet", "WaitFleet"})


def _refusing_malformed(method: str, behavior: Callable[[Any, grpc.aio.ServicerContext], Any]
                        ) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    """``behavior``, but a request that did not parse is refused with INVALID_ARGUMENT."""
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await invalid(method, request.message).abort(context)
        return await behavior(request, context)
    return call


def api_handler(servicer: Servicer, raw_unary: bool = False) -> grpc.GenericRpcHandler:
    """The svcproxy.v1 handler; with ``raw_unary`` the unary methods take and return
    serialised bytes (a stream worker forwards them to the main process, which parses
    them)."""
    methods = {}
    for name, kind in REQUESTS.items():
        behavior = getattr(servicer, name)
        if name in STREAMING:
            methods[name] = grpc.unary_stream_rpc_method_handler(
                _refusing_malformed(name, behavior), request_deserializer=partial(parse, kind),
                response_serializer=_identity)
        elif raw_unary:
            methods[name] = grpc.unary_unary_rpc_method_handler(
                behavior, request_deserializer=_identity, response_serializer=_identity)
        else:
            methods[name] = grpc.unary_unary_rpc_method_handler(
                _refusing_malformed(name, behavior), request_deserializer=partial(parse, kind),
                response_serializer=_identity)
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """TLS, or mutual TLS when a client CA is given; the files are re-read when they
    change (new connections use the new ones; existing streams continue). Imported only
    then: a plaintext or unix-socket start (local mode's) needs none of it."""
    from svcproxy.frontend.serving.access.tls import dynamic_server_credentials

    return dynamic_server_credentials(tls.cert, tls.key, tls.client_ca)


# The SDK's nodes ping every 30 s while their watch is quiet (sdk/client.py). gRPC's
# default lets a client ping once per 5 minutes without data and answers a third early
# ping with GOAWAY too_many_pings: a quiet watch was cut after ~90 s and the next change
# waited for the node to reconnect. Pings are accepted every 5 s.
KEEPALIVE_POLICY = (("grpc.http2.min_ping_interval_without_data_ms", 5000),)


class CallNoise(logging.Filter):
    """What gRPC logs as an ERROR with a traceback although a client caused it, made one
    DEBUG line: an answer it could not send because its client cancelled or went away
    meanwhile (a race in grpc.aio: once it knows the client closed, it says nothing),
    and a request to health or reflection that is not protobuf (health is open to every
    caller; our own methods refuse such a request themselves), also counted in
    svcproxy_frontend_invalid_requests_total by method."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        if exc is None or exc.__name__ not in ("ExecuteBatchError", "DecodeError"):
            return True
        method = str(record.getMessage()).rpartition(" ")[2].strip("[]/")
        if exc.__name__ == "DecodeError":
            INVALID.labels(method).inc()
            record.msg = "%s: the request is not protobuf; refused"
        else:
            record.msg = "%s: the client left before its answer was sent"
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.args, record.exc_info, record.exc_text = (method,), None, None
        return log.isEnabledFor(logging.DEBUG)


# The largest valid request (a 253-character node name, two 63-character filters, a
# page token) is under 1 KiB: gRPC refuses bigger ones with RESOURCE_EXHAUSTED as they
# arrive (its default let every call bring 4 MiB); RequestSizeInterceptor counts them.
MAX_REQUEST_BYTES = 64 << 10


async def serve_api(handler: grpc.GenericRpcHandler, listen: str,
                    tls: TLSFiles | None = None, guard: CallGuard | None = None,
                    health_servicer: health_aio.HealthServicer | None = None,
                    ) -> tuple[grpc.aio.Server, int]:
    """Start a gRPC server with ``handler``, health and reflection on ``listen``
    (HOST:PORT or unix:///path); returns the server and its port. Several processes can
    serve the same TCP port (SO_REUSEPORT): the kernel spreads connections over them.
    ``guard`` authenticates and authorises calls; with ``health_servicer`` the caller
    sets the health status (else it is SERVING once started)."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20),
                                      ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                                      ("grpc.keepalive_time_ms", 30000),
                                      *KEEPALIVE_POLICY,
                                      # A call waits for the server to pick it up (gRPC
                                      # cancels it after 30 s by default): in a reconnect
                                      # storm the nodes queue instead of retrying
                                      # (bench/bench_reconnect_storm.py).
                                      ("grpc.server_max_unrequested_time_in_server", 300),
                                      ("grpc.so_reuseport", 1)],
                             interceptors=[RequestSizeInterceptor(MAX_REQUEST_BYTES),
                                           *(guard.interceptors() if guard else ())])
    server.add_generic_rpc_handlers((handler,))
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, CallNoise) for f in grpc_log.filters):
        grpc_log.addFilter(CallNoise())
    serving = health_servicer is None
    health_servicer = health_servicer or health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if listen.startswith("unix://"):
        Path(listen.removeprefix("unix://")).unlink(missing_ok=True)
    port = (server.add_secure_port(listen, server_credentials(tls)) if tls
            else server.add_insecure_port(listen))
    if not port and not listen.startswith("unix"):
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    for name in ("", SERVICE) if serving else ():
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port


async def start_server(engine: Engine, listen: str, tls: TLSFiles | None = None,
                       guard: CallGuard | None = None,
                       health_servicer: health_aio.HealthServicer | None = None,
                       servicer: NodeStateServicer | None = None,
                       ) -> tuple[grpc.aio.Server, int]:
    """Serve the engine's API (through ``servicer``, if given) on ``listen``; returns
    the server and its port."""
    servicer = servicer or NodeStateServicer(engine)
    server, port = await serve_api(api_handler(servicer), listen, tls, guard,
                                   health_servicer)
    log.info("serving the svcproxy API on %s%s", listen, " (TLS)" if tls else "")
    return server, port

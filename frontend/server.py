"""The gRPC server (grpc.aio): Watch, WatchCluster, GetNodeState, ListNodes.

Reflection and the standard health service are on, so grpcurl can list,
describe and call everything. Watch streams are sent as pre-serialised bytes
(see wire.py); each stream is its own coroutine reading shared history from
its own cursor, so a slow client never delays another.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from svcproxy.convert import node_to_pb, state_to_pb
from svcproxy.frontend import metrics
from svcproxy.frontend.engine import CLUSTER_VIEW, Engine, known_nodes
from svcproxy.frontend.views import NodeView
from svcproxy.frontend.wire import chunk_events
from svcproxy.v1 import nodestate_pb2 as pb

log = logging.getLogger(__name__)
SERVICE = "svcproxy.v1.NodeStateService"


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None


class NodeStateServicer:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def Watch(self, request: pb.WatchRequest,  # noqa: N802 - gRPC method name
                    context: grpc.aio.ServicerContext) -> None:
        if not request.node_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "node_name is required (use WatchCluster for every node)")
        await self._stream(request.node_name, request.since_revision, context)

    async def WatchCluster(self, request: pb.ClusterWatchRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> None:
        await self._stream(CLUSTER_VIEW, request.since_revision, context)

    async def _stream(self, name: str, since: int, context: grpc.aio.ServicerContext) -> None:
        """Write the view's snapshot, then its batches, with ``context.write`` (one
        generator layer less per message than yielding)."""
        engine = self.engine
        await engine.synced.wait()
        view = engine.view(name)
        view.watchers += 1
        metrics.CLIENTS.inc()
        peer = context.peer()
        log.info("watch from %s for %s since revision %d", peer, name or "<cluster>", since)
        try:
            cursor = since
            if since == 0 or not view.can_resume(since) or since > engine.revision:
                if since:
                    metrics.RESETS.inc()
                    log.info("%s: revision %d is not in the history; sending a reset and a "
                             "full snapshot", peer, since)
                cursor = engine.revision
                for msg in self._snapshot(view, cursor, reset=since != 0):
                    await context.write(msg)
            while True:
                await view.wait_change(cursor)
                msgs = view.messages_since(cursor)
                metrics.CLIENT_LAG.observe(max(0, engine.revision - cursor - 1))
                if msgs is None:
                    metrics.RESETS.inc()
                    cursor = engine.revision
                    msgs = self._snapshot(view, cursor, reset=True)
                else:
                    cursor = view.revision
                for msg in msgs:
                    await context.write(msg)
        finally:
            view.watchers -= 1
            metrics.CLIENTS.dec()
            engine.release(view)
            log.info("watch from %s for %s ended", peer, name or "<cluster>")

    def _snapshot(self, view: NodeView, revision: int, reset: bool) -> list[bytes]:
        msgs = list(chunk_events(revision, self.engine.snapshot_ops(view), reset=reset))
        metrics.SNAPSHOT_BYTES.observe(sum(len(m) for m in msgs))
        return msgs

    async def GetNodeState(self, request: pb.GetNodeStateRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> pb.NodeState:
        view = self.engine.view(request.node_name)
        try:
            out = pb.NodeState(revision=self.engine.revision,
                               services=[state_to_pb(r) for _, r in sorted(view.records.items())])
            if view.node is not None:
                out.node.CopyFrom(node_to_pb(view.node))
            return out
        finally:
            self.engine.release(view)

    async def ListNodes(self, request: pb.ListNodesRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=[node_to_pb(n) for n in known_nodes(self.engine)],
                                    revision=self.engine.revision)


def _identity(data: bytes) -> bytes:
    return data


def _serialize(msg: pb.NodeState | pb.ListNodesResponse) -> bytes:
    return msg.SerializeToString()


def _handler(servicer: NodeStateServicer) -> grpc.GenericRpcHandler:
    methods = {
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, request_deserializer=pb.WatchRequest.FromString,
            response_serializer=_identity),
        "WatchCluster": grpc.unary_stream_rpc_method_handler(
            servicer.WatchCluster, request_deserializer=pb.ClusterWatchRequest.FromString,
            response_serializer=_identity),
        "GetNodeState": grpc.unary_unary_rpc_method_handler(
            servicer.GetNodeState, request_deserializer=pb.GetNodeStateRequest.FromString,
            response_serializer=_serialize),
        "ListNodes": grpc.unary_unary_rpc_method_handler(
            servicer.ListNodes, request_deserializer=pb.ListNodesRequest.FromString,
            response_serializer=_serialize),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """TLS, or mutual TLS when a client CA is given."""
    ca = tls.client_ca.read_bytes() if tls.client_ca else None
    return grpc.ssl_server_credentials([(tls.key.read_bytes(), tls.cert.read_bytes())],
                                       root_certificates=ca, require_client_auth=ca is not None)


async def start_server(engine: Engine, listen: str,
                       tls: TLSFiles | None = None) -> tuple[grpc.aio.Server, int]:
    """Start serving on ``listen`` (HOST:PORT or unix:///path); returns the server and port."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20),
                                      ("grpc.keepalive_time_ms", 30000)])
    server.add_generic_rpc_handlers((_handler(NodeStateServicer(engine)),))
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if listen.startswith("unix://"):
        Path(listen.removeprefix("unix://")).unlink(missing_ok=True)
    port = (server.add_secure_port(listen, server_credentials(tls)) if tls
            else server.add_insecure_port(listen))
    if not port and not listen.startswith("unix"):
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving the svcproxy API on %s%s", listen, " (TLS)" if tls else "")
    return server, port

"""The loop of one Watch stream, shared by the main process and the stream workers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

import grpc

from svcproxy.frontend import metrics
from svcproxy.frontend.engine import CLUSTER_VIEW
from svcproxy.frontend.views import NodeView
from svcproxy.v1 import nodestate_pb2 as pb

# Where a stream goes on when its view's history no longer reaches its cursor:
# (new cursor, messages to send), as Engine.catch_up returns them.
Resync = Callable[[int], Awaitable[tuple[int, list[bytes]]]]


async def write_stream(context: grpc.aio.ServicerContext, view: NodeView, cursor: int,
                       first: list[bytes], resync: Resync) -> None:
    """Write ``first``, then every later batch of ``view``, until the client goes away.

    Messages go out with ``context.write`` (one generator layer less per message than
    yielding); a client that fell behind gets the batches it missed coalesced into one.
    """
    for msg in first:
        await context.write(msg)
    while True:
        await view.wait_change(cursor)
        msgs = view.messages_since(cursor)
        if msgs is None:
            cursor, msgs = await resync(cursor)
        else:
            metrics.CLIENT_LAG.observe(view.batches_after(cursor) - 1)
            cursor = view.revision
        for msg in msgs:
            await context.write(msg)


class WatchServicer(ABC):
    """Watch and WatchCluster, for a servicer that knows how to serve one stream."""

    async def Watch(self, request: pb.WatchRequest,  # noqa: N802 - gRPC method name
                    context: grpc.aio.ServicerContext) -> None:
        if not request.node_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "node_name is required (use WatchCluster for every node)")
        await self.stream(request.node_name, request.since_revision, context)

    async def WatchCluster(self, request: pb.ClusterWatchRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> None:
        await self.stream(CLUSTER_VIEW, request.since_revision, context)

    @abstractmethod
    async def stream(self, name: str, since: int, context: grpc.aio.ServicerContext) -> None:
        """Serve the view ``name`` (CLUSTER_VIEW for the cluster) to one client."""

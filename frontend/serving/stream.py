"""The loop of one Watch stream, shared by the main process and the stream workers.

A stream holds one message of its own: each is encoded (a snapshot's) or taken from the
view's shared encoding (a batch's) when the previous one is written, and with grpc.aio a
write completes only once HTTP/2 flow control lets the message through to the client.
A client that does not read therefore stops its stream at one message, and StallWatch
ends the stream after --stream-write-timeout, closing its connection a moment later
(see limits.py and hangup.py).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import grpc

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import check_node_name
from svcproxy.frontend.publication.views import CLUSTER_VIEW, NodeView
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.serving.limits import (
    FAILED,
    STALLED,
    StallWatch,
    WriteClock,
    stalled_status,
)
from svcproxy.v1 import nodestate_pb2 as pb

Messages = Iterable[bytes] | AsyncIterator[bytes]
# Where a stream goes on when its view's history no longer reaches its cursor:
# (new cursor, messages to send), as Snapshots.catch_up returns them.
Resync = Callable[[int], Awaitable[tuple[int, Messages]]]
log = logging.getLogger(__name__)


async def _write_all(context: grpc.aio.ServicerContext, msgs: Messages,
                     clock: WriteClock) -> None:
    """Write ``msgs`` in order, each write's start on ``clock``."""
    now = clock.now
    if type(msgs) is not list and isinstance(msgs, AsyncIterator):
        async for msg in msgs:
            clock.started = now()
            await context.write(msg)
    else:
        for msg in msgs:
            clock.started = now()
            await context.write(msg)
    clock.started = 0.0


async def write_stream(context: grpc.aio.ServicerContext, view: NodeView, cursor: int,
                       first: Messages, resync: Resync, clock: WriteClock) -> None:
    """Write ``first``, then every later batch of ``view``, until the client goes away.

    Messages go out with ``context.write`` (one generator layer less per message than
    yielding); a client that fell behind gets the batches it missed coalesced into one.
    """
    await _write_all(context, first, clock)
    del first
    now = clock.now
    while True:
        await view.wait_change(cursor)
        msgs = view.messages_since(cursor)
        if msgs is None:
            cursor, resent = await resync(cursor)
            await _write_all(context, resent, clock)
            del resent
            continue
        metrics.CLIENT_LAG.observe(view.batches_after(cursor) - 1)
        cursor = view.revision
        # The fan-out's path: the batch's messages are shared by every stream at cursor.
        for msg in msgs:
            clock.started = now()
            await context.write(msg)
        clock.started = 0.0


class WatchServicer(ABC):
    """Watch and WatchCluster, for a servicer that knows how to serve one stream."""

    stalls: StallWatch

    async def Watch(self, request: pb.WatchRequest,  # noqa: N802 - gRPC method name
                    context: grpc.aio.ServicerContext) -> None:
        try:
            check_node_name("Watch", request.node_name)
        except Refused as err:
            await err.abort(context)
        await self._serve(request.node_name, request.since_revision, context)

    async def WatchCluster(self, request: pb.ClusterWatchRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> None:
        await self._serve(CLUSTER_VIEW, request.since_revision, context)

    async def _serve(self, name: str, since: int, context: grpc.aio.ServicerContext) -> None:
        clock = self.stalls.register(context.peer())
        try:
            await self.stream(name, since, context, clock)
        except asyncio.CancelledError:
            if not clock.stalled:
                raise
            STALLED.inc()
            stalled_status(context, self.stalls.timeout, name or "<cluster>")
        except Refused as err:
            await err.abort(context)
        except Exception:
            # Never from a value (the encoders are total, see svcproxy/wirevalues.py):
            # named and counted, and gRPC ends the call with UNKNOWN.
            FAILED.inc()
            log.exception("watch from %s for %s ended on an error of the frontend's",
                          context.peer(), name or "<cluster>")
            raise
        finally:
            self.stalls.unregister(clock)

    @abstractmethod
    async def stream(self, name: str, since: int, context: grpc.aio.ServicerContext,
                     clock: WriteClock) -> None:
        """Serve the view ``name`` (CLUSTER_VIEW for the cluster) to one client, its
        writes timed on ``clock``; Refused to refuse it."""

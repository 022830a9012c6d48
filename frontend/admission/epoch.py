"""Revisions of different frontend replicas never mix.

Each frontend process tree (main process and its stream workers) has an epoch, a
random name chosen at start. A Watch answer carries it in the initial metadata
(``svcproxy-epoch``); a client resuming sends the epoch its revision came from, and a
frontend of another epoch answers the resume with a reset and a full snapshot (its
revision numbers mean nothing for another replica's, however close they are). Clients
that send no epoch keep the old behaviour (a resume is checked against the history).
"""

from __future__ import annotations

import uuid
from typing import Any

import grpc

from svcproxy.frontend.admission.validation import Malformed
from svcproxy.v1 import nodestate_pb2 as pb

EPOCH_KEY = "svcproxy-epoch"
STREAMS = {"/svcproxy.v1.NodeStateService/Watch": pb.WatchRequest,
           "/svcproxy.v1.NodeStateService/WatchCluster": pb.ClusterWatchRequest}
# A revision no view's history reaches (they start at the start time in microseconds):
# resuming from it is answered with a reset.
FOREIGN = 1


def new_epoch() -> str:
    return uuid.uuid4().hex


def client_epoch(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == EPOCH_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class EpochInterceptor(grpc.aio.ServerInterceptor):
    """Announces this frontend's epoch on Watch streams; a resume from another epoch's
    revision becomes a resume from a revision no history holds (a reset)."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch

    async def intercept_service(self, continuation: Any,
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or details.method not in STREAMS:
            return handler
        behavior, epoch = handler.unary_stream, self.epoch

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Malformed):  # refused by the handler
                return await behavior(request, context)
            theirs = client_epoch(context.invocation_metadata())
            if request.since_revision and theirs is not None and theirs != epoch:
                request.since_revision = FOREIGN
            await context.send_initial_metadata(((EPOCH_KEY, epoch),))
            return await behavior(request, context)

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

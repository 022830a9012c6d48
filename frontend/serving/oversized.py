"""Requests gRPC refused as too large, counted and logged like every other refusal.

gRPC refuses a request message over grpc.max_receive_message_length (server.py's
MAX_REQUEST_BYTES) itself, from its length prefix, so memory stays bounded (a 200 MB
request costs the frontend ~5 MB), and then runs no unary handler: such a call was
neither counted nor logged. ``RequestSizeInterceptor`` serves every method that takes
one request as one that takes a stream of them (which is what a unary call is on the
wire), so its handler runs either way: a call whose request never arrived (gRPC refused
it, or the client sent none) is counted in svcproxy_frontend_invalid_requests_total by
method, logged once a minute per client address and refused.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from svcproxy.frontend.admission.refusals import INVALID
from svcproxy.frontend.serving.limits import PeerLog, peer_address

_NONE = object()


class RequestSizeInterceptor(grpc.aio.ServerInterceptor):
    """Outermost: every unary-request method's handler made a streaming-request one."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.log = PeerLog()

    async def intercept_service(self, continuation: Any,
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        method = details.method.rpartition("/")[2]
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(method, handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(
            self._unary(method, handler.unary_unary), handler.request_deserializer,
            handler.response_serializer)

    async def _request(self, method: str, requests: AsyncIterator[Any],
                       context: grpc.aio.ServicerContext) -> Any:
        """The call's one request; refused when it did not arrive."""
        request = await anext(requests, _NONE)
        if request is not _NONE:
            return request
        INVALID.labels(method).inc()
        peer = peer_address(context.peer())
        self.log.warn(peer, "%s: a request from %s did not arrive: larger than %d bytes "
                      "(gRPC refused it with RESOURCE_EXHAUSTED) or none sent", method, peer,
                      self.max_bytes)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
            f"no request message arrived: send exactly one, of at most {self.max_bytes} "
            "bytes"))

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await behavior(await self._request(method, requests, context), context)
        return call

    def _streaming(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):
            async def generate(requests: AsyncIterator[Any],
                               context: grpc.aio.ServicerContext) -> Any:
                request = await self._request(method, requests, context)
                async for response in behavior(request, context):
                    yield response
            return generate

        async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await behavior(await self._request(method, requests, context), context)
        return call

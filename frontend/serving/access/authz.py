"""Who may read what, and the gRPC interceptor that enforces it on every call.

A node identity (a node certificate, or the pod-bound token of one of the agents'
ServiceAccounts) may Watch and GetNodeState its own node, and Report for it; any other
pod's token may only WaitFleet for its own pod's addresses (pod_waits.py); ListNodes,
WatchCluster, the fleet and every other node are for the identities (user names or groups) named in
``--cluster-readers`` and, where anonymous callers are accepted at all (a unix socket
or loopback without authentication configured), for them. Health stays open;
reflection needs an authenticated caller. Refusals are PERMISSION_DENIED (or
UNAUTHENTICATED) with a message naming the identity and what it may read; each is
logged and counted.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from svcproxy.frontend.admission.validation import Malformed, parse
from svcproxy.frontend.serving.access import auth_metrics
from svcproxy.frontend.serving.access.auth import Authenticator, Identity, Unauthenticated
from svcproxy.frontend.serving.access.pod_waits import wait_refusal
from svcproxy.v1 import nodestate_pb2 as pb

log = logging.getLogger(__name__)
API = "svcproxy.v1.NodeStateService"
OPEN = ("grpc.health.v1.Health",)
NODE_METHODS: dict[str, type[Message]] = {"Watch": pb.WatchRequest,
                                          "GetNodeState": pb.GetNodeStateRequest,
                                          "Report": pb.NodeReport}


def is_cluster_reader(identity: Identity, readers: frozenset[str]) -> bool:
    # By how it was authenticated, never by name: a certificate may say CN=system:anonymous.
    return (identity.via == "anonymous" or identity.name in readers
            or bool(identity.groups & readers))


def may_read(identity: Identity) -> str:
    """What ``identity`` may read, as a refusal message says it."""
    if identity.node:
        return (f"it may read only node {identity.node}'s state (Watch, GetNodeState) and "
                "report only for it (Report)")
    if identity.pod:
        return (f"it is the token of pod {identity.pod}, whose ServiceAccount is not one of "
                "the node agents' (--node-service-accounts), so it may only WaitFleet for "
                "its own pod's addresses")
    return "it may read nothing: it is not a node identity nor named in --cluster-readers"


def authorize(identity: Identity, method: str, node_name: str | None,
              readers: frozenset[str]) -> str | None:
    """None if ``identity`` may call ``method`` (for ``node_name``), else why not."""
    if is_cluster_reader(identity, readers):
        return None
    if method in NODE_METHODS and identity.node and node_name == identity.node:
        return None
    target = f"node {node_name!r}" if method in NODE_METHODS else "every node"
    return (f"{identity.describe()} may not call {method} for {target}: {may_read(identity)}; "
            "the whole cluster is for identities named in --cluster-readers")


Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates and authorises every call but health checks."""

    def __init__(self, authenticator: Authenticator, readers: frozenset[str]) -> None:
        self.authenticator = authenticator
        self.readers = readers

    async def intercept_service(self, continuation: Any,
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        service, _, method = details.method.lstrip("/").partition("/")
        if handler is None or service in OPEN:
            return handler

        async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
            await self._check(service, method, request, context)

        return _wrap(handler, check)

    async def _check(self, service: str, method: str, request: Any,
                     context: grpc.aio.ServicerContext) -> None:
        try:
            identity = await self.authenticator.authenticate(
                context.auth_context(), context.invocation_metadata() or ())
        except Unauthenticated as err:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, method,
                               str(err))
        if service != API:
            return
        if method in NODE_METHODS and isinstance(request, bytes):  # a worker's raw unary
            request = parse(NODE_METHODS[method], request)
        if isinstance(request, Malformed):  # the handler refuses it, reading nothing
            return
        if method == "WaitFleet" and not is_cluster_reader(identity, self.readers):
            addresses = getattr(self.authenticator.tokens, "pod_addresses", None)
            refusal = await wait_refusal(identity, request, addresses)
            if refusal is not None:
                await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, method,
                                   refusal)
            return
        node = _node_name(method, request)
        refusal = authorize(identity, method, node, self.readers)
        if refusal is not None:
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, method, refusal)

    @staticmethod
    async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, method: str,
                      message: str) -> None:
        auth_metrics.REFUSALS.labels(code.name, method).inc()
        log.warning("refused %s from %s: %s", method, context.peer(), message)
        await context.abort(code, message)


def _node_name(method: str, request: Any) -> str | None:
    if method not in NODE_METHODS:
        return None
    return str(request.node_name)


def _wrap(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """``handler`` with ``check`` first (before the first request for client streams)."""
    if handler.request_streaming:
        behavior = handler.stream_stream or handler.stream_unary
    else:
        behavior = handler.unary_stream or handler.unary_unary
    if inspect.isasyncgenfunction(behavior):
        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(None if handler.request_streaming else request, context)
            async for response in behavior(request, context):
                yield response
        wrapped: Any = streamed
    else:
        async def called(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(None if handler.request_streaming else request, context)
            return await behavior(request, context)
        wrapped = called
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}
    return make[handler.request_streaming, handler.response_streaming](
        wrapped, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)

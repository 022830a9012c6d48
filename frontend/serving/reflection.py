"""Server reflection that carries the proto's comments, so ``grpcurl describe`` shows
what each op and field means (the generated code keeps no comments).

The build writes ``svcproxy/v1/documented.binpb`` (protoc ``--include_source_info``): a
FileDescriptorSet of the same files with their comments. Each of our files that
reflection sends gets that file's comments (its ``source_code_info``) added; the
definitions stay the ones the server runs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

log = logging.getLogger(__name__)
DOCUMENTED = "documented.binpb"
Comments = dict[str, descriptor_pb2.SourceCodeInfo]


def comments() -> Comments:
    """Our files' comments by file name ({} when the build did not write them)."""
    try:
        data = resources.files("svcproxy.v1").joinpath(DOCUMENTED).read_bytes()
    except OSError:
        log.warning("svcproxy/v1/%s is missing: grpcurl describe shows no comments "
                    "(rebuild the package)", DOCUMENTED)
        return {}
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    return {f.name: f.source_code_info for f in files}


class DocumentedReflection(reflection_aio.ReflectionServicer):
    """grpc_reflection's servicer, with our files' comments in what it sends."""

    def __init__(self, service_names: Iterable[str], documented: Comments) -> None:
        super().__init__(service_names)
        self.documented = documented

    async def ServerReflectionInfo(  # noqa: N802 - gRPC method name
            self, request_iterator: Any, context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        async for response in super().ServerReflectionInfo(request_iterator, context):
            if response.HasField("file_descriptor_response"):
                protos = response.file_descriptor_response.file_descriptor_proto
                for i, data in enumerate(protos):
                    proto = descriptor_pb2.FileDescriptorProto.FromString(data)
                    if proto.name in self.documented:
                        proto.source_code_info.CopyFrom(self.documented[proto.name])
                        protos[i] = proto.SerializeToString()
            yield response


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        DocumentedReflection(service_names, comments()), server)

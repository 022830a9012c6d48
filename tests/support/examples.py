"""The example cluster's manifests, copied for a test, and reading a Watch stream."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc

from svcproxy.model import Protocol, ServicePortKey
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.objects import endpoint, slice_
from tests.support.paths import REPO

EXAMPLES = REPO / "examples" / "cluster"


WEB = ServicePortKey("shop", "web", "http", Protocol.TCP)


def web_slice(n: int, port: int = 8080) -> dict:
    eps = [endpoint(f"10.244.{i // 250}.{i % 250 + 1}", node="node-a") for i in range(n)]
    return slice_("web-abc12", "web", eps, ns="shop", port=port)


def stub(fe) -> pb_grpc.NodeStateServiceStub:  # type: ignore[no-untyped-def]
    return pb_grpc.NodeStateServiceStub(grpc.insecure_channel(fe.opts.listen))


def copy_examples(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    shutil.copytree(EXAMPLES, d)
    return d


def read_batch(stream) -> list[pb.WatchEvent]:  # type: ignore[no-untyped-def]
    out = []
    for ev in stream:
        out.append(ev)
        if not ev.more:
            return out
    raise AssertionError("stream ended")

"""A node's state as a frontend serves it (GetNodeState, every page), in a form two
frontends' answers compare in: the revision (a per-frontend counter) and each service
port's trigger time (when that frontend saw the change) are left out."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

State = dict[str, Any]


def node_state(target: str, node: str, timeout: float = 5.0) -> State:
    """``{"node": ..., "services": {key: record}}`` of ``node`` from the frontend at
    ``target`` (``unix:///path``)."""
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        token, services, info = "", {}, None
        while True:
            page = stub.GetNodeState(
                pb.GetNodeStateRequest(node_name=node, page_token=token), timeout=timeout)
            info = MessageToDict(page.node)
            for record in page.services:
                record.service.ClearField("trigger_time")
                k = record.service.key
                services[f"{k.namespace}/{k.name}:{k.port_name}/{k.protocol}"] = (
                    MessageToDict(record))
            token = page.next_page_token
            if not token:
                return {"node": info, "services": services}


def differences(left: State, right: State) -> list[str]:
    """One line per difference (node info, a service port only on one side or unequal)."""
    lines = []
    if left["node"] != right["node"]:
        lines.append(f"node: {left['node']} != {right['node']}")
    a, b = left["services"], right["services"]
    lines += [f"only in the first: {k}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only in the second: {k}" for k in sorted(b.keys() - a.keys())]
    lines += [f"{k}: {a[k]} != {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return lines

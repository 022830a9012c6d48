"""The dump backend: prints the node's state, then each change, as JSON lines.

The reference example for backend authors: a whole backend is this one class.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import IO, Any

from google.protobuf.json_format import MessageToDict

from svcproxy.sdk import Backend, Changes, NodeState, ServicePortState, node_to_pb, state_to_pb


def record_json(record: ServicePortState) -> dict[str, Any]:
    """A record as the API's JSON (the same shape grpcurl prints)."""
    return MessageToDict(state_to_pb(record))


class DumpBackend(Backend):
    name = "dump"
    # Not a dataplane: the agent opens no health-check ports and clears no conntrack.
    dataplane = False

    def __init__(self, out: IO[str] = sys.stdout) -> None:
        self.out = out

    def sync(self, state: NodeState, changes: Changes) -> None:
        line: dict[str, Any] = {"revision": state.revision}
        if changes.full:
            line["type"] = "snapshot"
            line["node"] = MessageToDict(node_to_pb(state.node)) if state.node else None
            if state.context is not None:  # the node context the agent resolved
                line["context"] = asdict(state.context)
            line["services"] = [record_json(state.services[k]) for k in sorted(state.services)]
        else:
            line["type"] = "change"
            if changes.node_changed:
                line["node"] = MessageToDict(node_to_pb(state.node)) if state.node else None
                if state.context is not None:
                    line["context"] = asdict(state.context)
            line["set"] = [record_json(state.services[k])
                           for k in sorted(changes.services) if k in state.services]
            line["deleted"] = [str(k) for k in sorted(changes.services)
                               if k not in state.services]
        self.out.write(json.dumps(line, sort_keys=True) + "\n")
        self.out.flush()

"""A node name the frontend serves no Node for: said in the log, on /metrics and /healthz.

A valid node name that no Node object has (a typo in ``--node-name``, or a Node not
registered yet) is served as a node without endpoints of its own: the stream is fine,
so nothing else would say it. The state then carries no ``node``.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge

from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import NodeState

log = logging.getLogger(__name__)

DETAIL = "unknownNode"


class UnknownNode:
    """Watches each synced state for its node; ``after_sync`` is a post-sync step."""

    def __init__(self, node_name: str, registry: CollectorRegistry) -> None:
        self.node_name = node_name
        self.unknown = False
        self.gauge = Gauge("svcproxy_node_unknown",
                           "1 while the frontend serves no Node of this node's name (check "
                           "--node-name / --hostname-override), else 0", registry=registry)

    def after_sync(self, _old: NodeState | None, new: NodeState,
                   _changed: frozenset[ServicePortKey]) -> None:
        unknown = new.node is None
        if unknown == self.unknown:
            return
        self.unknown = unknown
        self.gauge.set(int(unknown))
        if unknown:
            log.warning("%s (served as a node without endpoints of its own)", self.message())
        else:
            log.info("the frontend now knows Node %s", self.node_name)

    def message(self) -> str:
        return (f"the frontend knows no Node {self.node_name!r}: check --node-name (or "
                "--hostname-override, $NODE_NAME) against kubectl get nodes; a Node not "
                "registered yet is served as soon as it is")

    def details(self) -> dict[str, object]:
        """The /healthz key while the node is unknown."""
        if not self.unknown:
            return {}
        return {DETAIL: {"nodeName": self.node_name, "message": self.message()}}

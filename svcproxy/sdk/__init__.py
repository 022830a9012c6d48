"""The SDK for backend authors: connect, keep the node's state, learn what changed.

A backend is one class::

    from svcproxy.sdk import Backend, Changes, NodeState

    class MyBackend(Backend):
        def sync(self, state: NodeState, changes: Changes) -> None:
            for key in changes.services:
                record = state.services.get(key)   # None: deleted
                ...
"""

from svcproxy.agent.addresses import node_port_ips
from svcproxy.agent.config import NodeConfig
from svcproxy.model import Endpoint, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Backend, Changes, NodeState

__all__ = ["Backend", "Changes", "Endpoint", "NodeConfig", "NodeState", "ServicePortKey",
           "ServicePortState", "node_port_ips"]

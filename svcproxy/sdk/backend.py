"""The interface a backend implements: one class, one or two methods."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.sdk.context import NodeContext


@dataclass(frozen=True, slots=True)
class NodeState:
    """A consistent, immutable copy of one node's state at one revision.

    ``context`` is the node context the node agent resolved once for every backend
    (node IPs, NodePort addresses, local-traffic detection); None when the state does
    not come through an agent (a backend then resolves it with ``resolve_context``).
    """

    node_name: str
    revision: int
    node: NodeInfo | None
    services: Mapping[ServicePortKey, ServicePortState] = field(default_factory=dict)
    context: NodeContext | None = None


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the previous sync handed to the backend.

    ``full`` asks the backend to rewrite everything it owns from ``state``
    (first sync, after a reset of the stream, after a failed apply, periodic
    resync); ``services`` then lists every service port. ``reason`` says why:
    "initial", "changes", "periodic" or "retry".
    """

    services: frozenset[ServicePortKey] = frozenset()
    node_changed: bool = False
    full: bool = False
    reason: str = "changes"
    # Unix times of the endpoint changes this sync carries (for
    # kubeproxy_network_programming_duration_seconds).
    trigger_times: tuple[float, ...] = ()


class Backend(ABC):
    """A dataplane backend. The node agent calls ``sync`` from one thread."""

    name: str = "backend"

    @abstractmethod
    def sync(self, state: NodeState, changes: Changes) -> None:
        """Make the dataplane match ``state``. Raise to report failure: the agent
        retries with a full sync; the previous programming must stay intact."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Remove everything this backend ever programmed (``--cleanup``)."""

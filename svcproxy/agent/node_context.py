"""The node agent's one resolution of the node context, handed to every backend."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Literal

from svcproxy.agent.config import NodeConfig
from svcproxy.model import NodeInfo
from svcproxy.sdk.context import NodeContext, interface_addresses, resolve_context

log = logging.getLogger(__name__)

# IPVS's dummy interface holds service IPs, not node addresses.
NOT_NODE_INTERFACES = ("kube-ipvs0",)


class ContextResolver:
    """``resolve_context`` from the flags, the Node object and the interfaces' addresses;
    resolved again when the Node changes or, for moved addresses, at most every
    ``refresh`` seconds. Called by the sync runner before each sync."""

    def __init__(self, config: NodeConfig, node_port_default: Literal["all", "primary"] = "all",
                 *, addresses: Callable[[Sequence[str]], Sequence[str]] = interface_addresses,
                 refresh: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.node_port_default = node_port_default
        self._addresses = addresses
        self._refresh = refresh
        self._clock = clock
        self._last: tuple[NodeInfo | None, float, NodeContext] | None = None

    def __call__(self, node: NodeInfo | None) -> NodeContext:
        now = self._clock()
        if self._last is not None:
            last_node, at, found = self._last
            if last_node == node and now - at < self._refresh:
                return found
        found = resolve_context(self.config, node, self._local_addresses(),
                                node_port_default=self.node_port_default)
        self._last = (node, now, found)
        return found

    def _local_addresses(self) -> Sequence[str]:
        try:
            return self._addresses(NOT_NODE_INTERFACES)
        except OSError as err:
            log.warning("cannot read the node's interface addresses (%s): NodePort CIDRs "
                        "select among the node IPs only", err)
            return ()

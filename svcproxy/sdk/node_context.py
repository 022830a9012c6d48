"""The node agent's one resolution of the node context, handed to every backend."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from svcproxy.model import NodeInfo
from svcproxy.sdk.backend import Backend
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.context import (
    IPTABLES_MODES,
    NodeContext,
    ProxyMode,
    interface_addresses,
    resolve_context,
)
from svcproxy.sdk.iptables_mode import detect_iptables
from svcproxy.sdk.sysctls import ip_families, set_sysctls

log = logging.getLogger(__name__)

# IPVS's dummy interface holds service IPs, not node addresses.
NOT_NODE_INTERFACES = ("kube-ipvs0",)


class ContextResolver:
    """``resolve_context`` from the flags, the Node object, the interfaces' addresses and
    the backend's ``ProxyMode``; resolved again when the Node changes or, for moved
    addresses, at most every ``refresh`` seconds. Called by the sync runner before each
    sync, which sets the mode's sysctls (``set_sysctls``) whenever the context asks for
    values not set yet. The IP families and the iptables in use are found once."""

    def __init__(self, config: NodeConfig, node_port_default: Literal["all", "primary"] = "all",
                 *, mode: ProxyMode | None = None,
                 addresses: Callable[[Sequence[str]], Sequence[str]] = interface_addresses,
                 families: Callable[[], tuple[int, ...]] = ip_families,
                 iptables: Callable[[], str] = detect_iptables,
                 sysctls: Callable[[Mapping[str, str]], list[str]] = set_sysctls,
                 refresh: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.node_port_default = node_port_default
        self.mode = mode
        self._addresses = addresses
        self._families = families
        self._iptables = iptables
        self._set_sysctls = sysctls
        self._refresh = refresh
        self._clock = clock
        self._node_facts: tuple[tuple[int, ...], str] | None = None
        self._set: tuple[tuple[str, str], ...] = ()
        self._last: tuple[NodeInfo | None, float, NodeContext] | None = None

    @classmethod
    def for_backend(cls, config: NodeConfig, backend: Backend) -> ContextResolver:
        """The resolver for what ``backend`` declares: ``node_port_default`` and
        ``proxy_mode`` (the agent's one place reading them)."""
        return cls(config, getattr(backend, "node_port_default", "all"),
                   mode=getattr(backend, "proxy_mode", None))

    def __call__(self, node: NodeInfo | None) -> NodeContext:
        """The context for a sync (the runner's call): its sysctls are set first."""
        found = self.resolve(node)
        if found.sysctls != self._set:
            self._set_sysctls(dict(found.sysctls))
            self._set = found.sysctls
        return found

    def resolve(self, node: NodeInfo | None) -> NodeContext:
        """The context, nothing set (the health-check node ports' addresses at start)."""
        now = self._clock()
        if self._last is not None:
            last_node, at, found = self._last
            if last_node == node and now - at < self._refresh:
                return found
        families, iptables = self._facts()
        found = resolve_context(self.config, node, self._local_addresses(),
                                node_port_default=self.node_port_default, mode=self.mode,
                                ip_families=families, iptables=iptables)
        self._last = (node, now, found)
        return found

    def _facts(self) -> tuple[tuple[int, ...], str]:
        """The node's IP families and iptables (looked for only when the mode uses
        iptables and leaves the choice to the node), found once."""
        if self._node_facts is None:
            mode = self.mode
            auto = (mode is not None and mode.uses_iptables
                    and mode.iptables not in IPTABLES_MODES)
            self._node_facts = (self._families(), self._iptables() if auto else "")
        return self._node_facts

    def _local_addresses(self) -> Sequence[str]:
        try:
            return self._addresses(NOT_NODE_INTERFACES)
        except OSError as err:
            log.warning("cannot read the node's interface addresses (%s): NodePort CIDRs "
                        "select among the node IPs only", err)
            return ()
